"""Optional JIT backend (numba, when installed): a scalar program compiled to machine code
as one loop over batch items. IEEE semantics (error_model="numpy"): 1/0 is inf, log(-1) NaN,
never an exception. Real-semiring programs only (plugin semirings are Python code).

Three memory layouts, chosen per kernel by timing them on a synthetic batch:

* "rows": item b's elements are row b of an (items, elements) array, as requests send them.
  Fine for small programs with much parallelism inside one item (det by minors, n=4).
* "tiles": the same arrays, but the kernel copies TILE items at a time into small local
  (elements, TILE) arrays, runs the program over them and copies the results back. Local
  arrays cannot alias the caller's and stay in L1; for programs with many inputs and outputs
  per item this is several times faster (det by minors n=7, gradient: ~2.7× rows).
* "columns": element j of every item is row j of an (elements, items) array. The loop over
  items then vectorises (SIMD over items, several items in flight), which is what programs
  made of one long dependency chain need (an ODE integrated step by step: ~7× rows).
  It costs a transposition of the inputs and returns transposed views of the outputs.
"""

from __future__ import annotations

import functools
import math
import logging
import statistics
import threading
import time

import numpy as np

from .. import deadline
from ..errors import DeadlineExceeded, FailedPrecondition
from . import background
from .allocation import result_array, results_in
from .codegen import expression
from .scalarize import MAX_SCALARS, ScalarProgram

try:
    import numba
except ImportError:  # pragma: no cover - depends on the environment
    numba = None

