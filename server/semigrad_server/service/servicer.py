"""The gRPC servicer: decode, call the engine, encode; errors become status codes."""

from __future__ import annotations

import functools
import logging
import time

import grpc
from semigrad import wire
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc

from .. import deadline, errors
from ..engine import Engine
from ..engine.execution import held_until_answered
from ..hooks.run import HookRun
from ..inspect.describe import describe
from ..inspect.draw import draw
from ..ops import REGISTRY
from ..symbolic.crosscheck import crosscheck
from ..symbolic.custom import custom_ops
from ..symbolic.formulas import symbolic_gradient
from . import convert, status
from .call_end import DEADLINE_SKEW, when_ended
from .client_hooks import run_with_client_hooks
from .shared_memory import SharedMemory
from .streams import StreamSlots, pumped

log = logging.getLogger("semigrad.rpc")
NO_DEADLINE = 1e8  # seconds: grpc reports a huge time remaining for a call without a deadline


def rpc(method):
    """Decode-check the request, call the method; any exception becomes a status (status.py);
    one log line per call."""

    @functools.wraps(method)
    def handler(self, request, context: grpc.ServicerContext):
        start = time.perf_counter()
        code, detail = grpc.StatusCode.OK, ""
        bound = self.bound(context)
        stopped = None
        try:
            token = deadline.CURRENT.set(bound)  # deadline.serving(bound), inline: every call comes here
            try:
                return method(self, status.decoded(request), context)
            finally:
                deadline.CURRENT.reset(token)
        except Exception as e:  # noqa: BLE001 - the status layer tells client faults from bugs
            # When the work stopped: read before the interrupted work's objects are freed with its
            # frames, at the end of this clause (30,000 best paths: 0.1-0.2 s of deallocation).
            stopped = _overrun(bound)
            code, detail = status.status_of(e, method.__name__)
        finally:
            if log.isEnabledFor(logging.INFO):  # (its fields are worked out only for a line that is written)
                log.info("rpc=%s graph=%s status=%s ms=%.2f%s%s", method.__name__, _graph_of(request), code.name,
                         (time.perf_counter() - start) * 1e3, _overrun(bound) if stopped is None else stopped,
                         f" detail={detail!r}" if detail else "")
        context.abort(code, detail)

    return handler


def _overrun(bound: deadline.Bound) -> str:
    """" overrun_ms=…" when the call's work went on past its deadline or cancellation (by how long)."""
    late = bound.overrun()
    return "" if late is None else f" overrun_ms={late * 1e3:.1f}"


def _stream_logged(context: grpc.ServicerContext, code: grpc.StatusCode, line) -> None:
    """A streaming call's log line, `line(status name)`: a stream its handler ended OK is logged when
    the call has ended, as its client saw it (call_end.when_ended: a cancelled idle stream is CANCELLED)."""
    if code != grpc.StatusCode.OK:
        line(code.name)
    else:
        when_ended(context, lambda ending: line(ending or code.name))


def _graph_of(request) -> str:
    """The request's graph id for the log line: the client's text, so escaped (repr) unless printable; a
    newline in it would otherwise forge log lines of its own in the text format."""
    graph_id = getattr(request, "graph_id", "")
    if not graph_id:
        return "-"
    text = status.bounded(graph_id, 80)
    return text if text.isprintable() and " " not in text else repr(text)


