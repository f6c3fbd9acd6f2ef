"""Where a remote single-point gradient's time goes beyond a bare round trip: three calls timed in
alternation against one `semigrad serve`-like worker (bench/wire_floor.py's child process):

- **echo**: a bare grpcio round trip of the same bytes (the floor's network part);
- **server**: the semigrad server called with the request's bytes serialized beforehand (no
  client library: gRPC and the server's own work);
- **client**: `RegisteredGraph.gradient` (the whole call).

server − echo is the server's share, client − server the client library's.

    .venv/bin/python bench/wire_parts.py [--workload det4] [--blocks 40]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import semigrad  # noqa: E402
from common import alternated_blocks  # noqa: E402
from inprocess import WORKLOADS  # noqa: E402
from semigrad.v1 import semigrad_pb2 as pb  # noqa: E402
from wire_floor import ECHO_SERVICE, check  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="det4", choices=sorted(WORKLOADS))
    parser.add_argument("--blocks", type=int, default=40, help="alternated blocks of 20 calls each")
    args = parser.parse_args()
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("wire_floor.py")), "--serve"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, echo_port = map(int, child.stdout.readline().split())
        w = WORKLOADS[args.workload]
        wrt = list(w.wrt)
        x = w.single.sample(np.random.default_rng(), None)
        client = semigrad.Client(f"127.0.0.1:{port}", shared_memory=False)
        g = client.register(w.graph(w.single))
        for _ in range(200):  # past the hot-call threshold and the background compile
            g.gradient(x, wrt=wrt)
        check(g.gradient(x, wrt=wrt), w.reference_gradient(x), args.workload)
        request = pb.GradientRequest(graph_id=g.id, wrt=wrt)
        for name, value in x.items():
            request.inputs[name].CopyFrom(semigrad.codec.to_tensor(np.asarray(value)))
        raw = request.SerializeToString()
        server = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/semigrad.v1.GraphService/Gradient")
        answer = server(raw)
        echo = grpc.insecure_channel(f"127.0.0.1:{echo_port}").unary_unary(f"/{ECHO_SERVICE}/Unary")
        message = len(answer).to_bytes(8, "little") + b"\0" * (len(raw) - 8)
        calls = {"echo": lambda: echo(message), "server": lambda: server(raw), "client": lambda: g.gradient(x, wrt=wrt)}
        times = alternated_blocks(calls, args.blocks)
        median = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {args.workload} single point | µs (median of {args.blocks} blocks) | least disturbed block |")
        print("| --- | ---: | ---: |")
        for k in calls:
            print(f"| {k} | {median[k]:,.1f} | {min(times[k]):,.1f} |")
        print(f"\nserver's share: {median['server'] - median['echo']:,.1f} µs; "
              f"client library's: {median['client'] - median['server']:,.1f} µs")
        client.close()
    finally:
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    main()
