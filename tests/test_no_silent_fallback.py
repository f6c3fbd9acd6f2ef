"""An op without an adjoint rule is an error naming the op, the node and the semiring:
never a silent fallback to another rule."""

from __future__ import annotations

import numpy as np
import pytest
from semigrad_server.engine import Engine
from semigrad_server.errors import FailedPrecondition
from semigrad_server.ir import Graph, InputSpec, Node
from semigrad_server.ops import REGISTRY
from semigrad_server.ops.base import Registry


@pytest.mark.parametrize("semiring", ["real", "max_product"])
def test_an_op_without_an_adjoint_rule_is_named(semiring):
    registry = Registry(dict(REGISTRY.ops))
    ruleless = REGISTRY.ops["sin"]
    registry.ops["sin"] = type(ruleless)(**{**ruleless.__dict__, "vjp": None})
    engine = Engine()
    cg, _ = engine.register(Graph((InputSpec("x", (2,)),), (Node("wave", "sin", ("x",)),), (("y", "wave"),)))
    cg.registry = registry  # as if `sin` had been registered without a rule
    cg.plans.clear()
    with pytest.raises(FailedPrecondition, match=rf"op 'sin' \(node 'wave'\).*'{semiring}' semiring"):
        engine.gradient(cg.id, {"x": np.ones(2)}, semiring=semiring)