class GraphServicer(pb_grpc.GraphServiceServicer):
    """`shared_memory`: the worker's view of same-host clients' shared-memory regions (default: enabled).
    `spliced`: large responses go to gRPC as wire.Outgoing, their tensors' bytes copied once, into
    the serialized response (a server's; in process the client reads the messages themselves)."""

    def __init__(self, engine: Engine, shared_memory: SharedMemory | None = None, *, spliced: bool = False):
        self.engine = engine
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemory()
        self.spliced = spliced
        self.streams = StreamSlots(engine.limits)

    def idle_seconds(self) -> float:
        """How long a stream waits for the client's next message, whatever its deadline."""
        return self.engine.limits.max_request_seconds

    def bound(self, context: grpc.ServicerContext, capped: bool = True) -> deadline.Bound:
        """The call's time bound: the client's deadline, or the server's default (and, `capped`,
        its cap) max_request_seconds; ended at once when the call ends (cancelled, the client
        gone). Streams are not capped: a client may stream chunks for longer, each chunk's work
        bounded by max_request_seconds (engine.execution.time_bound)."""
        remaining = context.time_remaining()
        if not capped and remaining is not None and remaining < NO_DEADLINE:
            bound = deadline.start(remaining, remaining)
        else:
            bound = deadline.start(remaining, self.engine.limits.max_request_seconds)

        def ended():
            remaining = context.time_remaining()
            bound.cancel(deadline_passed=remaining is not None and remaining <= DEADLINE_SKEW)

        context.add_callback(ended)
        return bound

    @rpc
    def RegisterGraph(self, request, context):
        self.engine.check_node_count(len(request.graph.nodes))  # before reading them
        cg, created = self.engine.register(deadline.interruptibly("reading the graph", convert.graph_from_proto,
                                                                  request.graph))
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
        with self.shared_memory.session(context.peer) as shared, held_until_answered():
            spec = convert.evaluate_spec(request, shared)
            writer = shared.writer(request.output_region) if request.HasField("output_region") else None
            outputs, nodes = self.engine.run_evaluate(spec, deadline.deadline())
            return convert.with_tensors(pb.EvaluateResponse(), {"outputs": outputs, "nodes": nodes}, writer,
                                        self.spliced)

    @rpc
    def Gradient(self, request, context):
        return self._gradient(request, context, deadline.deadline(), spliced=self.spliced)

    def _gradient(self, request, context, until, hook_run=None, spliced=False):
        convert.check_lists(request, self.engine.limits)
        with self.shared_memory.session(context.peer) as shared, held_until_answered():
            inputs = convert.tensors_to_arrays(request.inputs, "input", shared)
            spec = None if convert.is_plain_gradient(request) else convert.gradient_spec(request, shared, inputs)
            writer = shared.writer(request.output_region) if request.HasField("output_region") else None
            # A plain request whose input signature passed the checks before goes straight to its
            # plan, as run_gradient would send it, without a spec (most calls)
            # (repeated fields sliced before they become tuples: upb iterates a slice's list faster)
            result = None if spec is not None else self.engine.remembered_gradient(
                request.graph_id, inputs, tuple(request.wrt[:]), tuple(request.outputs[:]), request.return_outputs,
                request.backend or "auto", until)
            if result is None:
                if spec is None:
                    spec = convert.gradient_spec(request, shared, inputs)
                result = self.engine.run_gradient(spec, until, hook_run)
            return convert.gradient_response(result, writer, spliced=spliced)  # its bytes: bounded before the work

    def GradientWithHooks(self, request_iterator, context):
        start, code = time.perf_counter(), grpc.StatusCode.OK
        detail = ""
        bound = self.bound(context, capped=False)
        try:
            with self.streams.taken(context.peer(), "GradientWithHooks"):
                yield from run_with_client_hooks(
                    status.decoded_stream(pumped(request_iterator, bound, "GradientWithHooks", self.idle_seconds(),
                                                 context.is_active)),
                    context, bound,
                    lambda request, channel: self._gradient(request, context, bound.deadline,
                                                            HookRun(client=channel)))
        except Exception as e:  # noqa: BLE001 - the status layer tells client faults from bugs
            code, detail = status.status_of(e, "GradientWithHooks")
        finally:
            ms, overrun = (time.perf_counter() - start) * 1e3, _overrun(bound)
            _stream_logged(context, code, lambda status_name: log.info(
                "rpc=GradientWithHooks status=%s ms=%.2f%s%s", status_name, ms, overrun,
                f" detail={detail!r}" if detail else ""))
        if code != grpc.StatusCode.OK:
            context.abort(code, detail)

    @rpc
    def ListHooks(self, request, context):
        return pb.ListHooksResponse(hooks=[convert.hook_info(r) for r in self.engine.hooks.records])

    def GradientStream(self, request_iterator, context):
        """Each chunk is answered in order; a failing chunk carries its status and the stream goes
        on. A message that does not decode ends the stream with INVALID_ARGUMENT."""
        start, counts = time.perf_counter(), [0, 0]
        code, detail = grpc.StatusCode.OK, ""
        bound = self.bound(context, capped=False)
        try:
            with self.streams.taken(context.peer(), "GradientStream"):
                yield from self._chunks(status.decoded_stream(pumped(request_iterator, bound, "GradientStream",
                                                                         self.idle_seconds(), context.is_active)),
                                        bound, context, counts)
        except Exception as e:  # noqa: BLE001 - the stream itself failed (a message that does not decode)
            code, detail = status.status_of(e, "GradientStream")
        finally:
            (done, failed), ms, overrun = counts, (time.perf_counter() - start) * 1e3, _overrun(bound)
            _stream_logged(context, code, lambda status_name: log.info(
                "rpc=GradientStream chunks=%d failed=%d status=%s ms=%.2f%s%s", done, failed, status_name, ms,
                overrun, f" detail={detail!r}" if detail else ""))
        if code != grpc.StatusCode.OK:
            context.abort(code, detail)

    def _chunks(self, messages, bound, context, counts: list[int]):
        """The stream's responses, one per chunk; counts: [chunks answered, chunks failed]."""
        for message in messages:
            if not context.is_active():
                break
            try:
                with deadline.serving(bound):
                    answer = self._gradient(message.request, context, bound.deadline, spliced=self.spliced)
                response = (answer.inside(pb.GradientStreamResponse(chunk=message.chunk), "response")
                            if isinstance(answer, wire.Outgoing) else
                            pb.GradientStreamResponse(chunk=message.chunk, response=answer))
            except Exception as e:  # noqa: BLE001 - reported in the chunk; the stream and the server go on
                counts[1] += 1
                chunk_code, chunk_detail = status.status_of(e, f"GradientStream chunk {message.chunk}")
                response = pb.GradientStreamResponse(chunk=message.chunk, code=chunk_code.value[0],
                                                     message=chunk_detail, max_items=getattr(e, "max_items", 0))
            counts[0] += 1
            yield response

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
            localize=request.localize, deadline=deadline.deadline())
        return convert.crosscheck_response(report)

    @rpc
    def SymbolicGradient(self, request, context):
        result = symbolic_gradient(self.engine, request.graph_id, wrt=list(request.wrt), outputs=list(request.outputs),
                                   simplify=not request.no_simplify, deadline=deadline.deadline())
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
                   highlight=[(e.node, tuple(e.index)) for e in request.highlight], deadline=deadline.deadline())
        return pb.DrawGraphResponse(dot=dot)

    @rpc
    def ListOps(self, request, context):
        return pb.ListOpsResponse(ops=[convert.op_info(op) for op in REGISTRY])
