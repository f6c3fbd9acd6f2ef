"""The peers the suite runs semigrad against, each adapted to every workload of workloads.py.

A peer is set up once per workload (`Peer.setup(workload, single_inputs, batch_inputs)`):
that builds, differentiates and compiles whatever it needs (timed as "setup") and returns a
`Prepared` with three zero-argument calls on inputs already converted to the peer's own types:

  * `single()`: the gradient at the single point (workload.single),
  * `batch()`: per-item gradients of the whole batch (workload.batched, leading batch axis),
  * `forward()`: per-item values of the whole batch (for the gradient/forward cost ratio),

each returning the peer's native result, fully computed (JAX results are blocked on; nothing is
left lazy), plus converters to NumPy used by the correctness check only (never timed).

A peer that is not installed, or that cannot do a workload within reason (a symbolic tool on a
scalarised 270,000-operation expression, gcc on a 15 MB C file), raises `Skip` with the reason,
and the table shows it. Anything else it raises is an error of that row.

Peers (the `key` selects them with suite.py --impl):

  torch      PyTorch eager: autograd.grad at one point; the batch vectorised by hand (batch axis
             last for scalar-indexing workloads; for the per-sample MLP the shared weights are
             tiled per sample as leaves, which is how eager PyTorch gets per-sample gradients)
  torchfunc  torch.func: grad at one point, vmap(grad) over the batch, vmap(f) forward
  jax        JAX (x64): jit(grad) at one point, jit(vmap(grad)) over the batch, jit(vmap(f))
  casadi     CasADi SX: Function(gradient(f, wrt)) at one point, Function.map(B) (serial) batched
  casadi_c   CasADi SX function → C (CodeGenerator) → gcc -O2 -shared → casadi.external, .map(B)
  sympy      SymPy: diff of the expression w.r.t. every scalar input, lambdify(modules="numpy",
             cse=True); the batch runs the lambdified NumPy code on columns (one call)
  symengine  SymEngine: diff, Lambdify(backend="llvm" when available, cse=True); batch = one
             call on a (B, inputs) array (shared inputs tiled)
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from types import SimpleNamespace
from typing import Callable

import numpy as np

from workloads import Problem, Workload

# Symbolic tools: beyond these sizes setup takes minutes (measured on this kind of machine), so
# the row is skipped with the size in the note rather than attempted.
SYMPY_MAX_TREE_WORK = 3e6  # expression-tree nodes × scalar derivatives (det n=7: 1.3e6, ~15 s)
SYMENGINE_MAX_DAG_WORK = 1e8  # scalar operations × scalar derivatives (MLP per-sample: 9e6, ~3 s)
CASADI_C_MAX_INSTRUCTIONS = 150_000  # gcc -O2 on the 570k-instruction MLP function: ~3 min
# JAX unrolls Python recursion: det by minors n=7 written recursively traces to 41,096 primitive
# operations (103,398 in its gradient: 95 s to trace the gradient alone on a loaded 2-core machine,
# and jit(vmap(grad))'s first call had not finished after 14 min); n=6, 5,867: first call 24-120 s
# (this row compiles three functions), then 1.2 s per 10,000 items.
JAX_MAX_EQUATIONS = 10_000  # primitive operations in the traced forward function (jaxpr equations)
SETUP_TIMEOUT = 180.0  # seconds: a symbolic setup still running then is abandoned (Skip)


THREADS = 0  # set by suite.py: PyTorch gets torch.set_num_threads(THREADS) when > 0


def _torch():
    import torch

    if THREADS > 0 and torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)
    return torch


class Skip(Exception):
    """This peer does not run this workload (not installed, or too large for it): the reason."""


@dataclass
class Prepared:
    single: Callable[[], object] | None  # None: this part is skipped (a note says why)
    batch: Callable[[], object] | None
    forward: Callable[[], object] | None
    single_grads: Callable[[object], dict]  # native result of single() -> {wrt: array of item shape}
    batch_grads: Callable[[object], dict]  # native result of batch() -> {wrt: (B, *item shape)}
    values: Callable[[object], np.ndarray]  # native result of forward() -> (B,)
    notes: list[str] = field(default_factory=list)


@dataclass
class Peer:
    key: str
    label: str
    modules: tuple[str, ...]  # import names that must be importable
    dists: tuple[str, ...]  # distributions whose versions the report lists
    setup: Callable[[Workload, dict, dict], Prepared]
    memory: str  # "tracemalloc" (Python/NumPy allocations) or "rss" (RSS peak − RSS before)

    def availability(self) -> str | None:
        """None if usable, else why not."""
        import importlib

        for m in self.modules:
            try:
                importlib.import_module(m)
            except Exception as e:  # ImportError, or a broken install
                return f"not installed ({m}: {type(e).__name__}: {e})".replace("\n", " ")[:200]
        return None

    def versions(self) -> str:
        out = []
        for d in self.dists:
            try:
                out.append(f"{d} {metadata.version(d)}")
            except metadata.PackageNotFoundError:
                out.append(f"{d} not installed")
        return ", ".join(out)


# ------------------------------------------------------------------------------------ helpers
def batch_size(problem: Problem, batch: dict) -> int:
    name = next(k for k in problem.shapes if k not in problem.shared)
    return batch[name].shape[0]


def split_flat(flat: np.ndarray, shapes: dict[str, tuple], names) -> dict:
    """(..., N) flat rows -> {name: (..., *shape)} in `names` order."""
    out, at = {}, 0
    lead = flat.shape[:-1]
    for k in names:
        n = int(np.prod(shapes[k], dtype=np.int64))
        out[k] = flat[..., at:at + n].reshape(lead + tuple(shapes[k]))
        at += n
    return out


def object_array(elements: list, shape: tuple) -> np.ndarray:
    """A NumPy object array of `shape` holding `elements` (C order); a 0-d shape gives the element."""
    if shape == ():
        return elements[0]
    a = np.empty(len(elements), dtype=object)
    a[:] = elements
    return a.reshape(shape)


def as_scalar(value):
    """fn of object arrays may return a 0-d object array: its element."""
    return value.item() if isinstance(value, np.ndarray) and value.shape == () else value


class _Counter:
    """Traces fn once: `tree` = size of the expression *tree* (what tree-based symbolic tools walk);
    the class counts every operation = size of the DAG (scalar operations)."""

    ops = 0
    __slots__ = ("tree",)

    def __init__(self, tree: float):
        self.tree = tree

    def _op(self, other=None):
        _Counter.ops += 1
        return _Counter(1 + self.tree + (other.tree if isinstance(other, _Counter) else 1))

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _op

    def __neg__(self):
        return self._op()


def expression_size(w: Workload, problem: Problem) -> tuple[float, int]:
    """(expression tree size, scalar operation count) of fn on `problem`'s shapes."""
    _Counter.ops = 0
    ops = SimpleNamespace(tanh=np.frompyfunc(lambda t: t._op(), 1, 1), sum=lambda x, axis=None: np.sum(x, axis=axis))
    arrays = {k: object_array([_Counter(1.0) for _ in range(int(np.prod(s, dtype=np.int64)))], s)
              for k, s in problem.shapes.items()}
    f = as_scalar(w.fn(ops, **arrays))
    return float(f.tree), _Counter.ops


