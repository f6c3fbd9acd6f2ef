"""Request fields from Python values, and Python values from responses: what the RPC surface
(client.py), streaming and the hook stream share. `graph` arguments are RegisteredGraphs."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from . import codec
from .errors import InvalidArgument
from .paths import BestPaths
from .specs import BestPath, PathStep, TensorSpec
from .v1 import semigrad_pb2 as pb

if TYPE_CHECKING:
    from .client import RegisteredGraph


class Gradients(dict):
    """``{input name: gradient}``, plus what else a gradient call returned: ``outputs``
    (forward values, when asked), ``components`` (``{input: {component: array}}`` for tuple
    semirings, when asked) and ``best_paths`` (:class:`BestPaths`: a sequence of
    :class:`BestPath` kept as columns, when asked)."""

    outputs: dict[str, np.ndarray]
    components: dict[str, dict[str, np.ndarray]]
    best_paths: BestPaths | list
    retained: dict[str, np.ndarray]
    records: dict[str, dict[str, np.ndarray]]


class SemiringGradients(dict):
    """What a gradient call with several semirings returns: ``{semiring name: Gradients}``
    (each with its own ``components``, ``retained`` and ``records``), plus ``outputs`` (the
    forward values, when asked: one forward pass serves every semiring)."""

    outputs: dict[str, np.ndarray]

    def ordered(self, names) -> SemiringGradients:
        """The same, its semirings in the order of `names` (the request's)."""
        ordered = SemiringGradients({**{name: self[name] for name in names if name in self}, **self})
        ordered.outputs = self.outputs
        return ordered


def semiring_fields(semiring, semiring_params) -> dict:
    """The request's semiring fields: one name in `semiring`; a list of names in `semirings`,
    their parameters flattened to "<semiring>.<parameter>" (``{"kbest": {"k": 5}}`` or
    ``{"kbest.k": 5}``)."""
    if isinstance(semiring, str):
        return {"semiring": semiring if semiring != "real" else "", "semiring_params": attr_values(semiring_params)}
    flat = {}
    for key, value in (semiring_params or {}).items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{param}": v for param, v in value.items()})
        else:
            flat[key] = value
    return {"semirings": list(semiring), "semiring_params": attr_values(flat)}


def gradient_request(graph: RegisteredGraph, inputs, wrt=None, seeds=None, outputs=None, return_outputs=False,
                     semiring="real", semiring_params=None, return_components=False, best_path=None,
                     backend="auto", retain=None, hooks=(), top_paths=0) -> tuple[pb.GradientRequest, dict]:
    """The request without its tensors, and the tensors by request field (see transport.fill)."""
    fields = {"wrt": names(wrt), "outputs": names(outputs), "return_outputs": return_outputs,
              "backend": backend if backend != "auto" else ""}
    if not (isinstance(semiring, str) and semiring == "real" and not semiring_params and not return_components
            and best_path is None and type(top_paths) is int and top_paths == 0 and retain is None and not hooks):
        # (Skipped for the usual request, the options at their defaults: these fields would all be empty.)
        fields.update(**semiring_fields(semiring, semiring_params), return_components=return_components,
                      **best_path_fields(best_path), top_paths=count(top_paths, "top_paths"), retain=names(retain),
                      hooks=list(hooks))
    # Only what differs from the defaults: a small request's time is mostly such steps.
    request = pb.GradientRequest(graph_id=graph.id, **{k: v for k, v in fields.items() if v})
    tensors = {"inputs": arrays(inputs, graph.input_specs)}
    if seeds:
        tensors["seeds"] = arrays(seeds, graph.output_specs, "seed for output")
    return request, tensors


def best_path_fields(best_path) -> dict:
    """best_path=: "all", or (input name, full index) pairs."""
    if isinstance(best_path, str):
        if best_path != "all":
            raise InvalidArgument(f'best_path must be "all" or a list of (input, index) pairs, not {best_path!r}')
        return {"best_path_all": True}
    return {"best_paths": [pb.ElementRef(input=name, index=element_index(index, f"best_path start on input '{name}'"))
                           for name, index in best_path or ()]}


INDEX_RANGE = (-(2**63), 2**63)


def element_index(index, what: str) -> list[int]:
    """A full element index as ints, each an integer (Python or NumPy; 1.5 or '1' would name
    another element) within int64, else InvalidArgument naming `what`."""
    try:
        values = [operator.index(i) for i in index]
    except TypeError:
        raise InvalidArgument(f"{what}: an element index is a sequence of integers, got {index!r}") from None
    if any(not INDEX_RANGE[0] <= v < INDEX_RANGE[1] for v in values):
        raise InvalidArgument(f"{what}: index {values} is out of range")
    return values


def count(value, what: str) -> int:
    """A whole number given for `what` (top_paths=2.5 is refused, not cut to 2), as the message's
    int32 field holds it; top_paths=True is refused too, not read as 1)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} is a whole number, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{what} is a whole number, got {value!r}") from None
    if not -2**31 <= number < 2**31:
        raise InvalidArgument(f"{what} = {number} is out of range")
    return number


def gradients_from(response: pb.GradientResponse, read: Callable = codec.from_tensor) -> Gradients | SemiringGradients:
    fields = response.ListFields()
    if len(fields) == 1 and fields[0][0] is _GRADIENTS:  # gradients alone (most responses): nothing else to read
        gradients = Gradients(decode(fields[0][1], read))
        gradients.outputs, gradients.components, gradients.best_paths, gradients.retained, gradients.records = (
            {}, {}, [], {}, {})
        return gradients
    if response.semirings:
        by_name = SemiringGradients({name: gradients_from(part, read) for name, part in response.semirings.items()})
        by_name.outputs = decode(response.outputs, read) if response.outputs else {}
        return by_name
    gradients = Gradients(decode(response.gradients, read))
    gradients.outputs = decode(response.outputs, read) if response.outputs else {}
    gradients.components = ({x: decode(parts.tensors, read) for x, parts in response.components.items()}
                            if response.components else {})
    gradients.best_paths = paths_from(response.paths, read) if response.HasField("paths") else []
    gradients.retained = decode(response.retained, read) if response.retained else {}
    gradients.records = ({key: decode(parts.tensors, read) for key, parts in response.records.items()}
                         if response.records else {})
    return gradients


def paths_from(table: pb.PathTable, read: Callable = codec.from_tensor) -> BestPaths:
    return BestPaths(list(table.nodes), [tuple(s.values) for s in table.shapes], list(table.outputs),
                     tuple(table.batch_shape), decode(table.columns, read), decode(table.values, read))


_GRADIENTS = pb.GradientResponse.DESCRIPTOR.fields_by_name["gradients"]


def result_bytes(graph: RegisteredGraph, values: Mapping[str, np.ndarray], specs: Iterable[TensorSpec | None]) -> int:
    """What the response's tensors of these specs (per item) should take with the inputs' batch
    shape, alignment included: the size of the output region offered. An estimate (0 when the
    batch shapes do not broadcast; the server sends what does not fit inline)."""
    leads = [a.shape[:a.ndim - len(graph.input_specs[name].shape)] for name, a in values.items()
             if name in graph.input_specs]
    if any(leads):
        try:
            items = math.prod(np.broadcast_shapes(*leads))
        except (ValueError, RuntimeError):  # RuntimeError: past NumPy's 32 dimensions (the server says so)
            return 0
    else:
        items = 1  # a single point
    return sum(64 + items * math.prod(spec.shape) * 8 for spec in specs if spec is not None)


def gradient_result_bytes(graph: RegisteredGraph, request: pb.GradientRequest, values: Mapping[str, np.ndarray]) -> int:
    wrt = list(request.wrt) or [name for name, spec in graph.input_specs.items()
                                if spec.dtype in ("float64", "float32")]
    specs = [graph.input_specs.get(name) for name in wrt]
    if request.return_outputs:
        specs += [graph.output_specs.get(name) for name in (request.outputs or graph.output_specs)]
    specs += [graph.types.get(node) for node in request.retain]
    return result_bytes(graph, values, specs) * max(1, len(request.semirings))


def path_elements(path) -> list[pb.NodeElement]:
    """A BestPath, or (node, index) pairs or PathSteps, as NodeElements."""
    steps = path.steps if isinstance(path, BestPath) else path or ()
    pairs = [(step.node, step.index) if isinstance(step, PathStep) else step for step in steps]
    return [pb.NodeElement(node=node, index=element_index(index, f"highlight_path step at node '{node}'"))
            for node, index in pairs]


def names(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def attr_values(params: Mapping[str, object] | None) -> dict[str, pb.AttrValue]:
    encoded = {}
    for k, v in (params or {}).items():
        try:
            encoded[k] = codec.attr_value(v)
        except (TypeError, ValueError) as e:  # None, 2**70 (protobuf: "Value out of range")
            raise InvalidArgument(f"semiring parameter '{k}': {e}") from None
    return encoded


def encode(values: Mapping[str, object], specs: Mapping[str, TensorSpec],
           what: str = "input") -> dict[str, pb.Tensor]:
    """Encode ``values`` by name in their spec's dtype (unknown names: for the server to reject)."""
    encoded = {}
    for name, array in arrays(values, specs, what).items():
        try:
            encoded[name] = codec.to_tensor(array)
        except (TypeError, ValueError) as e:  # no spec to cast to (to_dot's gradients): strings, complex...
            raise InvalidArgument(f"{what} '{name}': {e}") from None
    return encoded


def arrays(values: Mapping[str, object], specs: Mapping[str, TensorSpec],
           what: str = "input") -> dict[str, np.ndarray]:
    """``values`` as arrays in their spec's dtype (unknown names: for the server to reject). A cast
    that would change a value (2.7 into int64, strings...) raises InvalidArgument naming the
    ``what`` by name, both dtypes and the first element at fault (see :func:`codec.cast`)."""
    converted = {}
    for name, value in values.items():
        if name not in specs:
            converted[name] = np.asarray(value)
            continue
        dtype = _dtype(specs[name].dtype)
        if type(value) is np.ndarray and value.dtype == dtype:
            converted[name] = value
            continue
        try:
            converted[name] = codec.cast(value, dtype, f"{what} '{name}'")
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
    return converted


@functools.lru_cache(maxsize=16)
def _dtype(name: str) -> np.dtype:
    return np.dtype(name)


def decode(tensors: Mapping[str, pb.Tensor], read: Callable = codec.from_tensor) -> dict[str, np.ndarray]:
    return {name: read(tensors[name]) for name in tensors}  # (a protobuf map's items() is twice as slow)
