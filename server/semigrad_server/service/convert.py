"""Wire messages ↔ IR and arrays. Tensor encoding is the client's codec (one place)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
from semigrad import codec, wire
from semigrad.paths import BestPaths
from semigrad.v1 import semigrad_pb2 as pb

from ..engine.specs import EvaluateSpec, GradientSpec, HookRequest
from ..errors import InvalidArgument, ResourceExhausted, quoted
from ..ir import MAX_RANK, Graph, InputSpec, Node, OpDefinition, Type
from ..ops.base import OpDef
from . import status
from .shared_memory import Session, Writer

# Request fields the servicer acts on itself rather than the engine: where the response's tensors
# go. Every other field of EvaluateRequest and GradientRequest goes into the request's spec
# (tests/test_request_specs.py checks both lists against the proto).
EVALUATE_TRANSPORT_FIELDS = frozenset({"output_region"})
GRADIENT_TRANSPORT_FIELDS = frozenset({"output_region"})
# A GradientRequest setting no other field than these is plain (GradientSpec.is_plain): the
# engine's short path (Engine.remembered_gradient) takes it without a spec.
PLAIN_GRADIENT_FIELDS = frozenset({"graph_id", "inputs", "wrt", "outputs", "return_outputs", "backend"}) \
    | GRADIENT_TRANSPORT_FIELDS


def tensor_to_array(tensor: pb.Tensor, what: str, shared: Session | None = None) -> np.ndarray:
    """The tensor's array: a read-only view of the message bytes, or of the shared-memory region it
    references when the request may use shared memory (`shared`: the request's session)."""
    if len(tensor.shape) > MAX_RANK:
        raise InvalidArgument(f"{what}: a tensor of rank {len(tensor.shape)}; values have at most {MAX_RANK} "
                              f"dimensions, batch dimensions included")
    if tensor.WhichOneof("payload") == "shared":
        array = status.received_array(tensor, what)  # bytes of this request, read by wire.Reader
        if array is not None:
            return array
        if shared is None:
            raise InvalidArgument(f"{what}: shared-memory tensors are only accepted in the inputs and seeds of "
                                  "Evaluate, Gradient, GradientStream and GradientWithHooks requests")
        return shared.array(tensor, what)
    try:
        return codec.from_tensor(tensor)
    except ValueError as e:
        raise InvalidArgument(f"{what}: {e}") from None


def tensors_to_arrays(tensors: Mapping[str, pb.Tensor], what: str,
                      shared: Session | None = None) -> dict[str, np.ndarray]:
    arrays = {}
    for name in tensors:  # (a protobuf map's items() is twice as slow)
        tensor = tensors[name]
        # An inline tensor that reads cleanly is read at once; any other (shared, empty, too many
        # dimensions, refused) by tensor_to_array, whose message names it (built only then)
        array = codec.inline_array(tensor)
        if array is None or array.ndim > MAX_RANK:
            array = tensor_to_array(tensor, f"{what} {quoted(name)}", shared)
        arrays[name] = array
    return arrays


def put_tensors(target, arrays: Mapping[str, np.ndarray], writer: Writer | None = None) -> None:
    """Encode arrays into the message map `target` (empty), each tensor written in place: into
    the request's shared-memory output region (`writer`) as far as they fit, the rest inline."""
    for name, a in arrays.items():
        placed = writer.place(a) if writer is not None else None
        if placed:
            target[name].CopyFrom(placed)
        else:
            codec.write_tensor(target[name], a)


def _attr(what: str, key: str, value: pb.AttrValue) -> object:
    """An attribute or parameter value; `what` names it in messages ("node 'n': attribute")."""
    kind = value.WhichOneof("value")
    if kind is None:
        raise InvalidArgument(f"{what} {quoted(key)} has no value")
    if kind == "ints":
        return tuple(value.ints.values)
    if kind == "tensor":
        return np.array(tensor_to_array(value.tensor, f"{what} {quoted(key)}"))
    if kind == "index":
        items = []
        for item in value.index.items:
            which = item.WhichOneof("item")
            if which == "index":
                items.append(item.index)
            elif which == "slice":
                s = item.slice
                items.append(slice(s.start if s.HasField("start") else None, s.stop if s.HasField("stop") else None,
                                   s.step if s.HasField("step") else None))
            else:
                raise InvalidArgument(f"{what} {quoted(key)} has an empty index item")
        return tuple(items)
    return getattr(value, kind)


def graph_from_proto(message: pb.Graph) -> Graph:
    inputs = []
    for i in message.inputs:
        try:
            dtype = codec.dtype_from_proto(i.dtype) if i.dtype != pb.DTYPE_UNSPECIFIED else "float64"
        except ValueError:
            raise InvalidArgument(f"input '{i.name}': unsupported dtype {i.dtype}") from None
        inputs.append(InputSpec(i.name, tuple(i.shape), dtype))
    nodes = tuple(Node(n.id, n.op, tuple(n.inputs), {k: _attr(f"node {quoted(n.id)}: attribute", k, v) for k, v in n.attrs.items()})
                  for n in message.nodes)
    op_defs = tuple(OpDefinition(d.name, tuple(d.operands), d.expression, tuple(sorted(d.derivatives.items())), d.doc)
                    for d in message.op_defs)
    return Graph(tuple(inputs), nodes, tuple((o.name, o.node) for o in message.outputs), op_defs)


def _attr_to_proto(value: object) -> pb.AttrValue:
    if isinstance(value, tuple) and any(isinstance(v, slice) for v in value):
        return pb.AttrValue(index=codec.index_list(value))
    return codec.attr_value(value)


def graph_to_proto(graph: Graph) -> pb.Graph:
    return pb.Graph(
        inputs=[pb.GraphInput(name=i.name, shape=i.shape, dtype=codec.dtype_to_proto(i.dtype)) for i in graph.inputs],
        nodes=[pb.Node(id=n.id, op=n.op, inputs=n.inputs, attrs={k: _attr_to_proto(v) for k, v in n.attrs.items()})
               for n in graph.nodes],
        outputs=[pb.GraphOutput(name=name, node=ref) for name, ref in graph.outputs],
        op_defs=[pb.OpDef(name=d.name, operands=d.operands, expression=d.expression, derivatives=dict(d.derivatives),
                          doc=d.doc) for d in graph.op_defs],
    )


def node_types(types: Mapping[str, Type]) -> list[pb.NodeType]:
    return [pb.NodeType(id=ref, shape=t.shape, dtype=codec.dtype_to_proto(t.dtype)) for ref, t in types.items()]


def op_info(op: OpDef) -> pb.OpInfo:
    return pb.OpInfo(
        name=op.name, arity=op.arity, operands=op.operands, kind=op.kind,
        expression=str(op.expression) if op.expression is not None else "",
        attrs=[pb.AttrSpec(name=a.name, kind=a.kind, required=a.required, doc=a.doc) for a in op.attrs],
        derivatives=[pb.DerivativeRule(operand=o, formula=f) for o, f in op.derivatives],
        doc=op.doc,
    )


def params_from_proto(params: Mapping[str, pb.AttrValue], what: str = "semiring parameter") -> dict[str, object]:
    """`what` names a parameter in messages ("hook 'scale' on node 'n': parameter")."""
    return {key: _attr(what, key, value) for key, value in params.items()}


def hooks_from_proto(attachments) -> tuple[HookRequest, ...]:
    def params(h):
        hook = "client hook" if h.client else f"hook {quoted(h.hook)}"
        return tuple(sorted(params_from_proto(h.params, f"{hook} on node {quoted(h.node)}: parameter").items()))

    return tuple(HookRequest(h.node, h.hook, h.kind or "post", params(h), h.client) for h in attachments)


def evaluate_spec(request: pb.EvaluateRequest, shared: Session | None = None) -> EvaluateSpec:
    """`shared`: the request's shared-memory session, for inputs that reference a region."""
    return EvaluateSpec(request.graph_id, tensors_to_arrays(request.inputs, "input", shared), tuple(request.outputs),
                        tuple(request.nodes), request.backend or "auto")


def is_plain_gradient(request: pb.GradientRequest) -> bool:
    """Whether `request` sets no field but PLAIN_GRADIENT_FIELDS: then its spec is plain. (Some
    plain specs come from requests this does not recognise, one naming the real semiring say:
    they take the general way.)"""
    for field, _ in request.ListFields():  # (a loop over descriptors: 2.1 µs, all() of names 3.8)
        if field not in _PLAIN_GRADIENT_DESCRIPTORS:
            return False
    return True


_PLAIN_GRADIENT_DESCRIPTORS = frozenset(field for field in pb.GradientRequest.DESCRIPTOR.fields
                                        if field.name in PLAIN_GRADIENT_FIELDS)


def check_lists(request: pb.GradientRequest, limits) -> None:
    """A request's lists, bounded by their length alone before any is read: a graph has at
    most max_nodes nodes to name, and a best path at least one step (a 9 MB request of 3 M
    `wrt` names ran 3.2 s past its deadline in the loops reading them; 3 M best-path starts
    grew a worker by 789 MB before max_path_steps refused them)."""
    for field in ("wrt", "outputs", "retain", "hooks", "semirings"):
        count = len(getattr(request, field))
        if count > limits.max_nodes:
            raise InvalidArgument(f"'{field}' lists {count} entries; a graph has at most max_nodes = "
                                  f"{limits.max_nodes} nodes to name")
    if len(request.best_paths) > limits.max_path_steps:
        raise ResourceExhausted(f"{len(request.best_paths)} best paths asked for, each at least one step; the "
                                f"limit is max_path_steps = {limits.max_path_steps}: ask for fewer paths")


def gradient_spec(request: pb.GradientRequest, shared: Session | None = None,
                  inputs: dict[str, np.ndarray] | None = None) -> GradientSpec:
    """`shared`: the request's shared-memory session, for inputs and seeds that reference a region.
    `inputs`: the request's inputs when the caller decoded them already (decode them once: elements
    read from shared memory count against the request's bound each time)."""
    return GradientSpec(
        request.graph_id, tensors_to_arrays(request.inputs, "input", shared) if inputs is None else inputs,
        tuple(request.wrt),
        tuple(request.outputs), tensors_to_arrays(request.seeds, "seed", shared) if request.seeds else None,
        request.return_outputs, request.semiring or "real",
        params_from_proto(request.semiring_params) if request.semiring_params else None, request.return_components,
        best_paths_of(request), request.backend or "auto", tuple(request.retain),
        hooks_from_proto(request.hooks) if request.hooks else (), tuple(request.semirings), request.top_paths)


def best_paths_of(request: pb.GradientRequest):
    """The request's best-path starts: (input, full index) pairs, or "all"."""
    if request.best_path_all:
        if request.best_paths:
            raise InvalidArgument("best_path_all and best_paths both given: ask for every element or for some")
        return "all"
    return tuple((ref.input, tuple(ref.index)) for ref in request.best_paths) if request.best_paths else ()


def with_tensors(response, maps: Mapping[str, Mapping[str, np.ndarray]], writer: Writer | None = None,
                 spliced: bool = False):
    """`response` with its tensor map fields filled ({field: {key: array}}, in this order): into
    the request's shared-memory output region (`writer`) as far as they fit, the rest written in
    place; or, `spliced` and at wire.THRESHOLD bytes or more without a region, a wire.Outgoing
    that copies each array's bytes once, into the serialized response."""
    if spliced and writer is None and sum(getattr(a, "nbytes", 0) for m in maps.values() for a in m.values()) \
            >= wire.THRESHOLD:
        return wire.Outgoing(response, maps)
    for field, arrays in maps.items():
        if arrays:
            put_tensors(getattr(response, field), arrays, writer)
    return response


def gradient_response(result, writer: Writer | None = None,
                      response: pb.GradientResponse | None = None, spliced: bool = False):
    """`writer`: the request's shared-memory output region, filled in this order (gradients first).
    The tensors are written in place (put_tensors) into `response` (a new one by default), not
    built and copied in; `spliced`: the gradients and outputs as `with_tensors` writes them (a
    wire.Outgoing when large)."""
    response = pb.GradientResponse() if response is None else response
    if spliced and writer is None:  # the other fields first: a wire.Outgoing's message is complete
        _rest_of_response(result, response, writer)
        return with_tensors(response, {"gradients": result.gradients, "outputs": result.outputs}, writer, spliced)
    put_tensors(response.gradients, result.gradients, writer)
    if result.outputs:
        put_tensors(response.outputs, result.outputs, writer)
    _rest_of_response(result, response, writer)
    return response


def _rest_of_response(result, response: pb.GradientResponse, writer: Writer | None) -> None:
    """Everything of a gradient's response but its gradients and outputs."""
    if result.components:
        for x, parts in result.components.items():
            put_tensors(response.components[x].tensors, parts, writer)
    if result.retained:
        put_tensors(response.retained, result.retained, writer)
    if result.records:
        for key, parts in result.records.items():
            put_tensors(response.records[key].tensors, parts, writer)
    if isinstance(result.best_paths, BestPaths):
        put_paths(response.paths, result.best_paths, writer)
    if result.semirings:
        for name, part in result.semirings.items():
            gradient_response(part, writer, response.semirings[name])


def put_paths(table: pb.PathTable, paths: BestPaths, writer: Writer | None = None) -> None:
    table.nodes.extend(paths.nodes)
    for shape in paths.shapes:
        table.shapes.add().values.extend(shape)
    table.outputs.extend(paths.outputs)
    table.batch_shape.extend(paths.batch_shape)
    put_tensors(table.columns, paths.columns, writer)
    put_tensors(table.values, paths.values, writer)


def semiring_info(record) -> pb.SemiringInfo:
    s = record.semiring
    info = pb.SemiringInfo(name=record.name, distribution=record.distribution, version=record.version,
                           entry_point=record.entry_point, status=record.status, error=record.error)
    if s is not None:
        info.description = s.description
        info.commutative, info.idempotent, info.selective = s.commutative, s.idempotent, s.selective
        info.components = s.components
        info.component_names.extend(s.read(s.ones((1,))))  # the names a gradient's components come back under
        info.primary = s.primary
        info.parameters.update(dict(s.parameters))
    return info


def crosscheck_response(report) -> pb.CrossCheckResponse:
    def blocks(result):
        return [pb.DerivativeBlock(output=o, input=x, value=codec.to_tensor(v))
                for (o, x), v in result.blocks.items()]

    return pb.CrossCheckResponse(
        passed=report.passed, semiring=report.semiring, atol=report.atol, rtol=report.rtol,
        methods=[pb.MethodReport(method=m.method, ran=m.ran, detail=m.detail, seconds=m.seconds, blocks=blocks(m))
                 for m in report.methods],
        comparisons=[pb.MethodComparison(
            method=c.method, reference=c.reference, passed=c.passed, max_abs_error=c.max_abs_error,
            max_rel_error=c.max_rel_error,
            blocks=[pb.BlockComparison(
                output=b.output, input=b.input, abs_error=codec.to_tensor(b.abs_error),
                rel_error=codec.to_tensor(b.rel_error), max_abs_error=b.max_abs_error,
                max_rel_error=b.max_rel_error, worst=b.worst, worst_value=b.worst_value,
                worst_reference=b.worst_reference, passed=b.passed) for b in c.blocks])
            for c in report.comparisons],
        localized=report.localized,
        node_checks=[pb.NodeCheck(node=c.node, op=c.op, position=c.position, operand=c.operand, source=c.source,
                                  rule=c.rule, checked=c.checked, passed=c.passed, max_abs_error=c.max_abs_error,
                                  max_rel_error=c.max_rel_error, detail=c.detail) for c in report.node_checks],
        suspects=report.suspects,
        text=report.text,
    )


def symbolic_gradient_response(result) -> pb.SymbolicGradientResponse:
    def block(b):
        return pb.FormulaBlock(output=b.output, input=b.input, shape=b.shape,
                               formulas=[pb.Formula(text=t, latex=latex) for t, latex in zip(b.text, b.latex)])

    return pb.SymbolicGradientResponse(outputs=[block(b) for b in result.outputs],
                                       derivatives=[block(b) for b in result.derivatives], python=result.python,
                                       simplified=result.simplified, detail=result.detail)


def hook_info(record) -> pb.HookInfo:
    info = pb.HookInfo(name=record.name, distribution=record.distribution, status=record.status, error=record.error)
    if record.hook is not None:
        info.description = record.hook.description
        info.parameters.update(dict(record.hook.parameters))
    return info


def description_response(d) -> pb.DescribeGraphResponse:
    """An inspect.describe.GraphDescription as a DescribeGraphResponse."""
    response = pb.DescribeGraphResponse(
        graph_id=d.graph_id, wrt=d.wrt, outputs=[pb.GraphOutput(name=name, node=ref) for name, ref in d.outputs],
        nodes=[pb.NodeInfo(
            id=n.id, op=n.op, inputs=n.inputs, consumers=n.consumers, shape=n.type.shape,
            dtype=codec.dtype_to_proto(n.type.dtype), attrs=n.attrs, leaf=n.leaf, requires_grad=n.requires_grad,
            outputs=n.outputs, expression=n.expression,
            derivatives=[pb.NodeDerivative(position=r.position, operand=r.operand, source=r.source, formula=r.formula)
                         for r in n.derivatives]) for n in d.nodes])
    if d.backward is not None:
        b = d.backward
        response.backward.CopyFrom(pb.BackwardGraphInfo(
            semiring=b.semiring, wrt=b.wrt, outputs=b.outputs, gradients=b.gradients, adjoints=b.adjoints,
            seeds=b.seeds,
            nodes=[pb.BackwardNode(id=n.id, op=n.op, inputs=n.inputs, attrs=n.attrs, shape=n.type.shape,
                                   dtype=codec.dtype_to_proto(n.type.dtype)) for n in b.nodes]))
    return response