def n_wrt(w: Workload, problem: Problem) -> int:
    return sum(int(np.prod(problem.shapes[k], dtype=np.int64)) for k in w.wrt)


@contextmanager
def time_limit(seconds: float, what: str):
    """Raise Skip if the body runs longer than `seconds` (SIGALRM; main thread, Python code)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(*_):
        raise Skip(f"{what} did not finish in {seconds:.0f} s; abandoned")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _same_problem(w: Workload) -> bool:
    return w.single.shapes == w.batched.shapes and not w.batched.shared


def build_both(w: Workload, build: Callable[[Problem], tuple]) -> tuple[tuple | None, tuple | None, list[str]]:
    """build(problem) for the single and the batched problem (once if they are the same); a Skip of
    one of them leaves it None with a note, a Skip of both is raised."""
    built, notes = {}, []
    for part, problem in (("single point", w.single), ("batch", w.batched)):
        if part == "batch" and _same_problem(w):
            built[part] = built["single point"]
            if built[part] is None:
                raise Skip(notes[0].split(": ", 1)[1])
            continue
        try:
            built[part] = build(problem)
        except Skip as e:
            built[part] = None
            notes.append(f"{part} skipped: {e}")
    if built["single point"] is None and built["batch"] is None:
        raise Skip("; ".join(notes))
    return built["single point"], built["batch"], notes


# ------------------------------------------------------------------------------------ PyTorch
def _torch_ops():
    torch = _torch()

    return SimpleNamespace(tanh=torch.tanh, sum=lambda x, axis=None: torch.sum(x, dim=axis))


def tile_shared(value: np.ndarray, batch: int) -> np.ndarray:
    """A shared input as one copy per batch item for layout "first": promoted to a row matrix
    (b (64,) -> (1, 64)) so that it still broadcasts against each item's (m, 64) values, then
    given a leading batch axis."""
    v = value.reshape((1,) * max(0, 2 - value.ndim) + value.shape)
    return np.ascontiguousarray(np.broadcast_to(v, (batch,) + v.shape))


def setup_torch_eager(w: Workload, single: dict, batch: dict) -> Prepared:
    torch = _torch()

    ops, wrt, prob = _torch_ops(), list(w.wrt), w.batched
    B = batch_size(prob, batch)
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt) for k, v in single.items()}
    single_wrt = [leaves[k] for k in wrt]

    def one():
        return torch.autograd.grad(w.fn(ops, **leaves), single_wrt)

    args, fwd_args = {}, {}
    for k, v in batch.items():
        if k in prob.shared:
            fwd_args[k] = torch.from_numpy(np.ascontiguousarray(v))
            args[k] = (torch.from_numpy(tile_shared(v, B)).requires_grad_() if k in wrt else fwd_args[k])
        else:
            arr = np.ascontiguousarray(np.moveaxis(v, 0, -1) if w.layout == "last" else v)
            fwd_args[k] = torch.from_numpy(arr)
            args[k] = torch.from_numpy(arr.copy()).requires_grad_(k in wrt)
    batch_wrt = [args[k] for k in wrt]

    def many():
        return torch.autograd.grad(w.fn(ops, **args).sum(), batch_wrt)

    def forward():
        with torch.no_grad():
            return w.fn(ops, **fwd_args)

    def batch_grads(res):
        out = {}
        for k, g in zip(wrt, res):
            g = g.detach().numpy()
            if k in prob.shared:
                out[k] = g.reshape((B,) + prob.shapes[k])
            else:
                out[k] = np.moveaxis(g, -1, 0) if w.layout == "last" else g
        return out

    notes = [] if not any(k in prob.shared for k in wrt) else [
        "batched: shared weights tiled per sample as leaves (eager per-sample gradients)"]
    return Prepared(one, many, forward,
                    lambda res: {k: g.detach().numpy() for k, g in zip(wrt, res)}, batch_grads,
                    lambda res: res.numpy(), notes)


def setup_torch_func(w: Workload, single: dict, batch: dict) -> Prepared:
    torch = _torch()
    from torch.func import grad, vmap

    ops = _torch_ops()
    names = list(w.single.shapes)
    argnums = tuple(names.index(k) for k in w.wrt)

    def f(*a):
        return w.fn(ops, **dict(zip(names, a)))

    g1 = grad(f, argnums=argnums)
    s_args = [torch.from_numpy(np.array(single[k], dtype=np.float64)) for k in names]
    prob = w.batched
    b_names = list(prob.shapes)
    assert b_names == names
    in_dims = tuple(None if k in prob.shared else 0 for k in b_names)
    gb = vmap(grad(f, argnums=argnums), in_dims=in_dims)
    fb = vmap(f, in_dims=in_dims)
    b_args = [torch.from_numpy(np.array(batch[k], dtype=np.float64)) for k in b_names]
    to_np = lambda res: {k: g.numpy() for k, g in zip(w.wrt, res)}  # noqa: E731
    return Prepared(lambda: g1(*s_args), lambda: gb(*b_args), lambda: fb(*b_args), to_np, to_np,
                    lambda res: res.numpy())


# ------------------------------------------------------------------------------------ JAX
def jax_function(w: Workload):
    """(jax, f, names, argnums, notes): the workload as a JAX function of its inputs in graph input
    order (x64 enabled), the positions of the differentiated ones, and notes on how it is written.
    Also used by first_call.py, so that its first call compiles the function this row times."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    ops = SimpleNamespace(tanh=jnp.tanh, sum=lambda x, axis=None: jnp.sum(x, axis=axis))
    names = list(w.single.shapes)
    argnums = tuple(names.index(k) for k in w.wrt)
    notes = []

    def f(*a):
        return w.fn(ops, **dict(zip(names, a)))

    if w.loop is not None:  # an unrolled loop's XLA:CPU run time grows exponentially with its length
        split, step, steps, finish = w.loop

        def f(*a):  # noqa: F811
            consts, carry = split(ops, **dict(zip(names, a)))
            carry = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype=jnp.float64), carry)
            return finish(consts, jax.lax.fori_loop(0, steps, lambda i, c: step(consts, c), carry))

        notes.append(f"the {steps} steps as lax.fori_loop (unrolled, XLA:CPU's run time grows exponentially "
                     "with the step count: 4 steps 10 ms, 6 steps > 60 s per call)")
    return jax, f, names, argnums, notes


