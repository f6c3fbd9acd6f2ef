"""Command line: `semigrad serve ...`, `semigrad plugins [check NAME]`."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .limits import Limits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50051


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semigrad", description="Differentiate computation graphs over gRPC.")
    parser.add_argument("--version", action="version", version=f"semigrad {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    serve.add_argument("--threads", type=int, default=8, help="request threads (default 8)")
    serve.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    defaults = Limits()
    for name in Limits.names():
        value = getattr(defaults, name)
        serve.add_argument("--" + name.replace("_", "-"), type=type(value), default=value,
                           help=f"limit (default {value})")

    plugins = commands.add_parser("plugins", help="list the semiring plugins (entry point group semigrad.semirings)")
    plugin_commands = plugins.add_subparsers(dest="plugins_command")
    check = plugin_commands.add_parser("check", help="check a semiring's axioms, law by law")
    check.add_argument("name", help="the semiring's entry point name")
    check.add_argument("--samples", type=int, default=None, help="random samples per law (default: the checker's)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="semiring parameter, e.g. k=5 for kbest (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
        from .service import serve

        limits = Limits(**{name: getattr(args, name) for name in Limits.names()})
        serve(args.host, args.port, limits=limits, threads=args.threads)
    elif args.command == "plugins":
        from . import plugins_cli

        if args.plugins_command == "check":
            params = plugins_cli.parse_params(args.param)
            return plugins_cli.check(args.name, samples=args.samples, seed=args.seed, params=params)
        return plugins_cli.list_plugins()
    return 0


if __name__ == "__main__":
    sys.exit(main())
