"""The `semigrad check` and `semigrad diff` commands: cross-checks in-process (no server).

`semigrad check FILE` reads a JSON document:

    {"graph":  <semigrad.v1.Graph in the protobuf JSON mapping>,
     "inputs": {"<input>": <nested list of numbers, or a semigrad.v1.Tensor in the JSON mapping>},
     optional: "wrt": [...], "outputs": [...], "methods": [...], "atol": 1e-5, "rtol": 1e-3,
               "step": 6e-6, "richardson": false, "semiring": "real", "semiring_params": {"k": 3},
               "localize": false}

and prints the cross-check report. Exit status: 0 passed, 1 failed, 2 bad input.
"""

from __future__ import annotations

import sys
from typing import Mapping, Sequence

import numpy as np
import sympy as sp

from ..errors import SemigradError
from ..service.graph_file import BadInput, load_graph_file
from ..ir import Graph, InputSpec, Node, OpDefinition

FILE_KEYS = {"graph", "inputs", "wrt", "outputs", "methods", "atol", "rtol", "step", "richardson", "semiring",
             "semiring_params", "localize"}


def load_check_file(path: str) -> dict:
    """The request a check file describes: graph (IR), inputs (arrays) and options."""
    return load_graph_file(path, keys=FILE_KEYS, required=("graph", "inputs"), command="check")


def check(path: str, overrides: Mapping[str, object], out=None) -> int:
    """`semigrad check FILE`: 0 when the cross-check passes, 1 when it fails, 2 for bad input."""
    from ..engine import Engine
    from .crosscheck import crosscheck

    out = out or sys.stdout
    try:
        request = load_check_file(path)
        request.update({k: v for k, v in overrides.items() if v is not None})
        engine = Engine()
        cg, _ = engine.register(request.pop("graph"))
        report = crosscheck(engine, cg.id, request.pop("inputs"), **_options(request))
    except BadInput as e:
        print(f"semigrad check: {e}", file=sys.stderr)
        return 2
    except SemigradError as e:
        print(f"semigrad check: {e.status}: {e}", file=sys.stderr)
        return 2
    print(report.text, file=out)
    return 0 if report.passed else 1


def _options(request: dict) -> dict:
    options = {}
    for key in ("wrt", "outputs", "methods"):
        if key in request:
            value = request[key]
            options[key] = [value] if isinstance(value, str) else list(value)
    for key in ("atol", "rtol", "step"):
        if key in request:
            options[key] = float(request[key])
    for key in ("richardson", "localize"):
        if key in request:
            options[key] = bool(request[key])
    if "semiring" in request:
        options["semiring"] = str(request["semiring"])
    if "semiring_params" in request:
        if not isinstance(request["semiring_params"], dict):
            raise BadInput("\"semiring_params\" must be an object")
        options["semiring_params"] = dict(request["semiring_params"])
    return options


def diff(expression: str, operands: Sequence[str], at: Mapping[str, float], grads: Mapping[str, str], seed: int,
         atol: float, rtol: float, out=None) -> int:
    """`semigrad diff EXPR X Y ...`: the partials as formulas, and a numeric check at one point
    (symbolic vs the server's reverse mode vs central differences)."""
    from ..engine import Engine
    from .compare import within
    from .custom import without_dirac
    from .numeric import lambdify
    from .parse import operand_symbols, parse_expression

    out = out or sys.stdout
    try:
        unknown = sorted((set(at) | set(grads)) - set(operands))
        if unknown:
            raise BadInput(f"'{unknown[0]}' is not one of the operands ({', '.join(operands)})")
        symbols = operand_symbols(operands)
        expr = parse_expression(expression, operands)
        partials = [without_dirac(sp.diff(expr, s)) for s in symbols]
        engine = Engine()
        definition = OpDefinition("diffed", tuple(operands), expression, tuple(sorted(grads.items())))
        graph = Graph(tuple(InputSpec(name, ()) for name in operands), (Node("f", "diffed", tuple(operands)),),
                      (("f", "f"),), (definition,))
        cg, _ = engine.register(graph)
    except BadInput as e:
        print(f"semigrad diff: {e}", file=sys.stderr)
        return 2
    except SemigradError as e:
        print(f"semigrad diff: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(seed)
    point = {name: np.float64(at[name]) if name in at else np.float64(rng.uniform(0.5, 2.0)) for name in operands}
    print(f"f({', '.join(operands)}) = {expr}", file=out)
    for name, partial in zip(operands, partials):
        print(f"d f / d {name} = {partial}", file=out)
        if name in grads:
            print(f"    (given: {grads[name]})", file=out)
    print("", file=out)
    print("at " + ", ".join(f"{k} = {float(v):.6g}" for k, v in point.items()) + ":", file=out)
    args = [point[name] for name in operands]
    with np.errstate(all="ignore"):
        symbolic = [float(np.asarray(lambdify(symbols, p)(*args), dtype=np.float64)) for p in partials]
        reverse = engine.gradient(cg.id, point).gradients
        f = lambdify(symbols, expr)
        finite = []
        for k, name in enumerate(operands):
            h = 6e-6 * max(1.0, abs(float(point[name])))
            plus, minus = list(args), list(args)
            plus[k] = plus[k] + h
            minus[k] = minus[k] - h
            finite.append(float((f(*plus) - f(*minus)) / (2 * h)))
    failed = False
    print(f"  {'operand':<10} {'symbolic':>14} {'reverse':>14} {'finite diff':>14}", file=out)
    for k, name in enumerate(operands):
        rev = float(reverse[name])
        ok = all(bool(within(a, b, atol, rtol)[0]) for a, b in ((rev, symbolic[k]), (symbolic[k], finite[k])))
        failed |= not ok
        print(f"  {name:<10} {symbolic[k]:>14.8g} {rev:>14.8g} {finite[k]:>14.8g}  {'ok' if ok else 'MISMATCH'}",
              file=out)
    print("", file=out)
    print("MISMATCH: the derivatives disagree" if failed else "all derivatives agree", file=out)
    return 1 if failed else 0
