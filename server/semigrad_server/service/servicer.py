"""The gRPC servicer: decode, call the engine, encode; errors become status codes."""

from __future__ import annotations

import functools
import logging
import time

import grpc
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc

from .. import errors
from ..engine import Engine
from ..hooks.run import HookRun
from ..inspect.describe import describe
from ..inspect.draw import draw
from ..ops import REGISTRY
from ..symbolic.crosscheck import crosscheck
from ..symbolic.custom import custom_ops
from ..symbolic.formulas import symbolic_gradient
from . import convert, status
from .client_hooks import run_with_client_hooks
from .shared_memory import SharedMemory

log = logging.getLogger("semigrad.rpc")


def rpc(method):
    """Decode-check the request, call the method; any exception becomes a status (status.py);
    one log line per call."""

    @functools.wraps(method)
    def handler(self, request, context: grpc.ServicerContext):
        start = time.perf_counter()
        code, detail = grpc.StatusCode.OK, ""
        try:
            return method(self, status.decoded(request), context)
        except Exception as e:  # noqa: BLE001 - the status layer tells client faults from bugs
            code, detail = status.status_of(e, method.__name__)
        finally:
            log.info("rpc=%s graph=%s status=%s ms=%.2f%s", method.__name__, _graph_of(request), code.name,
                     (time.perf_counter() - start) * 1e3, f" detail={detail!r}" if detail else "")
        context.abort(code, detail)

    return handler


def _graph_of(request) -> str:
    """The request's graph id for the log line: the client's text, so escaped (repr) unless printable; a
    newline in it would otherwise forge log lines of its own in the text format."""
    graph_id = getattr(request, "graph_id", "")
    if not graph_id:
        return "-"
    text = status.bounded(graph_id, 80)
    return text if text.isprintable() and " " not in text else repr(text)


