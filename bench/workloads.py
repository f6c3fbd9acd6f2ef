"""The benchmark workloads, each defined once: a generic function, its semigrad graph, references.

Importable from the bench scripts (`import workloads`: scripts run as `python bench/X.py`, so
bench/ is on sys.path) and from anywhere else once bench/ is on sys.path. Only depends on the
client package `semigrad` and NumPy. The test suite imports these too (pytest puts bench/ on its
path).

Every workload is ONE Python function `fn(ops, **inputs)` of one batch item that returns a
scalar. It only uses `+ - *`, `@`, integer indexing `a[i, j]`, Python floats, `ops.tanh` and
`ops.sum(x, axis)`, so the same code runs on:

  * semigrad Handles (building the graph the service differentiates: `Workload.graph`),
  * NumPy arrays (the forward reference), PyTorch tensors and JAX arrays (peers),
  * NumPy object arrays of SymPy / SymEngine / CasADi SX symbols (the symbolic peers).

Each workload also has a reference gradient that does not differentiate `fn` by reverse mode:
closed forms (det(A)·A^{-T}, the derivative polynomial, hand-written MLP backprop) or, for the
ODE, the complex-step derivative of the NumPy forward (exact to rounding).

Batches: `sample(rng, batch)` returns inputs whose *batched* names carry a leading batch axis;
`shared` names (the MLP weights) carry none and are the same for every item. `layout` says how
`fn` runs on a whole batch without vmap (eager PyTorch, SymPy's lambdified NumPy code):
"last" = move the batch axis of each batched input to the end (then `a[i, j]` picks a vector
of all items and every op is elementwise), "first" = leave it in front (`fn` broadcasts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import numpy as np
import semigrad

# ---------------------------------------------------------------------------- op namespaces
NUMPY_OPS = SimpleNamespace(tanh=np.tanh, sum=lambda x, axis=None: np.sum(x, axis=axis))
SEMIGRAD_OPS = SimpleNamespace(tanh=semigrad.tanh, sum=lambda x, axis=None: semigrad.sum(x, axis))


# ---------------------------------------------------------------------------- det by minors
def det_by_minors(g, a, n: int, memoise: bool = False):
    """Determinant by expansion along the first row (CppAD's det_minor), with scalar indexing,
    written as users write it (and as the README does): plain recursion, each sub-minor
    recomputed wherever it occurs. `memoise=True` shares sub-minors by hand instead (a labelled
    extra row: semigrad must give both the same program).

    `g` is unused (kept for callers that pass the graph); `a` is anything indexable as a[i, j]:
    a semigrad Handle, an array (batch axes last), a NumPy object array of symbols.
    """
    memo = {}

    def det(rows: tuple, cols: tuple):
        if memoise and (rows, cols) in memo:
            return memo[rows, cols]
        if len(rows) == 1:
            value = a[rows[0], cols[0]]
        else:
            value = None
            for k, c in enumerate(cols):
                term = a[rows[0], c] * det(rows[1:], cols[:k] + cols[k + 1:])
                value = term if value is None else (value + term if k % 2 == 0 else value - term)
        if memoise:
            memo[rows, cols] = value
        return value

    return det(tuple(range(n)), tuple(range(n)))


def det_graph(n: int) -> semigrad.Graph:
    """Graph with one input "A" of shape (n, n) and one output "det"."""
    g = semigrad.Graph()
    g.output("det", det_by_minors(g, g.input("A", (n, n)), n))
    return g


def det_gradient(a: np.ndarray) -> np.ndarray:
    """∂det(A)/∂A = det(A) A^{-T}, batched over leading axes (np.linalg.det / np.linalg.inv)."""
    return np.linalg.det(a)[..., None, None] * np.swapaxes(np.linalg.inv(a), -1, -2)


# ---------------------------------------------------------------------------- poly
#: p(z) = Σ_k (-1)^k z^k / (k + 1), k = 0..20 (the degree-20 Taylor polynomial of log(1+z)/z);
#: POLY_COEFFS[k] multiplies z^k.
POLY_COEFFS = tuple((-1.0) ** k / (k + 1) for k in range(21))


def horner(ops, z):
    """Degree-20 polynomial in z by Horner's rule (20 multiply-adds)."""
    p = POLY_COEFFS[-1]
    for c in POLY_COEFFS[-2::-1]:
        p = p * z + c
    return p


def _poly_gradient(inputs: dict) -> dict:
    return {"z": np.polyval(np.polyder(np.array(POLY_COEFFS[::-1])), inputs["z"])}


def _poly_sample(rng: np.random.Generator, batch: int | None) -> dict:
    return {"z": rng.uniform(-0.9, 0.9, () if batch is None else (batch,))}


# ---------------------------------------------------------------------------- ode
LV_NOMINAL = (1.1, 0.4, 0.1, 0.4)  # alpha, beta, delta, gamma
LV_STATE0 = (10.0, 5.0)  # prey, predator at t = 0
LV_STEP, LV_STEPS = 0.1, 10


def lv_split(ops, p):
    """(parameters, initial state) of the Lotka–Volterra problem: the loop's constants and carry."""
    return (p[0], p[1], p[2], p[3]), LV_STATE0


def lv_rk4_step(params, state):
    """One classical RK4 step (h = 0.1) of x' = αx − βxy, y' = δxy − γy."""
    alpha, beta, delta, gamma = params

    def rhs(x, y):
        xy = x * y
        return alpha * x - beta * xy, delta * xy - gamma * y

    h = LV_STEP
    x, y = state
    k1x, k1y = rhs(x, y)
    k2x, k2y = rhs(x + (h / 2) * k1x, y + (h / 2) * k1y)
    k3x, k3y = rhs(x + (h / 2) * k2x, y + (h / 2) * k2y)
    k4x, k4y = rhs(x + h * k3x, y + h * k3y)
    return (x + (h / 6) * (k1x + 2.0 * k2x + 2.0 * k3x + k4x),
            y + (h / 6) * (k1y + 2.0 * k2y + 2.0 * k3y + k4y))


def lv_finish(params, state):
    return state[0] + state[1]


def lotka_volterra_rk4(ops, p):
    """Prey + predator after 10 classical RK4 steps (h = 0.1) of Lotka–Volterra, p = (α, β, δ, γ).

    x' = αx − βxy,  y' = δxy − γy,  (x, y)(0) = (10, 5). The Python loop unrolls: every
    implementation sees the same straight-line program (Workload.loop gives the loop structure to
    peers that must not unroll, see peers.py's JAX).
    """
    params, state = lv_split(ops, p)
    for _ in range(LV_STEPS):
        state = lv_rk4_step(params, state)
    return lv_finish(params, state)


def _ode_gradient(inputs: dict) -> dict:
    """Complex-step derivative of the NumPy forward: Im f(p + i·h·e_k) / h, exact to rounding."""
    p = np.moveaxis(np.asarray(inputs["p"], dtype=float), -1, 0)  # (4, ...batch)
    step = 1e-30
    cols = []
    for k in range(4):
        q = p.astype(complex)
        q[k] += 1j * step
        cols.append(np.imag(lotka_volterra_rk4(NUMPY_OPS, q)) / step)
    return {"p": np.stack(cols, axis=-1)}


def _ode_sample(rng: np.random.Generator, batch: int | None) -> dict:
    shape = (4,) if batch is None else (batch, 4)
    return {"p": np.array(LV_NOMINAL) * rng.uniform(0.9, 1.1, shape)}


# ---------------------------------------------------------------------------- mlp
MLP_IN, MLP_HIDDEN, MLP_ROWS = 32, 64, 64


def mlp_loss(ops, x, y, W1, b1, W2, b2):
    """Squared error of a tanh MLP: Σ (tanh(x W1 + b1) W2 + b2 − y)², x (m, 32), hidden 64, 1 output."""
    h = ops.tanh(x @ W1 + b1)
    r = h @ W2 + b2 - y
    return ops.sum(r * r, axis=(-2, -1))


def _mlp_gradient(inputs: dict) -> dict:
    """Hand-written backprop, batched over the leading axes of any input (weights may be shared)."""
    x, y, W1, b1, W2, b2 = (np.asarray(inputs[k]) for k in ("x", "y", "W1", "b1", "W2", "b2"))
    T = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    h = np.tanh(x @ W1 + b1)
    d = 2.0 * (h @ W2 + b2 - y)  # ∂L/∂out, (..., m, 1)
    dz = (d @ T(W2)) * (1.0 - h * h)  # ∂L/∂(x W1 + b1), (..., m, 64)
    return {"W1": T(x) @ dz, "b1": dz.sum(-2), "W2": T(h) @ d, "b2": d.sum(-2)}


def _mlp_sample(rows: int):
    def sample(rng: np.random.Generator, batch: int | None) -> dict:
        lead = () if batch is None else (batch,)
        return {
            "x": rng.standard_normal(lead + (rows, MLP_IN)),
            "y": rng.standard_normal(lead + (rows, 1)),
            "W1": rng.standard_normal((MLP_IN, MLP_HIDDEN)) / np.sqrt(MLP_IN),
            "b1": 0.1 * rng.standard_normal((MLP_HIDDEN,)),
            "W2": rng.standard_normal((MLP_HIDDEN, 1)) / np.sqrt(MLP_HIDDEN),
            "b2": 0.1 * rng.standard_normal((1,)),
        }

    return sample


# ---------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Problem:
    """One gradient problem: item shapes of the inputs, and how to sample them."""

    shapes: dict[str, tuple[int, ...]]  # per-item shape of every input, in graph input order
    sample: Callable[[np.random.Generator, int | None], dict]
    shared: tuple[str, ...] = ()  # inputs with no batch axis in a batch (same for every item)


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    fn: Callable  # fn(ops, **inputs) -> scalar, for one batch item
    wrt: tuple[str, ...]
    single: Problem  # the single-point problem (latency)
    batched: Problem  # the problem whose items make up a batch (throughput)
    reference_gradient: Callable[[dict], dict]  # inputs (batched or not) -> {wrt name: gradient}
    layout: str = "last"  # "last" or "first": see the module docstring
    output: str = "f"
    note: str = ""
    tags: tuple[str, ...] = field(default=())
    # fn as a loop, for peers that must not unroll it: (split(ops, **inputs) -> (consts, carry),
    # step(consts, carry) -> carry, number of steps, finish(consts, carry) -> scalar); fn must equal
    # finish(consts, step applied `steps` times to carry)
    loop: tuple | None = None

    def graph(self, problem: Problem) -> semigrad.Graph:
        """The semigrad graph of `fn` for `problem`'s shapes (built with the client API)."""
        g = semigrad.Graph()
        handles = {name: g.input(name, shape) for name, shape in problem.shapes.items()}
        g.output(self.output, self.fn(SEMIGRAD_OPS, **handles))
        return g

    def batched_names(self, problem: Problem) -> list[str]:
        return [k for k in problem.shapes if k not in problem.shared]

    def to_layout(self, problem: Problem, inputs: dict, moveaxis=np.moveaxis) -> dict:
        """Batch-first inputs rearranged for running `fn` on a whole batch at once (`layout`)."""
        if self.layout == "first":
            return dict(inputs)
        return {k: (moveaxis(v, 0, -1) if k not in problem.shared else v) for k, v in inputs.items()}

    def reference_value(self, problem: Problem, inputs: dict, batched: bool) -> np.ndarray:
        """fn evaluated with NumPy (one item, or a batch: one value per item)."""
        args = self.to_layout(problem, inputs) if batched else inputs
        return np.asarray(self.fn(NUMPY_OPS, **args), dtype=float)


def det_workload(n: int, memoise: bool = False) -> Workload:
    problem = Problem({"A": (n, n)}, lambda rng, b: {"A": rng.standard_normal((n, n) if b is None else (b, n, n))})
    how = ("with sub-minors shared by hand (an extra row: the recursive row is what users write)" if memoise
           else "written as plain recursion, sub-minors recomputed (as the README and CppAD's det_by_minor write it)")
    return Workload(
        name=f"det{n}" + ("-memo" if memoise else ""), title=f"det by minors, n={n}" + (", memoised" if memoise else ""),
        fn=lambda ops, A: det_by_minors(None, A, n, memoise), wrt=("A",), single=problem, batched=problem,
        reference_gradient=lambda inputs: {"A": det_gradient(inputs["A"])}, output="det",
        note=f"gradient of det(A) w.r.t. A ({n}×{n}, entries N(0,1)) by expansion along the first row {how}; "
             f"reference det(A)·A^-T",
        tags=("det",))


POLY = Workload(
    name="poly", title="poly, degree-20 Horner",
    fn=horner, wrt=("z",),
    single=Problem({"z": ()}, _poly_sample), batched=Problem({"z": ()}, _poly_sample),
    reference_gradient=_poly_gradient,
    note="p(z) = Σ_{k≤20} (-1)^k z^k/(k+1) by Horner's rule, derivative in z ∈ U(-0.9, 0.9); "
         "reference: the derivative polynomial (np.polyder)")

ODE = Workload(
    name="ode", title="ode, 10 RK4 steps of Lotka–Volterra",
    fn=lotka_volterra_rk4, wrt=("p",),
    single=Problem({"p": (4,)}, _ode_sample), batched=Problem({"p": (4,)}, _ode_sample),
    reference_gradient=_ode_gradient, loop=(lv_split, lv_rk4_step, LV_STEPS, lv_finish),
    note="x+y after 10 RK4 steps (h=0.1) of x'=αx−βxy, y'=δxy−γy from (10, 5); gradient w.r.t. "
         "p=(α,β,δ,γ), each ±10% around (1.1, 0.4, 0.1, 0.4); reference: complex-step derivative")

_MLP_SHAPES = {"W1": (MLP_IN, MLP_HIDDEN), "b1": (MLP_HIDDEN,), "W2": (MLP_HIDDEN, 1), "b2": (1,)}
MLP = Workload(
    name="mlp", title="mlp, tanh 32→64→1, squared loss",
    fn=mlp_loss, wrt=("W1", "b1", "W2", "b2"),
    single=Problem({"x": (MLP_ROWS, MLP_IN), "y": (MLP_ROWS, 1), **_MLP_SHAPES}, _mlp_sample(MLP_ROWS)),
    batched=Problem({"x": (1, MLP_IN), "y": (1, 1), **_MLP_SHAPES}, _mlp_sample(1),
                    shared=tuple(_MLP_SHAPES)),
    reference_gradient=_mlp_gradient, layout="first",
    note="loss Σ(tanh(x W1 + b1) W2 + b2 − y)², gradient w.r.t. W1 (32×64), b1, W2 (64×1), b2 (2,177 "
         "numbers). Single point: one 64×32 data matrix x. Batched: PER-SAMPLE gradients of 10,000 "
         "samples x_i (1×32), y_i with the weights shared (vmap over samples; the result is 10,000 × "
         "2,177 numbers). Reference: hand-written backprop")

DET_SIZES = (4, 5, 6, 7)


def all_workloads(det_sizes=DET_SIZES) -> list[Workload]:
    extra = [det_workload(6, memoise=True)] if 6 in det_sizes else []
    return [*(det_workload(n) for n in det_sizes), *extra, POLY, MLP, ODE]