def jax_batched_gradient(w: Workload):
    """(jax, jit(vmap(grad(f))), input names): per-item gradients of a batch (shared inputs unbatched)."""
    jax, f, names, argnums, _ = jax_function(w)
    in_axes = tuple(None if k in w.batched.shared else 0 for k in names)
    return jax, jax.jit(jax.vmap(jax.grad(f, argnums=argnums), in_axes=in_axes)), names


def setup_jax(w: Workload, single: dict, batch: dict) -> Prepared:
    jax, f, names, argnums, notes = jax_function(w)
    if w.loop is None:
        eqns = len(jax.make_jaxpr(f)(*[single[k] for k in names]).jaxpr.eqns)
        if eqns > JAX_MAX_EQUATIONS:
            raise Skip(f"f traces to {eqns:,} primitive operations (limit {JAX_MAX_EQUATIONS:,}): XLA's compiles "
                       "of its unrolled gradient take many minutes (see the first-call section)")
        notes.append(f"f traces to {eqns:,} primitive operations")
    prob = w.batched
    in_axes = tuple(None if k in prob.shared else 0 for k in names)
    g1 = jax.jit(jax.grad(f, argnums=argnums))
    gb = jax.jit(jax.vmap(jax.grad(f, argnums=argnums), in_axes=in_axes))
    fb = jax.jit(jax.vmap(f, in_axes=in_axes))
    s_args = [jax.device_put(single[k]) for k in names]
    b_args = [jax.device_put(batch[k]) for k in names]
    if s_args[0].dtype != np.float64:
        raise RuntimeError("JAX did not enable float64")
    to_np = lambda res: {k: np.asarray(g) for k, g in zip(w.wrt, res)}  # noqa: E731
    compile_s = []
    for fun, args in ((g1, s_args), (gb, b_args), (fb, b_args)):
        t0 = time.perf_counter()
        jax.block_until_ready(fun(*args))
        compile_s.append(time.perf_counter() - t0)
    return Prepared(lambda: jax.block_until_ready(g1(*s_args)), lambda: jax.block_until_ready(gb(*b_args)),
                    lambda: jax.block_until_ready(fb(*b_args)), to_np, to_np, np.asarray,
                    notes + [f"JIT compile (first calls, in setup): jit(grad) {compile_s[0]:.2f} s, "
                     f"jit(vmap(grad)) {compile_s[1]:.2f} s, jit(vmap(f)) {compile_s[2]:.2f} s"])


