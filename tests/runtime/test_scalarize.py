"""The scalar program's emission-time rewrites: exact in IEEE arithmetic, so results are the same
bits as without them, and they leave fewer instructions (negations folded into add/sub)."""

from __future__ import annotations

import numpy as np
import pytest
from semigrad_server.ops import REGISTRY
from semigrad_server.runtime.scalarize import Scalarizer


def _run(sc: Scalarizer, var: int, env: dict[int, float]) -> float:
    ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "neg": np.negative}
    values = {v: np.float64(c) for v, c in sc.p.consts.items()} | {k: np.float64(x) for k, x in env.items()}
    for out, op, args in sc.p.instrs:
        values[out] = ops[op](*(values[a] for a in args))
    return values[var]


def _negations_into_adds(sc: Scalarizer) -> int:
    negs = {out for out, op, _ in sc.p.instrs if op == "neg"}
    return sum(1 for _, op, args in sc.p.instrs if op in ("add", "sub") and any(a in negs for a in args))


BUILDERS = {
    "x + (-y)": lambda sc, x, y: sc.emit("add", (x, sc.emit("neg", (y,)))),
    "(-x) + y": lambda sc, x, y: sc.emit("add", (sc.emit("neg", (x,)), y)),
    "x - (-y)": lambda sc, x, y: sc.emit("sub", (x, sc.emit("neg", (y,)))),
    "(-x)(-y)": lambda sc, x, y: sc.emit("mul", (sc.emit("neg", (x,)), sc.emit("neg", (y,)))),
    "x + (-x)·y": lambda sc, x, y: sc.emit("add", (x, sc.emit("mul", (sc.emit("neg", (x,)), y)))),
    "x - y/(-x)": lambda sc, x, y: sc.emit("sub", (x, sc.emit("div", (y, sc.emit("neg", (x,)))))),
    "x·(-1) + y": lambda sc, x, y: sc.emit("add", (sc.emit("mul", (x, sc.const(-1.0))), y)),
    "y + x/(-1)": lambda sc, x, y: sc.emit("add", (y, sc.emit("div", (x, sc.const(-1.0))))),
}
EDGES = [0.0, -0.0, 1.0, -1.5, 3e-310, 1e308, np.inf, -np.inf]


@pytest.mark.parametrize("name", BUILDERS)
def test_negations_fold_into_adds_without_changing_a_bit(name, rng):
    plain = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
             "div": lambda a, b: a / b, "neg": lambda a: -a}
    for x, y in [*zip(rng.normal(size=50), rng.normal(size=50)), *((a, b) for a in EDGES for b in EDGES)]:
        sc = Scalarizer(REGISTRY)
        vx, vy = sc.new_variable(), sc.new_variable()
        out = BUILDERS[name](sc, vx, vy)
        assert _negations_into_adds(sc) == 0
        want = _reference(name, np.float64(x), np.float64(y), plain)
        with np.errstate(all="ignore"):
            got = _run(sc, out, {vx: x, vy: y})
        assert np.array_equal(got, want, equal_nan=True) and np.signbit(got) == np.signbit(want) or np.isnan(want), \
            (name, x, y, got, want)


def _reference(name: str, x, y, f) -> np.float64:
    """The expression as written, evaluated without any rewriting."""
    with np.errstate(all="ignore"):
        return {
            "x + (-y)": lambda: f["add"](x, f["neg"](y)),
            "(-x) + y": lambda: f["add"](f["neg"](x), y),
            "x - (-y)": lambda: f["sub"](x, f["neg"](y)),
            "(-x)(-y)": lambda: f["mul"](f["neg"](x), f["neg"](y)),
            "x + (-x)·y": lambda: f["add"](x, f["mul"](f["neg"](x), y)),
            "x - y/(-x)": lambda: f["sub"](x, f["div"](y, f["neg"](x))),
            "x·(-1) + y": lambda: f["add"](f["mul"](x, np.float64(-1.0)), y),
            "y + x/(-1)": lambda: f["add"](y, f["div"](x, np.float64(-1.0))),
        }[name]()
