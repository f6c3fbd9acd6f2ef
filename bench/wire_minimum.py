"""The least a protobuf gRPC service in Python costs beyond a bare round trip of its bytes, beside
semigrad's own remote single point: is issue 14's floor (remote ≤ 1.2 × (in-process compute + a
bare grpcio round trip of the same bytes)) reachable by any service of this shape on this machine?

One child process serves, on four ephemeral ports, each in a sync grpcio server as `semigrad
serve` builds its workers (the faster kind here: a grpc.aio echo measured slower on this
machine):

- **echo**: raw bytes in, as many raw bytes out as the semigrad server answers (the floor's
  network part, as bench/wire_floor.py measures it);
- **protobuf**: a GradientRequest parsed by protobuf, its inputs read as arrays, a
  GradientResponse holding them as the gradients serialized back; its client builds the request
  from the arrays and reads the response's arrays (no computing, no checks);
- **protobuf + interceptor**: the same behind one grpc.ServerInterceptor that wraps the handler,
  reads the call's deadline and sets a context variable (what any service that authenticates,
  scopes tenants or bounds time per call does at least);
- **protobuf + interceptor + engine**: the same, its handler computing the gradient by semigrad's
  engine (the graph registered through the semigrad server, whose engine it shares) as the
  in-process client's hot path calls it: what is left of a semigrad server without its checks,
  tenancy, quotas, request ids, logs and statuses;
- **semigrad**: `semigrad serve`'s server, called through the client library.

Each is timed in alternation with the others (blocks of 20 calls, each call on a point of its
own), with the in-process client alongside; the ratio is each remote call ÷ (in-process + echo).

    .venv/bin/python bench/wire_minimum.py [--workload det4] [--blocks 40]
"""

from __future__ import annotations

import argparse
import contextvars
import itertools
import statistics
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import semigrad  # noqa: E402
from common import alternated_blocks, settle  # noqa: E402
from inprocess import WORKLOADS  # noqa: E402
from semigrad import codec  # noqa: E402
from semigrad.v1 import semigrad_pb2 as pb  # noqa: E402
from wire_floor import ECHO_SERVICE, check, echo_handler  # noqa: E402

MINIMAL_SERVICE = "wireminimum.Gradient"
CALL_SCOPE: contextvars.ContextVar = contextvars.ContextVar("call_scope", default=None)


def minimal_gradient(request: pb.GradientRequest, context) -> pb.GradientResponse:
    response = pb.GradientResponse()
    for name in request.inputs:
        codec.write_tensor(response.gradients[name], codec.inline_array(request.inputs[name]))
    return response


def engine_gradient(service):
    def gradient(request: pb.GradientRequest, context) -> pb.GradientResponse:
        inputs = {name: codec.inline_array(request.inputs[name]) for name in request.inputs}
        gradients, _ = service.gradient(request.graph_id, inputs, tuple(request.wrt), (), False, "auto", None)
        response = pb.GradientResponse()
        for name, value in gradients.items():
            codec.write_tensor(response.gradients[name], value)
        return response

    return gradient


class DeadlineInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, details):
        handler = continuation(details)
        behaviour = handler.unary_unary

        def unary(request, context):
            CALL_SCOPE.set(context.time_remaining())
            return behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)


def serve_child() -> None:
    from semigrad_server.allocator import reuse_freed_memory
    from semigrad_server.service import build_server

    from semigrad_server.service.local import LocalService

    reuse_freed_memory()  # as a worker of `semigrad serve` does
    semigrad_server, port, engine = build_server("127.0.0.1:0")
    semigrad_server.start()
    servers, ports = [semigrad_server], [port]
    gradient = grpc.unary_unary_rpc_method_handler(minimal_gradient, pb.GradientRequest.FromString,
                                                   pb.GradientResponse.SerializeToString)
    computed = grpc.unary_unary_rpc_method_handler(engine_gradient(LocalService(engine)), pb.GradientRequest.FromString,
                                                   pb.GradientResponse.SerializeToString)
    for handlers, interceptors in (
            ((echo_handler(),), ()),
            ((grpc.method_handlers_generic_handler(MINIMAL_SERVICE, {"Gradient": gradient}),), ()),
            ((grpc.method_handlers_generic_handler(MINIMAL_SERVICE, {"Gradient": gradient}),),
             (DeadlineInterceptor(),)),
            ((grpc.method_handlers_generic_handler(MINIMAL_SERVICE, {"Gradient": computed}),),
             (DeadlineInterceptor(),))):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=interceptors)
        server.add_generic_rpc_handlers(handlers)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        servers.append(server)
    print(*ports, flush=True)
    sys.stdin.read()
    for server in servers:
        server.stop(0).wait()