# ------------------------------------------------------------------------------------ symbolic
@dataclass
class Symbolic:
    """fn traced on symbols: inputs split into per-item and shared, flattened in order."""

    per_item: list[str]
    shared: list[str]
    symbols: dict  # name -> list of scalar symbols (C order)
    expr: object  # the scalar expression
    wrt_symbols: list


def trace_symbolic(w: Workload, problem: Problem, make_symbols, tanh) -> Symbolic:
    ops = SimpleNamespace(tanh=np.frompyfunc(tanh, 1, 1), sum=lambda x, axis=None: np.sum(x, axis=axis))
    symbols = {k: make_symbols(k, int(np.prod(s, dtype=np.int64))) for k, s in problem.shapes.items()}
    arrays = {k: object_array(symbols[k], s) for k, s in problem.shapes.items()}
    expr = as_scalar(w.fn(ops, **arrays))
    per = [k for k in problem.shapes if k not in problem.shared]
    return Symbolic(per, list(problem.shared), symbols, expr, [s for k in w.wrt for s in symbols[k]])


def flat_values(inputs: dict, names) -> np.ndarray:
    return np.concatenate([np.ravel(inputs[k]) for k in names]) if names else np.zeros(0)


def batch_columns(inputs: dict, names, B: int) -> np.ndarray:
    """(B, N): one row of flattened per-item values per item."""
    return np.concatenate([inputs[k].reshape(B, -1) for k in names], axis=1)