def deadline_of(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class GraphServicer(pb_grpc.GraphServiceServicer):
    """`shared_memory`: the worker's view of same-host clients' shared-memory regions (default: enabled)."""

    def __init__(self, engine: Engine, shared_memory: SharedMemory | None = None):
        self.engine = engine
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemory()

    @rpc
    def RegisterGraph(self, request, context):
        cg, created = self.engine.register(convert.graph_from_proto(request.graph))
        return pb.RegisterGraphResponse(graph_id=cg.id, created=created, types=convert.node_types(cg.types),
                                        custom_ops=[convert.op_info(op) for op in custom_ops(cg.registry)])

    @rpc
    def GetGraph(self, request, context):
        cg = self.engine.get(request.graph_id)
        return pb.GetGraphResponse(graph_id=cg.id, graph=convert.graph_to_proto(cg.graph),
                                   types=convert.node_types(cg.types),
                                   custom_ops=[convert.op_info(op) for op in custom_ops(cg.registry)])

    @rpc
    def DeleteGraph(self, request, context):
        return pb.DeleteGraphResponse(deleted=self.engine.delete(request.graph_id))

    @rpc
    def Evaluate(self, request, context):
        with self.shared_memory.session(context.peer()) as shared:
            spec = convert.evaluate_spec(request, shared)
            writer = shared.writer(request.output_region) if request.HasField("output_region") else None
            outputs, nodes = self.engine.run_evaluate(spec, deadline_of(context))
            return pb.EvaluateResponse(outputs=convert.arrays_to_tensors(outputs, writer),
                                       nodes=convert.arrays_to_tensors(nodes, writer))

    @rpc
    def Gradient(self, request, context):
        return self._gradient(request, context)

    def _gradient(self, request, context, hook_run=None):
        with self.shared_memory.session(context.peer()) as shared:
            spec = convert.gradient_spec(request, shared)
            writer = shared.writer(request.output_region) if request.HasField("output_region") else None
            result = self.engine.run_gradient(spec, deadline_of(context), hook_run)
            return convert.gradient_response(result, writer)

    def GradientWithHooks(self, request_iterator, context):
        start, code = time.perf_counter(), grpc.StatusCode.OK
        detail = ""
        try:
            yield from run_with_client_hooks(
                status.decoded_stream(request_iterator), context,
                lambda request, channel: self._gradient(request, context, HookRun(client=channel)))
        except Exception as e:  # noqa: BLE001 - the status layer tells client faults from bugs
            code, detail = status.status_of(e, "GradientWithHooks")
        finally:
            log.info("rpc=GradientWithHooks status=%s ms=%.2f%s", code.name, (time.perf_counter() - start) * 1e3,
                     f" detail={detail!r}" if detail else "")
        if code != grpc.StatusCode.OK:
            context.abort(code, detail)

    @rpc
    def ListHooks(self, request, context):
        return pb.ListHooksResponse(hooks=[convert.hook_info(r) for r in self.engine.hooks.records])

    def GradientStream(self, request_iterator, context):
        """Each chunk is answered in order; a failing chunk carries its status and the stream goes
        on. A message that does not decode ends the stream with INVALID_ARGUMENT."""
        start, done, failed = time.perf_counter(), 0, 0
        code, detail = grpc.StatusCode.OK, ""
        try:
            for message in status.decoded_stream(request_iterator):
                if not context.is_active():
                    break
                try:
                    response = pb.GradientStreamResponse(chunk=message.chunk,
                                                         response=self._gradient(message.request, context))
                except Exception as e:  # noqa: BLE001 - reported in the chunk; the stream and the server go on
                    failed += 1
                    chunk_code, chunk_detail = status.status_of(e, f"GradientStream chunk {message.chunk}")
                    response = pb.GradientStreamResponse(chunk=message.chunk, code=chunk_code.value[0],
                                                         message=chunk_detail)
                done += 1
                yield response
        except Exception as e:  # noqa: BLE001 - the stream itself failed (a message that does not decode)
            code, detail = status.status_of(e, "GradientStream")
        finally:
            log.info("rpc=GradientStream chunks=%d failed=%d status=%s ms=%.2f%s", done, failed,
                     code.name if code != grpc.StatusCode.OK or context.is_active() else "CANCELLED",
                     (time.perf_counter() - start) * 1e3, f" detail={detail!r}" if detail else "")
        if code != grpc.StatusCode.OK:
            context.abort(code, detail)

    @rpc
    def ListSemirings(self, request, context):
        return pb.ListSemiringsResponse(semirings=[convert.semiring_info(r) for r in self.engine.semirings.records])

    @rpc
    def CrossCheck(self, request, context):
        report = crosscheck(
            self.engine, request.graph_id, convert.tensors_to_arrays(request.inputs, "input"), wrt=list(request.wrt),
            outputs=list(request.outputs), methods=list(request.methods),
            atol=request.atol if request.HasField("atol") else None,
            rtol=request.rtol if request.HasField("rtol") else None,
            step=request.step if request.HasField("step") else None, richardson=request.richardson,
            semiring=request.semiring, semiring_params=convert.params_from_proto(request.semiring_params),
            localize=request.localize, deadline=deadline_of(context))
        return convert.crosscheck_response(report)

    @rpc
    def SymbolicGradient(self, request, context):
        result = symbolic_gradient(self.engine, request.graph_id, wrt=list(request.wrt), outputs=list(request.outputs),
                                   simplify=not request.no_simplify, deadline=deadline_of(context))
        return convert.symbolic_gradient_response(result)

    @rpc
    def DescribeGraph(self, request, context):
        description = describe(self.engine, request.graph_id, semiring=request.semiring,
                               semiring_params=convert.params_from_proto(request.semiring_params),
                               wrt=list(request.wrt), outputs=list(request.outputs))
        return convert.description_response(description)

    @rpc
    def DrawGraph(self, request, context):
        dot = draw(self.engine, request.graph_id, convert.tensors_to_arrays(request.inputs, "input"),
                   semiring=request.semiring, semiring_params=convert.params_from_proto(request.semiring_params),
                   wrt=list(request.wrt), values=convert.tensors_to_arrays(request.values, "value"),
                   gradients=convert.tensors_to_arrays(request.gradients, "gradient"),
                   highlight=[(e.node, tuple(e.index)) for e in request.highlight], deadline=deadline_of(context))
        return pb.DrawGraphResponse(dot=dot)

    @rpc
    def ListOps(self, request, context):
        return pb.ListOpsResponse(ops=[convert.op_info(op) for op in REGISTRY])
