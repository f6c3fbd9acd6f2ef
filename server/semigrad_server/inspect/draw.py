"""A registered graph as a picture (DOT text), labelled with values and gradients the server
computes at given inputs and/or values and gradients the caller gives."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..deadline import interruptibly
from ..errors import InvalidArgument, quoted
from .describe import requiring_grad
from .dot import PathSteps, graph_dot


def draw(engine, graph_id: str, inputs: Mapping[str, np.ndarray] | None = None, *, semiring: str = "real",
         semiring_params: Mapping[str, object] | None = None, wrt: Sequence[str] = (),
         values: Mapping[str, np.ndarray] | None = None, gradients: Mapping[str, np.ndarray] | None = None,
         highlight: PathSteps = (), deadline: float | None = None) -> str:
    """DOT text for the graph. With `inputs`, every node is evaluated there and, when the graph
    has float inputs and outputs, every node that requires a gradient gets its gradient (under
    `semiring`, of the float outputs' sum, w.r.t. `wrt`; default every float input). `values`
    and `gradients` (by node or input id) are shown as given, over the computed ones."""
    cg = engine.get(graph_id)
    highlight = [(ref, tuple(int(i) for i in index)) for ref, index in highlight]
    for what, given in (("values", values or {}), ("gradients", gradients or {}), ("highlight", dict(highlight))):
        for ref in given:
            if ref not in cg.types:
                raise InvalidArgument(f"{what} name unknown node or input {quoted(ref)}")
    shown_values, shown_gradients = {}, {}
    if inputs:
        shown_values = {**inputs, **engine.evaluate(graph_id, inputs, nodes=[n.id for n in cg.order],
                                                    deadline=deadline)[1]}
        shown_gradients = _gradients(engine, cg, inputs, semiring, semiring_params, wrt, deadline)
    shown_values.update(values or {})
    shown_gradients.update(gradients or {})
    title = f"graph {cg.id}" + (f", {semiring} semiring" if shown_gradients and semiring not in ("", "real") else "")
    return interruptibly("drawing the graph", graph_dot, cg.graph, cg.types, shown_values, shown_gradients, highlight,
                         title)


def _gradients(engine, cg, inputs, semiring, semiring_params, wrt, deadline) -> dict[str, np.ndarray]:
    outputs = [name for name, ref in cg.graph.outputs if cg.types[ref].is_float]
    if not outputs or not (wrt or any(spec.type.is_float for spec in cg.graph.inputs)):
        return {}
    wrt = cg.wrt_inputs(wrt)
    needing = requiring_grad(cg.order, cg.types, wrt)
    retain = [n.id for n in cg.order if n.id in needing]
    result = engine.gradient(cg.id, inputs, wrt=wrt, outputs=outputs, semiring=semiring or "real",
                             semiring_params=semiring_params, retain=retain, deadline=deadline)
    return {**result.gradients, **result.retained}