def setup_casadi(w: Workload, single: dict, batch: dict, *, codegen: bool = False) -> Prepared:
    import casadi as ca

    notes = []

    def build(problem: Problem):
        sym = trace_symbolic(w, problem, lambda k, n: [ca.SX.sym(f"{k}_{i}") for i in range(n)], ca.tanh)
        xin = ca.vertcat(*[s for k in sym.per_item for s in sym.symbols[k]])
        ins = [xin] + ([ca.vertcat(*[s for k in sym.shared for s in sym.symbols[k]])] if sym.shared else [])
        grad = ca.Function("grad", ins, [ca.gradient(sym.expr, ca.vertcat(*sym.wrt_symbols))])
        fwd = ca.Function("fwd", ins, [sym.expr])
        part = "single-point gradient" if problem is w.single else "batch-item gradient"
        notes.append(f"{grad.n_instructions():,} SX instructions per {part}")
        if codegen:
            if grad.n_instructions() > CASADI_C_MAX_INSTRUCTIONS:
                raise Skip(f"gradient function has {grad.n_instructions():,} instructions: gcc -O2 on its C takes "
                           f"minutes (limit {CASADI_C_MAX_INSTRUCTIONS:,})")
            grad, fwd = compile_casadi(ca, grad, fwd, notes)
        return sym, grad, fwd

    s, b, skipped = build_both(w, build)
    notes += skipped
    B = batch_size(w.batched, batch)
    one = many = forward = None
    if s is not None:
        s_sym, s_grad, _ = s
        s_x = ca.DM(flat_values(single, s_sym.per_item))
        one = lambda: s_grad(s_x)  # noqa: E731
    if b is not None:
        b_sym, b_grad, b_fwd = b
        b_x = ca.DM(batch_columns(batch, b_sym.per_item, B).T)  # (N, B): one column per item
        b_args = [b_x] + ([ca.DM(flat_values(batch, b_sym.shared))] if b_sym.shared else [])
        g_map, f_map = b_grad.map(B), b_fwd.map(B)
        many, forward = (lambda: g_map(*b_args)), (lambda: f_map(*b_args))
    wrt_shapes = {k: w.batched.shapes[k] for k in w.wrt}
    return Prepared(
        one, many, forward,
        lambda res: split_flat(np.asarray(res).ravel(), {k: w.single.shapes[k] for k in w.wrt}, w.wrt),
        lambda res: split_flat(np.asarray(res).T, wrt_shapes, w.wrt),
        lambda res: np.asarray(res).ravel(), notes)


