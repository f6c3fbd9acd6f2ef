"""Command line: `semigrad serve ...`, `semigrad plugins [check NAME]`, `semigrad check FILE`,
`semigrad diff EXPR OPERAND...`, `semigrad viz FILE`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import metadata


from . import __version__
from .cpus import available_cpus
from .limits import Limits
from .plugin_loader import load_entry_point
from .semiring.base import API_VERSION, Semiring
from .semiring.checker import SAMPLES, law_results
from .semiring.loader import GROUP, SemiringRegistry

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50051


def default_store() -> str:
    """$SEMIGRAD_STORE, else graphs.sqlite under the XDG state directory."""
    if os.environ.get("SEMIGRAD_STORE"):
        return os.environ["SEMIGRAD_STORE"]
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "semigrad", "graphs.sqlite")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semigrad", description="Differentiate computation graphs over gRPC.")
    parser.add_argument("--version", action="version", version=f"semigrad {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    serve.add_argument("--threads", type=int, default=8, help="request threads per worker (default 8)")
    serve.add_argument("--workers", type=int, default=None,
                       help="server processes sharing the port (default: one per CPU this container may use, "
                            f"from its cgroup quota and affinity: {available_cpus()} here; 1 with --store memory)")
    serve.add_argument("--store", default=default_store(),
                       help="where registered graphs live: a SQLite file shared by the workers of this host, "
                            "redis://HOST:PORT/DB for a Redis server shared by replicas (run it with appendonly "
                            "yes, appendfsync always: docs/deploying.md), or 'memory' to keep graphs in this "
                            f"process only (default {default_store()}; env SEMIGRAD_STORE)")
    serve.add_argument("--no-shared-memory", dest="shared_memory", action="store_false",
                       help="refuse tensors in shared memory (by default clients on this host, running as "
                            "this user, may pass tensors through /dev/shm; see docs/performance.md)")
    serve.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    serve.add_argument("--log-format", choices=("text", "json"), default=os.environ.get("SEMIGRAD_LOG_FORMAT", "text"),
                       help="log lines as text or JSON objects, each with its request id (default text; "
                            "env SEMIGRAD_LOG_FORMAT)")
    serve.add_argument("--tokens", default=None, metavar="FILE",
                       help="bearer tokens of the tenants, one 'TENANT TOKEN' a line (also env SEMIGRAD_TOKENS_FILE, "
                            "and SEMIGRAD_TOKENS='TENANT=TOKEN,...'); with any token, every call but health needs "
                            "'authorization: Bearer TOKEN' and graphs are scoped per tenant (default: no "
                            "authentication, one anonymous tenant)")
    serve.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate chain")
    serve.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    serve.add_argument("--tls-client-ca", default=None, metavar="PEM",
                       help="mutual TLS: clients must present a certificate signed by this CA")
    serve.add_argument("--metrics-port", type=int, default=None,
                       help="serve Prometheus metrics on http://METRICS_HOST:PORT/metrics (default: off; 0: any port)")
    serve.add_argument("--metrics-host", default="127.0.0.1",
                       help="address of the metrics port (default 127.0.0.1: the metrics name every tenant and "
                            "its usage, and have no authentication; give 0.0.0.0 for a scraper on another host)")
    serve.add_argument("--drain-seconds", type=float, default=0.0,
                       help="on SIGTERM, report NOT_SERVING to health checks and keep serving this long before "
                            "refusing new calls, so load balancers stop routing first (default 0)")
    serve.add_argument("--grace-seconds", type=float, default=5.0,
                       help="then give the calls in flight this long to finish (default 5)")
    defaults = Limits()
    for name in Limits.names():
        value = getattr(defaults, name)
        serve.add_argument("--" + name.replace("_", "-"), type=type(value), default=value,
                           help=f"limit (default {value})")

    plugins = commands.add_parser("plugins", help="list the semiring plugins (entry point group semigrad.semirings)")
    plugin_commands = plugins.add_subparsers(dest="plugins_command")
    check = plugin_commands.add_parser("check", help="check a semiring's axioms, law by law")
    check.add_argument("name", help="the semiring's entry point name")
    check.add_argument("--samples", type=_positive_int, default=None, help="random samples per law (default: the checker's)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="semiring parameter, e.g. k=5 for kbest (repeatable)")

    add_symbolic_commands(commands)
    add_viz_command(commands)
    return parser


def add_symbolic_commands(commands) -> None:
    """`semigrad check FILE` and `semigrad diff EXPR OPERAND...` (see docs/crosscheck.md)."""
    check = commands.add_parser(
        "check", help="cross-check a graph's derivatives at one point (in-process, no server)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare reverse mode with the symbolic gradient and finite differences (or, for another\n"
                    "semiring, with brute-force path enumeration) and print the report. FILE is JSON:\n"
                    '  {"graph": <semigrad.v1.Graph in the protobuf JSON mapping>,\n'
                    '   "inputs": {"x": [[1, 2], [3, 4]], ...}}   (values as nested lists, or Tensor JSON)\n'
                    'optionally with "wrt", "outputs", "methods", "atol", "rtol", "step", "richardson",\n'
                    '"semiring", "semiring_params", "localize"; options given here override the file.\n'
                    "Exit status: 0 passed, 1 failed, 2 bad input. See docs/crosscheck.md.")
    check.add_argument("file", help="the JSON file")
    check.add_argument("--wrt", action="append", default=None, metavar="INPUT", help="differentiate w.r.t. INPUT (repeatable)")
    check.add_argument("--output", dest="outputs", action="append", default=None, metavar="OUTPUT",
                       help="differentiate OUTPUT (repeatable)")
    check.add_argument("--method", dest="methods", action="append", default=None, metavar="METHOD",
                       help="reverse, symbolic, finite_difference, complex_step; path_enumeration (repeatable)")
    check.add_argument("--atol", type=float, default=None, help="absolute tolerance (default 1e-5)")
    check.add_argument("--rtol", type=float, default=None, help="relative tolerance (default 1e-3)")
    check.add_argument("--step", type=float, default=None, help="relative finite-difference step (default 6e-6)")
    check.add_argument("--richardson", action="store_true", default=None, help="Richardson extrapolation")
    check.add_argument("--semiring", default=None, help="semiring of the backward pass (default real)")
    check.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="semiring parameter")
    check.add_argument("--localize", action="store_true", default=None,
                       help="check every node's local rule even when the comparisons pass")

    diff = commands.add_parser(
        "diff", help="differentiate an expression symbolically and check it numerically",
        description='Print the partial derivatives of EXPR (e.g. "x*sin(y)") with respect to each OPERAND, '
                    "then compare them with the server's reverse mode and central differences at a random point.")
    diff.add_argument("expression", help="an expression in the safe expression language")
    diff.add_argument("operands", nargs="+", help="operand names, in order")
    diff.add_argument("--at", action="append", default=[], metavar="NAME=VALUE", help="fix an operand's value")
    diff.add_argument("--grad", action="append", default=[], metavar="NAME=EXPR",
                      help="a hand-written derivative to check instead of SymPy's (used by reverse mode)")
    diff.add_argument("--seed", type=int, default=0, help="random seed of the point (default 0)")
    diff.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    diff.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default 1e-3)")


def add_viz_command(commands) -> None:
    """`semigrad viz FILE -o graph.svg` (see docs/inspect-and-hook.md)."""
    viz = commands.add_parser(
        "viz", help="draw a graph, labelled with values and gradients (in-process, no server)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Draw a graph as Graphviz DOT text, or render it (.svg, .png, .pdf: needs the graphviz\n"
                    "Python package and Graphviz's dot program). FILE is JSON:\n"
                    '  {"graph": <semigrad.v1.Graph in the protobuf JSON mapping>,\n'
                    '   "inputs": {"x": [[1, 2], [3, 4]], ...}}   (optional: label nodes with values and gradients)\n'
                    'optionally with "semiring", "semiring_params", "wrt" and "best_path": {"input": "A",\n'
                    '"index": [0, 0]} (a selective semiring\'s best path, highlighted); options given here\n'
                    "override the file. Exit status: 0 written, 1 cannot render, 2 bad input.")
    viz.add_argument("file", help="the JSON file")
    viz.add_argument("-o", "--output", default=None,
                     help="where to write: .dot/.gv for DOT text, .svg/.png/.pdf/... rendered (default: DOT on stdout)")
    viz.add_argument("--semiring", default=None, help="semiring of the gradients shown (default real)")
    viz.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="semiring parameter")
    viz.add_argument("--wrt", action="append", default=None, metavar="INPUT",
                     help="differentiate w.r.t. INPUT (repeatable)")
    viz.add_argument("--best-path", default=None, metavar="INPUT:I,J,...",
                     help="highlight the best path from this input element (selective semirings, e.g. A:0,1)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        # gRPC core logs through absl at INFO unless told otherwise (since grpcio 1.65; its documented
        # default is ERROR): every failed TLS handshake of any peer, a plaintext probe say, wrote a
        # glog-style line to stderr, between the JSON lines of --log-format json and at a rate any
        # client can set. Set before gRPC loads (the workers inherit it); an operator's setting wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        from . import logs
        from .service.auth import load_tokens
        from .service.server import Serving, SupervisorGaveUp, serve
        from .service.tls import tls_files

        logs.configure(args.log_level, args.log_format)
        limits = Limits(**{name: getattr(args, name) for name in Limits.names()})
        store = None if args.store == "memory" else args.store
        workers = args.workers or (available_cpus() if store is not None else 1)
        try:
            config = Serving(limits=limits, threads=args.threads, grace=args.grace_seconds, drain=args.drain_seconds,
                             store=store, shared_memory=args.shared_memory, tokens=load_tokens(args.tokens),
                             tls=tls_files(args.tls_cert, args.tls_key, args.tls_client_ca),
                             metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                             log_format=args.log_format)
            serve(args.host, args.port, workers=workers, config=config)
        except (ValueError, OSError) as e:
            print(f"semigrad serve: {e}", file=sys.stderr)
            return 2
        except SupervisorGaveUp as e:
            print(f"semigrad serve: gave up: {e}", file=sys.stderr)
            return 1
    elif args.command == "plugins":
        if args.plugins_command == "check":
            return plugins_check(args.name, samples=args.samples, seed=args.seed, params=_parse_params(args.param))
        return plugins_list()
    elif args.command == "check":
        from .symbolic.commands import check

        params = _parse_params(args.param) or None
        return check(args.file, {"wrt": args.wrt, "outputs": args.outputs, "methods": args.methods,
                                 "atol": args.atol, "rtol": args.rtol, "step": args.step,
                                 "richardson": args.richardson, "semiring": args.semiring,
                                 "semiring_params": params, "localize": args.localize})
    elif args.command == "diff":
        from .symbolic.commands import diff

        at = {k: float(v) for k, v in _pairs(args.at, "--at").items()}
        return diff(args.expression, args.operands, at, _pairs(args.grad, "--grad"), args.seed, args.atol, args.rtol)
    elif args.command == "viz":
        from .inspect.command import viz

        params = _parse_params(args.param) or None
        return viz(args.file, args.output, {"semiring": args.semiring, "semiring_params": params, "wrt": args.wrt,
                                            "best_path": args.best_path})
    return 0


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"semigrad: {flag} expects NAME=VALUE, got '{item}'")
        pairs[key.strip()] = value
    return pairs


# ---------------------------------------------------------------- semigrad plugins


def plugins_list(out=None) -> int:
    """Print every entry point of the semiring group with its load status (always exits 0)."""
    out = out or sys.stdout
    registry = _quietly(SemiringRegistry)
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROPERTIES", "ERROR")]
    for r in registry.records:
        props = _properties(r.semiring) if r.semiring is not None else "-"
        rows.append((r.name, r.distribution or "-", r.version or "-", r.status, props, r.error or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1], file=out)
    if not registry.records:
        print("(no entry points in the group; is semigrad installed?)", file=out)
    return 0


def plugins_check(name: str, samples: int | None = None, seed: int = 0,
                  params: dict | None = None, out=None) -> int:
    """Run the axiom checks on the entry point(s) called `name`, law by law.

    Loads the entry point directly, so a plugin the registry rejected (e.g. for a failed
    self-check) is still checked and the failing laws are shown. Exit status: 0 when every
    law holds, 1 when some law fails or the plugin cannot be loaded, 2 for an unknown name
    or bad parameters.
    """
    out = out or sys.stdout
    eps = sorted((ep for ep in metadata.entry_points(group=GROUP) if ep.name == name), key=lambda e: e.value)
    if not eps:
        known = sorted({ep.name for ep in metadata.entry_points(group=GROUP)})
        print(f"unknown semiring '{name}'; installed: {', '.join(known) or '(none)'}", file=sys.stderr)
        return 2
    return max(_check_entry_point(ep, samples, seed, params or {}, out) for ep in eps)


def _check_entry_point(ep, samples, seed, params, out) -> int:
    dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
    print(f"semiring '{ep.name}' = {ep.value} ({dist})", file=out)
    record = _quietly(SemiringRegistry, entry_points=[ep]).records[0]
    print(f"loader status: {record.status}" + (f" ({record.error})" if record.error else ""), file=out)
    try:
        semiring = load_entry_point(ep)
    except Exception as e:
        print(f"FAIL  cannot load: {type(e).__name__}: {e}", file=out)
        return 1
    if not isinstance(semiring, Semiring):
        print(f"FAIL  {ep.value} is not a semigrad_server.semiring.Semiring", file=out)
        return 1
    if semiring.api_version != API_VERSION:
        print(f"warning: plugin API version {semiring.api_version}; this server speaks {API_VERSION}", file=out)
    if semiring.name != ep.name:
        print(f"warning: the semiring calls itself '{semiring.name}'", file=out)
    if params:
        try:
            semiring = semiring.configure(params)
        except (ValueError, TypeError) as e:
            print(f"bad parameters: {e}", file=sys.stderr)
            return 2
    samples = SAMPLES if samples is None else samples
    print(f"properties: {_properties(semiring)}; key {semiring.key}; {samples} samples, seed {seed}", file=out)
    try:
        results = law_results(semiring, seed=seed, samples=samples)
    except Exception as e:
        print(f"FAIL  the checks crashed: {type(e).__name__}: {e}", file=out)
        return 1
    for law, holds in results.items():
        print(f"{'PASS' if holds else 'FAIL'}  {law}", file=out)
    failed = sum(not holds for holds in results.values())
    print(f"{failed} of {len(results)} laws failed" if failed else f"all {len(results)} laws hold", file=out)
    return 1 if failed else 0


def _properties(semiring) -> str:
    props = [p for p in ("commutative", "idempotent", "selective") if getattr(semiring, p, False)]
    if semiring.components != 1:
        props.append(f"components={semiring.components}")
    if semiring.parameters:
        props.append("params=" + "/".join(semiring.parameters))
    return ",".join(props) or "-"


def _quietly(fn, *args, **kwargs):
    """Call fn with the plugin loader's warnings silenced (the CLI prints the errors itself)."""
    logger = logging.getLogger("semigrad.plugins")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return fn(*args, **kwargs)
    finally:
        logger.setLevel(level)


def _parse_params(items: list[str]) -> dict:
    """KEY=VALUE strings; values are read as int, then float, then kept as strings."""
    params = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"semigrad: --param expects KEY=VALUE, got '{item}'")
        for convert in (int, float, str):
            try:
                params[key] = convert(text)
                break
            except ValueError:
                continue
    return params


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
