"""Optional JIT backend (numba, when installed): a scalar program compiled to machine code
as one loop over batch items, spread over all cores. IEEE semantics (error_model="numpy"):
1/0 is inf, log(-1) NaN, never an exception. Real-semiring programs only (plugin semirings
are Python code)."""

from __future__ import annotations

import math
import threading

import numpy as np

from .codegen import FLOAT_FNS, INFIX
from .scalarize import ScalarProgram

try:
    import numba
except ImportError:  # pragma: no cover - depends on the environment
    numba = None

AVAILABLE = numba is not None
MAX_INSTRUCTIONS = 4_000  # past this, compile times grow to minutes (det n=7, 2,456: 3.4 s)
# One thread per call: measured on 2 busy cores, prange stalled ~8 ms per call waiting for a
# core; throughput across cores comes from serving requests in parallel (serve --workers).
PARALLEL = False


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view: kernels always get inputs typed the same way (numba compiles
    read-only and writable arrays separately, and requests' arrays are often read-only)."""
    view = a.view()
    view.flags.writeable = False
    return view


def _jitted_functions() -> dict:
    return {name: (fn if fn in (abs, ) or getattr(fn, "__module__", "") == "math" else numba.njit(fn))
            for name, fn in FLOAT_FNS.items()}


class JitProgram:
    """Compiles lazily, once per pattern of batched/unbatched inputs."""

    def __init__(self, p: ScalarProgram):
        self.p = p
        self._kernels: dict[tuple[bool, ...], object] = {}
        self._lock = threading.Lock()

    @staticmethod
    def applicable(p: ScalarProgram, semiring) -> bool:
        return AVAILABLE and semiring is None and len(p.instrs) <= MAX_INSTRUCTIONS

    def kernel(self, batched: tuple[bool, ...]):
        """The compiled kernel for this input pattern, compiling it now if needed."""
        pending = self._kernels.get(batched)
        if isinstance(pending, threading.Thread):
            pending.join()
        with self._lock:
            if batched not in self._kernels:
                self._kernels[batched] = self._compile(batched)
            return self._kernels[batched]

    def ready_kernel(self, batched: tuple[bool, ...]):
        """The kernel if compiled; otherwise start compiling it in the background and return None."""
        kernel = self._kernels.get(batched)
        if kernel is None or isinstance(kernel, threading.Thread):
            if kernel is None:
                with self._lock:
                    if batched not in self._kernels:
                        thread = threading.Thread(target=self._background, args=(batched,), daemon=True,
                                                  name="semigrad-jit")
                        self._kernels[batched] = thread
                        thread.start()
            return None
        return kernel

    def _background(self, batched):
        kernel = self._compile(batched)
        # numba compiles on the first call: make it here, on dummy rows of the real dtypes, so
        # no request waits for LLVM.
        dummy = [np.zeros((1, ids.size), dtype=dtype) for (_, _, ids), dtype in zip(self.p.inputs, self.p.input_dtypes)]
        self.run(kernel, [readonly(d) for d in dummy], 1)
        self._kernels[batched] = kernel

    def run(self, kernel, arrays: list[np.ndarray], n: int) -> list[np.ndarray]:
        """arrays[k]: (n, size) when batched, else (1, size); returns (n, size) per output."""
        outs = [np.empty((n, ids.size), dtype=dtype) for (_, _, ids), dtype in zip(self.p.outputs, self.p.output_dtypes)]
        kernel(*arrays, *outs)
        return outs

    def _compile(self, batched: tuple[bool, ...]):
        p = self.p
        names: dict[int, str] = {}

        def name_of(var: int) -> str:
            if var in p.consts:
                value = p.consts[var]
                if isinstance(value, bool) or math.isfinite(value):
                    return repr(value)
                return "math.nan" if value != value else ("math.inf" if value > 0 else "-math.inf")
            return names[var]

        ins = [f"X{k}" for k in range(len(p.inputs))]
        outs = [f"Y{k}" for k in range(len(p.outputs))]
        lines = [f"def kernel({', '.join(ins + outs)}):", f"    for b in numba.prange({outs[0]}.shape[0]):"
                 if outs else "    return"]
        for k, (_, _, ids) in enumerate(p.inputs):
            row = "b" if batched[k] else "0"
            for j, var in enumerate(ids.reshape(-1)):
                names[int(var)] = f"i{int(var)}"
                lines.append(f"        i{int(var)} = X{k}[{row}, {j}]")
        for var, op, args in p.instrs:
            names[var] = f"v{var}"
            operands = [name_of(a) for a in args]
            if op in INFIX:
                expr = INFIX[op].format(*operands)
            elif op == "where":
                expr = f"({operands[1]} if {operands[0]} else {operands[2]})"
            else:
                expr = f"F_{op}({', '.join(operands)})"
            lines.append(f"        v{var} = {expr}")
        for k, (_, _, ids) in enumerate(p.outputs):
            for j, var in enumerate(ids.reshape(-1)):
                lines.append(f"        Y{k}[b, {j}] = {name_of(int(var))}")
        namespace = {"numba": numba, "math": math, **{f"F_{k}": v for k, v in _jitted_functions().items()}}
        exec(compile("\n".join(lines) + "\n", "<semigrad jit program>", "exec"), namespace)  # our own generated code
        return numba.njit(parallel=PARALLEL, error_model="numpy", fastmath=False, cache=False)(namespace["kernel"])