def compile_casadi(ca, grad, fwd, notes):
    """C for both functions (CasADi CodeGenerator), gcc -O2 -shared -fPIC, loaded with casadi.external."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise Skip("no C compiler (gcc) on PATH")
    workdir = tempfile.mkdtemp(prefix="semigrad-bench-casadi-")
    atexit.register(shutil.rmtree, workdir, True)
    digest = hashlib.sha1(grad.serialize().encode() + fwd.serialize().encode()).hexdigest()[:12]
    base = f"bench_{digest}"
    gen = ca.CodeGenerator(f"{base}.c")
    gen.add(grad)
    gen.add(fwd)
    gen.generate(workdir + os.sep)
    lib = os.path.join(workdir, f"{base}.so")
    t0 = time.perf_counter()
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", os.path.join(workdir, f"{base}.c"), "-o", lib],
                   check=True, capture_output=True)
    notes.append(f"gcc -O2 {time.perf_counter() - t0:.2f} s")
    g, f = ca.external("grad", lib), ca.external("fwd", lib)
    return g, f


def setup_casadi_c(w: Workload, single: dict, batch: dict) -> Prepared:
    return setup_casadi(w, single, batch, codegen=True)


def setup_sympy(w: Workload, single: dict, batch: dict) -> Prepared:
    import sympy
    from sympy.core.parameters import distribute

    def build(problem: Problem):
        tree, _ = expression_size(w, problem)
        work = tree * n_wrt(w, problem)
        if work > SYMPY_MAX_TREE_WORK:
            raise Skip(f"expression tree of {tree:.2g} nodes × {n_wrt(w, problem):,} derivatives = {work:.2g} "
                       f"(limit {SYMPY_MAX_TREE_WORK:.0e}): SymPy walks trees, setup would take far too long")
        with time_limit(SETUP_TIMEOUT, "SymPy diff + lambdify"), distribute(False):
            sym = trace_symbolic(w, problem, lambda k, n: list(sympy.symbols(f"{k}_0:{n}")), sympy.tanh)
            grads = [sympy.diff(sym.expr, s) for s in sym.wrt_symbols]
            args = [s for k in sym.per_item + sym.shared for s in sym.symbols[k]]
            g = sympy.lambdify(args, grads, modules="numpy", cse=True)
            f = sympy.lambdify(args, sym.expr, modules="numpy", cse=True)
        return sym, g, f

    s, b, notes = build_both(w, build)
    B = batch_size(w.batched, batch)
    one = many = forward = None
    if s is not None:
        s_sym, s_g, _ = s
        s_vals = [float(v) for v in flat_values(single, s_sym.per_item)]
        one = lambda: s_g(*s_vals)  # noqa: E731
    if b is not None:
        b_sym, b_g, b_f = b
        cols = list(np.ascontiguousarray(batch_columns(batch, b_sym.per_item, B).T))
        b_vals = cols + [float(v) for v in flat_values(batch, b_sym.shared)]
        many, forward = (lambda: b_g(*b_vals)), (lambda: b_f(*b_vals))

    def stack(res):
        return np.stack([np.broadcast_to(np.asarray(r, dtype=float), (B,)) for r in res], axis=-1)

    return Prepared(
        one, many, forward,
        lambda res: split_flat(np.asarray(res, dtype=float), {k: w.single.shapes[k] for k in w.wrt}, w.wrt),
        lambda res: split_flat(stack(res), {k: w.batched.shapes[k] for k in w.wrt}, w.wrt),
        lambda res: np.broadcast_to(np.asarray(res, dtype=float), (B,)), notes)


def setup_symengine(w: Workload, single: dict, batch: dict) -> Prepared:
    import symengine as se

    backend = "llvm" if getattr(se, "have_llvm", False) else "lambda"

    def build(problem: Problem):
        _, dag = expression_size(w, problem)
        work = dag * n_wrt(w, problem)
        if work > SYMENGINE_MAX_DAG_WORK:
            raise Skip(f"{dag:,} scalar operations × {n_wrt(w, problem):,} derivatives = {work:.2g} "
                       f"(limit {SYMENGINE_MAX_DAG_WORK:.0e}): diff alone takes > 10 min")
        with time_limit(SETUP_TIMEOUT, "SymEngine diff + Lambdify"):
            sym = trace_symbolic(w, problem, lambda k, n: [se.Symbol(f"{k}_{i}") for i in range(n)], se.tanh)
            grads = [sym.expr.diff(s) for s in sym.wrt_symbols]
            args = [s for k in sym.per_item + sym.shared for s in sym.symbols[k]]
            g = se.Lambdify(args, grads, backend=backend, cse=True)
            f = se.Lambdify(args, [sym.expr], backend=backend, cse=True)
        return sym, g, f

    s, b, notes = build_both(w, build)
    B = batch_size(w.batched, batch)
    one = many = forward = None
    if s is not None:
        s_sym, s_g, _ = s
        s_x = flat_values(single, s_sym.per_item)
        one = lambda: s_g(s_x)  # noqa: E731
    if b is not None:
        b_sym, b_g, b_f = b
        b_x = batch_columns(batch, b_sym.per_item, B)
        if b_sym.shared:
            shared = flat_values(batch, b_sym.shared)
            b_x = np.concatenate([b_x, np.broadcast_to(shared, (B, shared.size))], axis=1)
            notes.append("batched: shared inputs tiled into the (B, inputs) array")
        b_x = np.ascontiguousarray(b_x)
        many, forward = (lambda: b_g(b_x)), (lambda: b_f(b_x))
    return Prepared(
        one, many, forward,
        lambda res: split_flat(np.asarray(res).ravel(), {k: w.single.shapes[k] for k in w.wrt}, w.wrt),
        lambda res: split_flat(np.asarray(res).reshape(B, -1), {k: w.batched.shapes[k] for k in w.wrt}, w.wrt),
        lambda res: np.asarray(res).reshape(B),
        [f"backend {backend}"] + notes)


PEERS = [
    Peer("torch", "PyTorch eager", ("torch",), ("torch",), setup_torch_eager, "rss"),
    Peer("torchfunc", "torch.func vmap(grad)", ("torch", "torch.func"), ("torch",), setup_torch_func, "rss"),
    Peer("jax", "JAX jit(grad) / jit(vmap(grad))", ("jax", "jaxlib"), ("jax", "jaxlib"), setup_jax, "rss"),
    Peer("casadi", "CasADi SX Function.map", ("casadi",), ("casadi",), setup_casadi, "rss"),
    Peer("casadi_c", "CasADi generated C (gcc -O2)", ("casadi",), ("casadi",), setup_casadi_c, "rss"),
    Peer("sympy", "SymPy lambdify(cse=True)", ("sympy",), ("sympy",), setup_sympy, "tracemalloc"),
    Peer("symengine", "SymEngine Lambdify (LLVM, cse)", ("symengine",), ("symengine",), setup_symengine, "rss"),
]