def minimal_client(channel, graph_id: str, wrt: list[str]):
    stub = channel.unary_unary(f"/{MINIMAL_SERVICE}/Gradient", request_serializer=pb.GradientRequest.SerializeToString,
                               response_deserializer=pb.GradientResponse.FromString)

    def gradient(inputs: dict) -> dict:
        request = pb.GradientRequest(graph_id=graph_id, wrt=wrt)
        for name, value in inputs.items():
            codec.write_tensor(request.inputs[name], value)
        response = stub(request, timeout=60)
        return {name: codec.inline_array(response.gradients[name]) for name in response.gradients}

    return gradient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="det4", choices=sorted(WORKLOADS))
    parser.add_argument("--blocks", type=int, default=40, help="alternated blocks of 20 calls each")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_child()
        return
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        port, echo_port, minimal_port, intercepted_port, computed_port = map(int, child.stdout.readline().split())
        w = WORKLOADS[args.workload]
        wrt = list(w.wrt)
        x = {k: np.asarray(v) for k, v in w.single.sample(np.random.default_rng(), None).items()}
        remote = semigrad.Client(f"127.0.0.1:{port}", shared_memory=False)
        g = remote.register(w.graph(w.single))
        local = semigrad.Client()
        g_local = local.register(w.graph(w.single))
        for _ in range(200):  # past the hot-call thresholds; then the background compiles, waited for
            g.gradient(x, wrt=wrt)
            g_local.gradient(x, wrt=wrt)
        settle()
        grpc.insecure_channel(f"127.0.0.1:{echo_port}").unary_unary(f"/{ECHO_SERVICE}/Settle")(b"", timeout=600)
        check(g.gradient(x, wrt=wrt), w.reference_gradient(x), args.workload)
        request = pb.GradientRequest(graph_id=g.id, wrt=wrt)
        for name, value in x.items():
            codec.write_tensor(request.inputs[name], value)
        answer = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/semigrad.v1.GraphService/Gradient")(
            request.SerializeToString())
        echo = grpc.insecure_channel(f"127.0.0.1:{echo_port}").unary_unary(f"/{ECHO_SERVICE}/Unary")
        message = len(answer).to_bytes(8, "little") + b"\0" * (request.ByteSize() - 8)
        minimal = minimal_client(grpc.insecure_channel(f"127.0.0.1:{minimal_port}"), g.id, wrt)
        intercepted = minimal_client(grpc.insecure_channel(f"127.0.0.1:{intercepted_port}"), g.id, wrt)
        computed = minimal_client(grpc.insecure_channel(f"127.0.0.1:{computed_port}"), g.id, wrt)
        for name, value in x.items():
            assert np.array_equal(minimal(x)[name], value) and np.array_equal(intercepted(x)[name], value)
        check(computed(x), w.reference_gradient(x), f"{args.workload} (protobuf + interceptor + engine)")
        rng = np.random.default_rng()  # every call its own point (drawn before timing, taken in turn)
        points = itertools.cycle([{k: np.asarray(v) for k, v in w.single.sample(rng, None).items()}
                                  for _ in range(256)])
        calls = {"in-process": lambda: g_local.gradient(next(points), wrt=wrt), "echo": lambda: echo(message),
                 "protobuf": lambda: minimal(next(points)), "protobuf + interceptor": lambda: intercepted(next(points)),
                 "protobuf + interceptor + engine": lambda: computed(next(points)),
                 "semigrad": lambda: g.gradient(next(points), wrt=wrt)}
        times = alternated_blocks(calls, args.blocks)
        median = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        floor, floor_best = median["in-process"] + median["echo"], best["in-process"] + best["echo"]
        print(f"{args.workload} single point: {request.ByteSize():,} request bytes, {len(answer):,} response bytes; "
              f"{args.blocks} alternated blocks of 20 calls\n")
        print("| call | µs (median) | least disturbed block | ÷ (in-process + echo) |")
        print("| --- | ---: | ---: | ---: |")
        for k in calls:
            ratio = "" if k in ("in-process", "echo") else f"{median[k] / floor:.3f} ({best[k] / floor_best:.3f})"
            print(f"| {k} | {median[k]:,.1f} | {best[k]:,.1f} | {ratio} |")
        print(f"\nRerun: `.venv/bin/python bench/wire_minimum.py --workload {args.workload} --blocks {args.blocks}`")
        remote.close()
    finally:
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    main()