log = logging.getLogger("semigrad.runtime")
AVAILABLE = numba is not None
# One generated function of more than a few thousand instructions takes LLVM minutes (det n=7,
# 2,456 instructions: 3.4 s; superlinear). Larger programs are cut into functions of
# SEGMENT_INSTRUCTIONS each ("segments" layout), so compile time grows linearly with size.
SEGMENT_INSTRUCTIONS = 4_000
MAX_INSTRUCTIONS = MAX_SCALARS  # every scalar program fits
LAYOUTS = ("tiles", "rows", "columns")  # on a tie, the first
TILE = 64
# With more element streams than this per item, the rows and columns layouts walk too many
# arrays at once (det n=6, n=7: tiles 3x faster than either): tiles only, one compile.
MAX_COLUMN_STREAMS = 64
# Items of the synthetic batch layouts are timed on: a typical batch, past the L2 cache (det n=5:
# 4 MB of inputs and outputs). Smaller batches rank layouts differently: det n=5 on one loaded
# machine, CPU ms per 10,000 items, tiles 0.42 / rows 0.58 at 2,048 items, 0.95 / 0.69 at 10,000.
TUNING_ITEMS = 10_000
TUNING_ROUNDS = 7  # layouts timed in alternation, on the compiling thread's CPU clock
TUNING_BATCHES = 4  # synthetic batches used in turn (each new to the cache when its turn comes)
# Background compiles run one at a time: a large program costs minutes of a core (det n=8, 5,578
# instructions: ~40 s), and many hot graphs must not take every core from the requests.
BACKGROUND_COMPILES = threading.Semaphore(1)
WAIT_STEP = 0.02  # seconds between deadline checks while a request waits for a compile


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view: kernels always get inputs typed the same way (numba compiles
    read-only and writable arrays separately, and requests' arrays are often read-only)."""
    view = a.view()
    view.flags.writeable = False
    return view


@functools.lru_cache(maxsize=None)
def _jitted(fn):
    """An op's float function for numba: math's functions and those numba compiled already (tanh's)
    as they are, ours compiled once per process."""
    if fn is abs or getattr(fn, "__module__", "") == "math" or isinstance(fn, numba.core.dispatcher.Dispatcher):
        return fn
    return numba.njit(fn)


def refusal(ops) -> str | None:
    """Why generated numba code cannot call these ops (None: it can)."""
    if not AVAILABLE:
        return "numba is not installed (pip install 'semigrad[jit]')"
    for op in ops:
        if op.bound is not None:
            return f"op '{op.name}' computes in a plugin semiring (Python code)"
        if op.infix is None and op.float_fn is None:
            return f"op '{op.name}' has no float form (OpDef.float_fn)"
    return None


def compile_function(lines: list[str], label: str, entry: str, ops=(), entries=(), **options):
    """numba-compile the generated function `entry` defined by `lines` (IEEE error model), which
    calls `ops` as `F_<name>` and the generated functions `entries` (compiled first, each its
    own LLVM function). Only our own op names, numbers and variable names reach the source,
    never text from a request."""
    functions = {f"F_{op.name}": _jitted(op.float_fn) for op in ops if op.infix is None}
    namespace = {"numba": numba, "math": math, "np": np, **functions}
    exec(compile("\n".join(lines) + "\n", f"<semigrad {label}>", "exec"), namespace)  # our own generated code
    for name in entries:
        namespace[name] = numba.njit(error_model="numpy", **options)(namespace[name])
    return numba.njit(error_model="numpy", **options)(namespace[entry])


class Kernel:
    """A compiled loop over items in one layout; `run` takes and returns (items, elements) arrays
    (a column kernel's outputs are transposed views)."""

    def __init__(self, p: ScalarProgram, batched: tuple[bool, ...], layout: str):
        self.p, self.batched, self.layout = p, batched, layout
        self.function = _compile(p, batched, layout)

    def run(self, arrays: list[np.ndarray], n: int) -> list[np.ndarray]:
        """arrays[k]: (n, size) when batched, else (1, size); returns (n, size) per output."""
        p = self.p
        if self.layout in ("rows", "tiles", "segments"):  # row-major results: possibly straight into the response's region
            outs = [result_array((n, ids.size), dtype) for (_, _, ids), dtype in zip(p.outputs, p.output_dtypes)]
            self.function(*arrays, *outs)
            return outs
        columns = [readonly(np.ascontiguousarray(a.T)) for a in arrays]
        outs = [np.empty((ids.size, n), dtype=dtype) for (_, _, ids), dtype in zip(p.outputs, p.output_dtypes)]
        self.function(*columns, *outs)
        return [out.T for out in outs]


class CompileFailure(str):
    """Why a program did not compile (kept, so it is not compiled again)."""


class JitProgram:
    """Compiles lazily, once per pattern of batched/unbatched inputs."""

    def __init__(self, p: ScalarProgram):
        self.p = p
        self._kernels: dict[tuple[bool, ...], object] = {}
        self._lock = threading.Lock()

    @staticmethod
    def refusal(p: ScalarProgram) -> str | None:
        """Why this program has no JIT kernel (None: it has one)."""
        if len(p.instrs) > MAX_INSTRUCTIONS:
            return f"the program has {len(p.instrs)} instructions; the JIT's limit is {MAX_INSTRUCTIONS}"
        return refusal(p.ops.values())

    def kernel(self, batched: tuple[bool, ...], until: float | None = None) -> Kernel:
        """The compiled kernel for this input pattern, waiting for its compile if needed; an op
        numba cannot compile (a float form that is not numba code) is FAILED_PRECONDITION. The
        compile runs in the background (a large program takes minutes): a request waits for it
        only until its deadline (DEADLINE_EXCEEDED), while the compile goes on for later calls.
        `until`: the run's deadline (time.monotonic()), checked beside the request's bound (the
        in-process client's short path has a deadline but no bound)."""
        kernel = self._kernels.get(batched)
        if kernel is None or isinstance(kernel, threading.Thread):
            self.ready_kernel(batched)
            pending = self._kernels.get(batched)
            where = "waiting for the JIT compile of this program (it goes on in the background: a later call finds it compiled)"
            while isinstance(pending, threading.Thread) and pending.is_alive():
                deadline.check(where)
                if until is not None and time.monotonic() > until:
                    raise DeadlineExceeded(f"deadline exceeded {where}")
                pending.join(WAIT_STEP if until is None else max(0.0, min(WAIT_STEP, until - time.monotonic())))
            kernel = self._kernels[batched]
        if isinstance(kernel, CompileFailure):
            raise FailedPrecondition(f"the jit backend cannot compile this program: {kernel}")
        return kernel

    def ready_kernel(self, batched: tuple[bool, ...]) -> Kernel | None:
        """The kernel if compiled; otherwise start compiling it in the background and return None
        (for good, when it could not compile: the NumPy form serves)."""
        kernel = self._kernels.get(batched)
        if isinstance(kernel, CompileFailure):
            return None
        if kernel is None or isinstance(kernel, threading.Thread):
            if kernel is None:
                with self._lock:
                    if batched not in self._kernels:
                        thread = background.thread(self._background, batched)
                        self._kernels[batched] = thread
                        thread.start()
            return None
        return kernel

    def kernels(self) -> list[Kernel]:
        """The kernels compiled so far."""
        return [k for k in self._kernels.values() if isinstance(k, Kernel)]

    def _background(self, batched):
        with BACKGROUND_COMPILES:
            if not background.exiting():
                self._kernels[batched] = self._compiled_or_failure(batched)

    def _compiled_or_failure(self, batched: tuple[bool, ...]):
        try:
            return self._fastest(batched)
        except Exception as e:  # numba's typing and lowering errors: an op's float form is not numba code
            failure = CompileFailure(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}")
            log.warning("a scalar program did not compile with numba (%s); it runs on NumPy", failure)
            return failure

    def _fastest(self, batched: tuple[bool, ...]) -> Kernel:
        """Every applicable layout compiled (numba compiles on the first call: made here, so no
        request waits for LLVM) and timed on synthetic batches (_time_layouts); the fastest wins."""
        p = self.p
        streams = sum(ids.size for (_, _, ids), b in zip(p.inputs, batched) if b) + sum(ids.size for _, _, ids in p.outputs)
        if len(p.instrs) > SEGMENT_INSTRUCTIONS:
            layouts = ("segments",)
        elif not any(batched):
            layouts = ("rows",)  # one item: nothing to tile
        else:
            layouts = LAYOUTS if streams <= MAX_COLUMN_STREAMS else ("tiles",)
        with results_in(None):  # tuning runs' results are scratch, wherever the request's results go
            return self._time_layouts(batched, layouts)

    def _time_layouts(self, batched: tuple[bool, ...], layouts: tuple[str, ...]) -> Kernel:
        """Compile every layout, then time them in alternation (TUNING_ROUNDS rounds, one run of
        each per round) on this thread's CPU clock, and keep the lowest median: on a busy machine a
        wall-clock timing of a few milliseconds includes other processes' time slices, so the
        layout timed while the machine was busiest lost whatever its speed; the thread's CPU clock
        leaves them out, and alternation spreads what remains (caches shared with other processes)
        over every layout."""
        p = self.p
        # several input batches, used in turn: a request's inputs are new to the cache, and a
        # layout timed on inputs already in cache ranks differently (det n=5: tiles then beat rows)
        count = TUNING_BATCHES if len(layouts) > 1 else 1
        batches = [_synthetic_inputs(p, batched, TUNING_ITEMS, offset) for offset in range(count)]
        arrays = batches[0]
        kernels = []
        for layout in layouts:
            kernel = Kernel(p, batched, layout)
            kernel.run(arrays, TUNING_ITEMS)  # the compile
            if len(layouts) == 1:
                return kernel
            kernels.append(kernel)
        times: list[list[float]] = [[] for _ in kernels]
        runs = 0
        for _ in range(TUNING_ROUNDS):
            for kernel, spent in zip(kernels, times):
                arrays = batches[runs % TUNING_BATCHES]
                runs += 1
                start = time.thread_time()
                kernel.run(arrays, TUNING_ITEMS)
                spent.append(time.thread_time() - start)
        ranked = [(statistics.median(spent), LAYOUTS.index(k.layout), k) for k, spent in zip(kernels, times)]
        return min(ranked, key=lambda t: t[:2])[2]


def _synthetic_inputs(p: ScalarProgram, batched: tuple[bool, ...], n: int, offset: int = 0) -> list[np.ndarray]:
    """Values in [0.5, 1.5] (no NaN, inf or denormal slow paths), in the inputs' dtypes; another
    `offset`, other values."""
    arrays = []
    for k, ((_, _, ids), dtype) in enumerate(zip(p.inputs, p.input_dtypes)):
        rows = n if batched[k] else 1
        values = 0.5 + ((np.arange(rows * ids.size).reshape(rows, ids.size) + offset) * 0.6180339887) % 1.0
        arrays.append(readonly(values.astype(dtype) if np.dtype(dtype).kind == "f" else (values > 1).astype(dtype)))
    return arrays


def _compile(p: ScalarProgram, batched: tuple[bool, ...], layout: str):
    """Generated source of the loop, compiled by numba. Only our own op names and numbers reach
    the source, never text from a request."""
    if layout == "segments":
        return _compile_segments(p, batched)
    ins = [f"X{k}" for k in range(len(p.inputs))]
    outs = [f"Y{k}" for k in range(len(p.outputs))]
    lines = [f"def kernel({', '.join(ins + outs)}):"]
    if not outs:
        lines.append("    return")
    elif layout == "tiles":
        # Items TILE at a time: the batched inputs' elements are copied into small local
        # (elements, TILE) arrays, the program runs item by item reading and writing those,
        # and the outputs are copied back. Local arrays cannot alias the caller's, and a tile
        # stays in L1: det by minors n=7, gradient ~2.7x the rows layout.
        tiled_in = [k for k, b in enumerate(batched) if b]
        lines.append("    n = Y0.shape[0]")
        for k in tiled_in:
            lines.append(f"    A{k} = np.empty(({p.inputs[k][2].size}, {TILE}), dtype=X{k}.dtype)")
        for k, (_, _, ids) in enumerate(p.outputs):
            lines.append(f"    B{k} = np.empty(({ids.size}, {TILE}), dtype=Y{k}.dtype)")
        lines += [f"    for c in range(0, n, {TILE}):", f"        m = min({TILE}, n - c)"]
        for k in tiled_in:
            lines += ["        for t in range(m):", f"            for j in range({p.inputs[k][2].size}):",
                      f"                A{k}[j, t] = X{k}[c + t, j]"]
        lines.append("        for t in range(m):")
        lines += _body(p, lambda k, j: f"A{k}[{j}, t]" if batched[k] else f"X{k}[0, {j}]",
                       lambda k, j: f"B{k}[{j}, t]", "            ")
        for k, (_, _, ids) in enumerate(p.outputs):
            lines += ["        for t in range(m):", f"            for j in range({ids.size}):",
                      f"                Y{k}[c + t, j] = B{k}[j, t]"]
    else:
        columns = layout == "columns"
        lines.append(f"    for b in range(Y0.shape[{1 if columns else 0}]):")

        def element(array: str, item: str, j: int) -> str:
            return f"{array}[{j}, {item}]" if columns else f"{array}[{item}, {j}]"

        lines += _body(p, lambda k, j: element(f"X{k}", "b" if batched[k] else "0", j),
                       lambda k, j: element(f"Y{k}", "b", j), "        ")
    return compile_function(lines, "jit program", "kernel", ops=p.ops.values(), fastmath=False, cache=False)


def _body(p: ScalarProgram, read, write, indent: str) -> list[str]:
    """One item's program: `read(k, j)` / `write(k, j)` spell element j of input / output k."""
    names: dict[int, str] = {}

    def name_of(var: int) -> str:
        if var in p.consts:
            value = p.consts[var]
            if isinstance(value, bool) or math.isfinite(value):
                return repr(value)
            return "math.nan" if value != value else ("math.inf" if value > 0 else "-math.inf")
        return names[var]

    lines = []
    for k, (_, _, ids) in enumerate(p.inputs):
        for j, var in enumerate(ids.reshape(-1)):
            names[int(var)] = f"i{int(var)}"
            lines.append(f"{indent}i{int(var)} = {read(k, j)}")
    for var, op, args in p.instrs:
        names[var] = f"v{var}"
        lines.append(f"{indent}v{var} = {expression(p.ops[op], [name_of(a) for a in args], 'compiled')}")
    for k, (_, _, ids) in enumerate(p.outputs):
        for j, var in enumerate(ids.reshape(-1)):
            lines.append(f"{indent}{write(k, j)} = {name_of(int(var))}")
    return lines


def _compile_segments(p: ScalarProgram, batched: tuple[bool, ...]):
    """The tiles layout with the program cut into functions of SEGMENT_INSTRUCTIONS instructions
    (and the output copies into functions of as many lines): a value one function computes and a
    later one reads travels through scratch arrays SF (floats) and SB (bools), a row per item of
    the tile. Each function loads what it reads from outside once into a local (numba lowers an
    array access at a time: loads at every use made compiles 20x slower)."""
    chunks = [p.instrs[i:i + SEGMENT_INSTRUCTIONS] for i in range(0, len(p.instrs), SEGMENT_INSTRUCTIONS)]
    segment_of = {var: s for s, chunk in enumerate(chunks) for var, _, _ in chunk}
    last_use: dict[int, int] = {}
    for s, chunk in enumerate(chunks):
        for _, _, args in chunk:
            for a in args:
                last_use[a] = s
    outputs = [(k, j, int(var)) for k, (_, _, ids) in enumerate(p.outputs) for j, var in enumerate(ids.reshape(-1))]
    read_by_outputs = {var for _, _, var in outputs}
    bools = _bool_vars(p)
    scratch: dict[int, str] = {}
    counts = {"sf": 0, "sb": 0}
    for var, s in segment_of.items():
        if last_use.get(var, -1) > s or var in read_by_outputs:
            row = "sb" if var in bools else "sf"
            scratch[var] = f"{row}[{counts[row]}]"
            counts[row] += 1
    inputs = {int(var): (k, j) for k, (_, _, ids) in enumerate(p.inputs) for j, var in enumerate(ids.reshape(-1))}
    ins = [f"X{k}" for k in range(len(p.inputs))]
    tiles = [f"A{k}" for k in range(len(p.inputs))]
    outs = [f"Y{k}" for k in range(len(p.outputs))]

    def external(var: int) -> str:
        """Where a value not computed in this function is read: a constant, an input, scratch."""
        if var in p.consts:
            value = p.consts[var]
            if isinstance(value, bool) or math.isfinite(value):
                return repr(value)
            return "math.nan" if value != value else ("math.inf" if value > 0 else "-math.inf")
        if var in inputs:
            k, j = inputs[var]
            return f"a{k}[{j}]" if batched[k] else f"x{k}[{j}]"
        return scratch[var]

    head = [f"    x{k} = X{k}[0]" for k in range(len(p.inputs)) if not batched[k]]
    item = ["        sf = SF[t]", "        sb = SB[t]"] + [f"        a{k} = A{k}[t]" for k in range(len(p.inputs))
                                                          if batched[k]]
    lines = []
    parameters = ", ".join(ins + tiles + ["SF", "SB", "m"])
    for s, chunk in enumerate(chunks):
        lines += [f"def segment{s}({parameters}):", *head, "    for t in range(m):", *item]
        local: set[int] = set()
        for var, op, args in chunk:
            for a in args:
                if a not in local and a not in p.consts:
                    lines.append(f"        v{a} = {external(a)}")
                    local.add(a)
            operands = [f"v{a}" if a in local else external(a) for a in args]
            lines.append(f"        v{var} = {expression(p.ops[op], operands, 'compiled')}")
            local.add(var)
            if var in scratch:
                lines.append(f"        {scratch[var]} = v{var}")
    copies = [outputs[i:i + SEGMENT_INSTRUCTIONS] for i in range(0, len(outputs), SEGMENT_INSTRUCTIONS)]
    copy_parameters = ", ".join(ins + tiles + outs + ["SF", "SB", "c", "m"])
    for s, chunk in enumerate(copies):
        lines += [f"def copy{s}({copy_parameters}):", *head, "    for t in range(m):", *item]
        lines += [f"        Y{k}[c + t, {j}] = {external(var)}" for k, j, var in chunk]
    lines.append(f"def kernel({', '.join(ins + outs)}):")
    lines.append(f"    n = {outs[0]}.shape[0]" if outs else "    return")
    for k, (_, _, ids) in enumerate(p.inputs):
        lines.append(f"    A{k} = np.empty(({TILE}, {ids.size if batched[k] else 0}), dtype=X{k}.dtype)")
    lines.append(f"    SF = np.empty(({TILE}, {counts['sf']}), dtype=np.float64)")
    lines.append(f"    SB = np.empty(({TILE}, {counts['sb']}), dtype=np.bool_)")
    lines += [f"    for c in range(0, n, {TILE}):", f"        m = min({TILE}, n - c)"]
    for k, (_, _, ids) in enumerate(p.inputs):
        if batched[k]:
            lines += ["        for t in range(m):", f"            for j in range({ids.size}):",
                      f"                A{k}[t, j] = X{k}[c + t, j]"]
    lines += [f"        segment{s}({parameters})" for s in range(len(chunks))]
    lines += [f"        copy{s}({copy_parameters})" for s in range(len(copies))]
    entries = [f"segment{s}" for s in range(len(chunks))] + [f"copy{s}" for s in range(len(copies))]
    return compile_function(lines, "segmented jit program", "kernel", ops=p.ops.values(), entries=entries,
                            fastmath=False, cache=False)


def _bool_vars(p: ScalarProgram) -> set[int]:
    """The program's variables that hold bools (comparisons, bool inputs, where of bools...)."""
    bools = {int(v) for (_, _, ids), dtype in zip(p.inputs, p.input_dtypes) if dtype == "bool" for v in ids.reshape(-1)}
    bools |= {v for v, c in p.consts.items() if isinstance(c, bool)}
    for var, op, args in p.instrs:
        opdef = p.ops[op]
        probes = [np.zeros((), dtype=bool if a in bools else np.float64) for a in args]
        with np.errstate(all="ignore"):
            if np.asarray(opdef.elementwise_fn(*probes)).dtype == np.bool_:
                bools.add(var)
    return bools
