"""What is computed, not how it was written (issue 12, item 3), on generated graphs: a graph in
which some value is computed a second time (the node and every node it depends on copied under
new ids, and some of its uses moved to the copy, as a recursive determinant recomputes its
sub-minors) compiles to the same gradient program as the graph that computes it once, and gives
the same gradients. Before the forward graph was hash-consed ahead of reverse mode, each copy
got a backward chain of its own.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import numpy as np
import pytest
import semigrad as sg
from fuzz_graphs import FuzzCase, Vocabulary, cases
from hypothesis import assume, given, note, settings, strategies as st

from semigrad_server.engine import Engine
from semigrad_server.service.convert import graph_from_proto

FUZZ = bool(os.environ.get("SEMIGRAD_FUZZ"))


@pytest.fixture(scope="module")
def vocabulary():
    with sg.Client() as client:
        return Vocabulary(client.list_ops())


@st.composite
def recomputed(draw, case: FuzzCase) -> FuzzCase:
    """`case` with one value computed twice: a node with its whole cone of nodes copied (inputs
    stay shared), the copies placed right after the node, and a nonempty subset of its uses
    (operands of later nodes, outputs) moved to the copy."""
    used = {r for n in case.nodes for r in n.inputs} | set(case.outputs.values())
    candidates = [n.id for n in case.nodes if n.id in used]
    assume(candidates)
    target = draw(st.sampled_from(candidates))
    cone, wanted = [], {target}
    for n in reversed(case.nodes):
        if n.id in wanted:
            cone.append(n)
            wanted.update(n.inputs)
    copy_of = {n.id: f"{n.id}_again" for n in cone}
    copies = [dataclasses.replace(n, id=copy_of[n.id], inputs=tuple(copy_of.get(r, r) for r in n.inputs))
              for n in reversed(cone)]
    uses = [(k, i) for k, n in enumerate(case.nodes) for i, r in enumerate(n.inputs) if r == target] + \
           [(name, None) for name, ref in case.outputs.items() if ref == target]
    moved = set(draw(st.lists(st.sampled_from(range(len(uses))), min_size=1, unique=True)))
    nodes = [dataclasses.replace(n) for n in case.nodes]
    outputs = dict(case.outputs)
    for j in moved:
        where, i = uses[j]
        if i is None:
            outputs[where] = copy_of[target]
        else:
            nodes[where] = dataclasses.replace(
                nodes[where], inputs=tuple(copy_of[target] if p == i else r for p, r in enumerate(nodes[where].inputs)))
    at = next(k for k, n in enumerate(nodes) if n.id == target) + 1
    return dataclasses.replace(case, nodes=nodes[:at] + copies + nodes[at:], outputs=outputs)


def compiled_gradient(case: FuzzCase, backend: str):
    engine = Engine()
    cg, _ = engine.register(graph_from_proto(case.client_graph().to_proto()))
    result = engine.gradient(cg.id, case.values, seeds=case.seeds or None, backend=backend)
    (compiled,) = [c for _, c in cg.plans.items()]
    return result.gradients, compiled.plan


def program(plan) -> Counter:
    """What a plan runs: its steps' kernels (tensor plans) or its instructions' operations."""
    if hasattr(plan, "steps"):
        return Counter(getattr(s.kernel, "__name__", type(s.kernel).__name__) for s in plan.steps)
    return Counter(op for _, op, _ in plan.program.instrs)


@settings(max_examples=1000 if FUZZ else 60)
@given(data=st.data())
def test_a_value_computed_twice_compiles_to_the_program_of_computing_it_once(vocabulary, data):
    case = data.draw(cases(vocabulary), label="case")
    twice = data.draw(recomputed(case), label="recomputed")
    assume(case.float_inputs())
    note(repr(twice))
    backend = "scalar" if case.item_elements() <= 400 and not case.has_ints() and data.draw(st.booleans()) else "tensor"
    once_gradients, once_plan = compiled_gradient(case, backend)
    twice_gradients, twice_plan = compiled_gradient(twice, backend)
    assert program(twice_plan) == program(once_plan), f"backend={backend}"
    for x, g in once_gradients.items():
        np.testing.assert_allclose(twice_gradients[x], g, rtol=1e-12, atol=1e-300, err_msg=f"d/d{x} backend={backend}")
