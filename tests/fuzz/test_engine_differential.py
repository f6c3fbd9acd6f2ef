"""The differential fuzzer (issue 12): random graphs over every op of the registry, with batch
axes on random subsets of the inputs (weights included) and sizes on both sides of the engine's
thresholds, run on every backend, both transports (inline and shared memory), unary and
streamed, and compared with an independent reference:

* the real semiring: forward values against a NumPy interpreter of each batch item
  (tests/fuzz/fuzz_graphs.py), gradients against central differences of that interpreter along
  random directions, item by item;
* every other installed semiring: against brute-force path enumeration (tests/path_reference.py)
  on small graphs.

`make test` runs it bounded (hypothesis profile "ci": fixed seed; 200 graphs per transport in
135 s on the 2 shared cores at a load of 4-5, 16 items of each checked, one JIT compile, plus
the fused-group/cut-JIT, window-cap and semiring tests);
`make fuzz` runs many more examples with random seeds (SEMIGRAD_FUZZ_EXAMPLES per test, default
2,000). The number of cases run is printed at the end of the session.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from importlib import metadata

import grpc
import numpy as np
import pytest
import semigrad as sg
from fuzz_graphs import (LARGE, MAX_ITEM_ELEMENTS, MAX_TOTAL_ELEMENTS, REGIMES, WINDOW_OFFSETS, Reference, Vocabulary,
                         cases, window_offsets)
from hypothesis import given, note, settings, strategies as st
from path_reference import over_paths, random_case

from semigrad_server.semiring.loader import GROUP

FUZZ = bool(os.environ.get("SEMIGRAD_FUZZ"))
# make fuzz: cases per test (SEMIGRAD_FUZZ_EXAMPLES=200 make fuzz for a shorter run)
FUZZ_EXAMPLES = int(os.environ.get("SEMIGRAD_FUZZ_EXAMPLES", "2000"))
# make fuzz: draw these ops only (SEMIGRAD_FUZZ_OPS=einsum,conv2d,tanh make fuzz), else every op
FUZZ_OPS = tuple(os.environ.get("SEMIGRAD_FUZZ_OPS", "").split(",")) if os.environ.get("SEMIGRAD_FUZZ_OPS") else None
SCALAR_ELEMENTS = 400  # scalar backend for graphs of at most this many elements per item (all values)
JIT_ELEMENTS = 80  # the JIT backend for these, on an eighth of them
JIT_GRAPHS = 1  # and at most this many in a bounded run (a compile takes 5-25 s of a core; one more is cut in segments)
# batch items compared with the reference per call (first, last, and a random sample); the
# reference interprets each three times in Python, which dominated a bounded run's cost at 48
CHECKED_ITEMS = 48 if FUZZ else 16
STATS: dict[str, int] = {}


def count(key: str, n: int = 1) -> None:
    STATS[key] = STATS.get(key, 0) + n


@pytest.fixture(scope="module")
def clients(server_address):
    """One client per transport: tensors inline, and always through shared memory (results
    written into the request's output regions)."""
    with sg.Client(server_address, shared_memory=False) as inline, \
            sg.Client(server_address, shared_memory=True) as shared:
        yield {"inline": inline, "shared_memory": shared}


@pytest.fixture(scope="module")
def vocabulary(clients):
    return Vocabulary(clients["inline"].list_ops())


# Ops the server lists that the fuzzer cannot draw yet. Empty, and kept so: an op added later
# without a single-op row in CASES (elementwise) or a builder in fuzz_graphs.py fails below.
NOT_YET_FUZZED: frozenset = frozenset()


def test_every_op_of_the_server_is_fuzzed(vocabulary):
    """Every op the server lists is drawn (elementwise ops through their op-table row), or is
    internal to backward graphs (scatter_index, heaviside), which gradients reach."""
    from semigrad_server.ops import REGISTRY

    internal = {op.name for op in REGISTRY if op.internal}
    assert NOT_YET_FUZZED == frozenset(), "every op has a builder: keep it so"
    assert set(vocabulary.unfuzzed) - internal == set(), (
        "ops the fuzzer cannot draw: give each a single-op row in tests/test_op_gradients.py CASES "
        "(elementwise) or a builder in tests/fuzz/fuzz_graphs.py")
    assert set(vocabulary.names) >= {op.name for op in REGISTRY if not op.internal and op.kind != "source"}


def test_the_regimes_straddle_the_engines_thresholds():
    """The sizes the fuzzer draws sit on both sides of each threshold of docs/limits.md that a
    size crosses (the costly ones are lowered in test_hot_fused_groups_and_cut_jit_programs)."""
    from semigrad.transport import SHARED_MEMORY_THRESHOLD
    from semigrad.streaming import STREAM_CHUNK_BYTES_INLINE
    from semigrad_server.runtime.compiled import JIT_MIN_BATCH
    from semigrad_server.runtime.plan import REUSE_MIN_ELEMENTS
    from semigrad_server.runtime.scalarize import MAX_AUTO_ELEMENTS_PER_NODE

    dims = {d for ds, _ in REGIMES.values() for d in ds}
    batches = {math.prod(b) for _, bs in REGIMES.values() for b in bs}
    assert min(dims) ** 2 <= MAX_AUTO_ELEMENTS_PER_NODE < max(d for d in dims if d * d <= MAX_ITEM_ELEMENTS) ** 2
    assert LARGE == REUSE_MIN_ELEMENTS and max(dims) ** 2 >= REUSE_MIN_ELEMENTS > 64 * 64
    assert JIT_MIN_BATCH - 1 in batches and JIT_MIN_BATCH in batches
    assert 8 * MAX_TOTAL_ELEMENTS > max(SHARED_MEMORY_THRESHOLD, STREAM_CHUNK_BYTES_INLINE) > 8 * 64
    assert 77 in batches and 76 in batches  # the shared-memory transformer batch
    from semigrad_server.ops.nn import MAX_WINDOW_OFFSETS

    # convs and pools visit up to WINDOW_OFFSETS offsets: test_window_offsets_on_both_sides_of_their_cap
    # lowers the cap below that
    assert MAX_WINDOW_OFFSETS >= WINDOW_OFFSETS > LOWERED_OFFSETS


# ---------------------------------------------------------------- running a case


def sample_items(case, rng) -> list[tuple]:
    items = case.items()
    if len(items) <= CHECKED_ITEMS:
        return items
    picked = {0, len(items) - 1} | set(rng.choice(len(items), CHECKED_ITEMS - 2, replace=False).tolist())
    return [items[i] for i in sorted(picked)]


def stream_chunks(case) -> int | None:
    """gradient_many cuts along the first batch axis: None when the inputs that have batch axes
    disagree on it (then the case is not streamed)."""
    firsts = {x.lead[0] for x in case.inputs.values() if x.lead}
    return firsts.pop() if len(firsts) == 1 else 1 if not firsts else None


def run_config(case, graphs, backend: str, transport: str, mode: str, chunk_size, reference) -> str:
    """One call of the case on one configuration, checked; returns what happened."""
    f = graphs[transport]
    seeds = case.seeds or None
    where = f"backend={backend} transport={transport} {mode}" + (f" chunk_size={chunk_size}" if mode == "stream" else "")
    try:
        if mode == "unary":
            grads, outputs = f.gradient(case.values, seeds=seeds, backend=backend, return_outputs=True)
        else:
            grads = f.gradient_many(case.values, chunk_size=chunk_size, seeds=seeds, backend=backend,
                                    return_outputs=True, progress=False)
            outputs = grads.outputs
        # Evaluate once per backend (its plan is the same whichever way the gradient went)
        evaluated = f.evaluate(case.values, backend=backend) if mode == "unary" else None
    except sg.SemigradError as e:
        if backend in ("scalar", "jit") and over_scalar_cap(e):
            return "refused over MAX_SCALARS"
        raise failure(transport, "error")(f"{where}: {type(e).__name__}: {e}") from None
    try:
        reference.check_outputs(outputs, reference.items, where)
        reference.check_gradients(grads, where)
        if evaluated is not None:
            reference.check_outputs(evaluated, reference.items, where + " (evaluate)")
    except AssertionError as e:
        raise failure(transport, "mismatch")(str(e)) from None
    return "ran"


def over_scalar_cap(e: sg.SemigradError) -> bool:
    """Whether the scalar or JIT backend refused a graph whose scalar program would be past
    MAX_SCALARS (docs/limits.md: auto switches to the tensor plan there; the graph's elements
    do not bound it: an einsum's products count). FAILED_PRECONDITION naming the estimate."""
    from semigrad_server.runtime.scalarize import MAX_SCALARS

    found = re.search(r"about (\d+) scalar operations", e.message)
    return e.code == grpc.StatusCode.FAILED_PRECONDITION and found is not None and int(found.group(1)) > MAX_SCALARS


def scalar_refuses_ints(case, f) -> None:
    """Scalar programs hold bool and float64 values only: a graph with int64 indices is refused
    by declaration (FAILED_PRECONDITION naming the dtype), never run wrong; auto runs it as a
    tensor plan."""
    with pytest.raises(sg.SemigradError) as refused:
        f.evaluate(case.values, backend="scalar")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and "int64" in refused.value.message \
        or over_scalar_cap(refused.value), refused.value  # the size is checked first
    count("scalar refused (int64 values)")


_FAILURES: dict = {}


def failure(transport: str, kind: str) -> type:
    """An AssertionError subclass per kind of failure (an error status, or values that differ
    from the reference): hypothesis tells failures apart by type and shrinks each."""
    key = (transport, kind)
    if key not in _FAILURES:
        _FAILURES[key] = type(f"{kind.capitalize()}Through{transport.title().replace('_', '')}", (AssertionError,), {})
    return _FAILURES[key]


# make test: 44 cases per transport (~0.2-0.3 s each; 200 took 72 s of the fresh-clone run's 10
# minutes, 120 left it at 10.5 once the k-best and tanh kernels' cold compiles joined it, and 80
# at 595 s of 600 once top_paths' pruning tests did); `make fuzz` runs FUZZ_EXAMPLES
@pytest.mark.parametrize("transport", ["inline", "shared_memory"])
@settings(max_examples=FUZZ_EXAMPLES if FUZZ else 44)
@given(data=st.data())
def test_real_semiring_against_numpy(clients, vocabulary, transport, data):
    """Each case on every backend (scalar and JIT when the graph's scalar program is small
    enough to compile quickly), unary and streamed, inline or through shared memory (with the
    results written into the request's output regions)."""
    case = data.draw(cases(vocabulary, ops=FUZZ_OPS), label="case")
    first = stream_chunks(case)
    chunk_size = None if first is None else data.draw(
        st.sampled_from([None] + sorted({max(1, first // d) for d in (1, 2, 3, 7)})), label="chunk_size")
    # Scalar programs are compiled per graph (numba: ~7 ms an instruction): their size is time.
    backends = ["auto", "tensor"] + ["scalar"] * (case.item_elements() <= SCALAR_ELEMENTS and not case.has_ints())
    if case.item_elements() <= JIT_ELEMENTS and data.draw(st.integers(0, 7), label="jit") == 7 \
            and not case.has_ints() and (FUZZ or STATS.get("jit graphs", 0) < JIT_GRAPHS):
        backends.append("jit")
        count("jit graphs")
    start = time.perf_counter()
    reference = Reference(case, sample_items(case, np.random.default_rng(0)), np.random.default_rng(1))
    count("ms (reference)", int(1000 * (time.perf_counter() - start)))
    graphs = {transport: clients[transport].register(case.client_graph())}
    count("graphs")
    if case.has_ints() and case.item_elements() <= SCALAR_ELEMENTS:
        scalar_refuses_ints(case, graphs[transport])
    if max(math.prod(case.batch) * math.prod(n.shape) for n in case.nodes) >= LARGE:
        count(f"graphs with a value of ≥ {LARGE} elements")
    for backend in backends:
        for mode in ("unary", "stream"):
            if mode == "stream" and first is None:
                count("stream not applicable")
                continue
            note(f"running backend={backend} transport={transport} {mode}")
            start = time.perf_counter()
            count(f"{run_config(case, graphs, backend, transport, mode, chunk_size, reference)} ({backend})")
            count(f"ms ({backend})", int(1000 * (time.perf_counter() - start)))


# ---------------------------------------------------------------- thresholds too costly to cross by size


@pytest.mark.skipif(not FUZZ, reason="make fuzz only: its background compiles queue behind numba's one compiler lock "
                    "(a CI run waited 10 minutes behind an earlier test's compile); make test crosses both thresholds "
                    "in tests/runtime/test_plan.py (HOT_ELEMENTS) and tests/runtime/test_backends.py (SEGMENT_INSTRUCTIONS)")
@settings(max_examples=FUZZ_EXAMPLES // 8)
@given(data=st.data())
def test_hot_fused_groups_and_cut_jit_programs(clients, vocabulary, monkeypatch, data):
    """Two thresholds cost too much to cross by size in a bounded run: a fused group compiles
    into one numba ufunc after HOT_ELEMENTS (2^22) elements, and the JIT cuts programs past
    SEGMENT_INSTRUCTIONS (4,000; ~7 ms an instruction to compile). Lowered here (0 and 24) in
    this in-process server, every fused group compiles in the background at once and every
    JIT program of more than 24 instructions is cut into functions: each case runs before
    and after its groups compiled (tensor), and cut (jit), against the reference."""
    from semigrad_server.runtime import fusion, jit

    monkeypatch.setattr(fusion, "HOT_ELEMENTS", 0)
    monkeypatch.setattr(jit, "SEGMENT_INSTRUCTIONS", 24)
    compiled = []  # (group root, finished event)
    compile_group = fusion.compile_group

    def recorded(group, signature):
        done = threading.Event()
        compiled.append((group.root, done))
        try:
            return compile_group(group, signature)
        finally:
            done.set()

    monkeypatch.setattr(fusion, "compile_group", recorded)
    case = data.draw(cases(vocabulary, ops=FUZZ_OPS), label="case")
    reference = Reference(case, sample_items(case, np.random.default_rng(0)), np.random.default_rng(1))
    graphs = {"inline": clients["inline"].register(case.client_graph())}
    run_config(case, graphs, "tensor", "inline", "unary", None, reference)  # groups run member by member
    for _, done in compiled:
        assert done.wait(60), "a fused group's background compile did not finish"
    if compiled:
        count("graphs with fused groups compiled")
        run_config(case, graphs, "tensor", "inline", "unary", None, reference)  # now through the ufuncs
    if case.item_elements() <= JIT_ELEMENTS and not case.has_ints() \
            and (FUZZ or STATS.get("jit graphs cut into segments", 0) < 1):
        count("jit graphs cut into segments")
        run_config(case, graphs, "jit", "inline", "unary", None, reference)


WINDOWS = ("conv1d", "conv2d", "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d")
LOWERED_OFFSETS = 6  # MAX_WINDOW_OFFSETS in test_window_offsets_on_both_sides_of_their_cap


@settings(max_examples=FUZZ_EXAMPLES // 8 if FUZZ else 10)
@given(data=st.data())
def test_window_offsets_on_both_sides_of_their_cap(clients, vocabulary, data):
    """MAX_WINDOW_OFFSETS (4,096) costs seconds of compiling at the cap: lowered here to 6 in
    this in-process server, graphs of convs and pools whose windows visit up to 64 offsets
    are refused at registration (RESOURCE_EXHAUSTED naming the first node over the cap, by
    the count docs/limits.md gives) or run and match the reference."""
    from semigrad_server.ops import nn

    case = data.draw(cases(vocabulary, ops=WINDOWS), label="case")
    over = [n.id for n in case.nodes if n.op in WINDOWS and window_offsets(
        n.op, n.attrs, case.shape(n.inputs[0]), case.shape(n.inputs[1]) if len(n.inputs) > 1 else None) > LOWERED_OFFSETS]
    if over:
        with pytest.raises(sg.SemigradError) as refused, pytest.MonkeyPatch.context() as patch:
            patch.setattr(nn, "MAX_WINDOW_OFFSETS", LOWERED_OFFSETS)
            clients["inline"].register(case.client_graph())
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert f"'{over[0]}'" in refused.value.message and str(LOWERED_OFFSETS) in refused.value.message
        count("window graphs refused over the (lowered) offsets cap")
        return
    reference = Reference(case, sample_items(case, np.random.default_rng(0)), np.random.default_rng(1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nn, "MAX_WINDOW_OFFSETS", LOWERED_OFFSETS)
        graphs = {"inline": clients["inline"].register(case.client_graph())}
    run_config(case, graphs, "tensor", "inline", "unary", None, reference)
    count("window graphs under the (lowered) offsets cap" if any(n.op in WINDOWS for n in case.nodes) else
          "window graphs drawn without a window")


# ---------------------------------------------------------------- other semirings: path enumeration


def _installed():
    configs = []
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda ep: ep.name):
        if ep.name == "real":
            continue
        configs.append((ep.name, {"k": 3} if ep.name == "kbest" else {}))
    return configs


SEMIRINGS = _installed()
_OBJECTS: dict = {}


def semiring_object(name: str, params: dict):
    """The plugin's own semiring object, loaded straight from its entry point (the reference)."""
    key = (name, tuple(sorted(params.items())))
    if key not in _OBJECTS:
        (ep,) = [ep for ep in metadata.entry_points(group=GROUP) if ep.name == name]
        obj = ep.load()
        _OBJECTS[key] = (obj() if isinstance(obj, type) else obj).configure(params)
    return _OBJECTS[key]


@settings(max_examples=FUZZ_EXAMPLES if FUZZ else 100)
@given(seed=st.integers(0, 10**6), semiring=st.sampled_from(SEMIRINGS),
       backend=st.sampled_from(["auto", "tensor", "scalar", "jit"]), transport=st.sampled_from(["inline", "shared_memory"]),
       mode=st.sampled_from(["unary", "stream"]))
def test_semirings_against_path_enumeration(clients, seed, semiring, backend, transport, mode):
    """Small random graphs (tests/path_reference.py: batch axes on random subsets of the inputs)
    under every installed semiring, on every backend (the JIT refuses plugin semirings by
    declaration: FAILED_PRECONDITION), both transports, unary and streamed."""
    name, params = semiring
    c = random_case(seed)
    s = semiring_object(name, params)
    f = clients[transport].register(c.graph.client_graph())
    options = dict(seeds=c.seeds or None, semiring=name, semiring_params=params or None, backend=backend)
    if backend == "jit":  # numba code computes in floats: a plugin semiring is refused by declaration
        with pytest.raises(sg.SemigradError) as refused:
            f.gradient(c.inputs, **options)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and "jit" in refused.value.message
        count("semiring cases (jit refused)")
        return
    firsts = {v.shape[0] for k, v in c.inputs.items() if np.ndim(v) > len(c.graph.inputs[k])}
    if mode == "stream" and len(firsts) == 1:
        got = f.gradient_many(c.inputs, chunk_size=1, progress=False, **options)
    else:
        mode = "unary"
        got = f.gradient(c.inputs, return_components=True, **options)
    count(f"semiring cases ({mode})")
    where = f"seed {seed}, {name}{params or ''}, backend={backend} transport={transport} {mode}\n{c.graph.describe()}"
    for b in c.items():
        _, partials = c.item_partials(b)
        for x, shape in c.graph.inputs.items():
            assert np.shape(got[x]) == c.batch + shape, where
            for flat in range(math.prod(shape)):
                full = tuple(b) + tuple(int(i) for i in np.unravel_index(flat, shape))
                paths = [c.path_index(p) for p in c.graph.paths(x, flat)]
                want = s.read(over_paths(s, paths, partials))
                np.testing.assert_allclose(np.asarray(got[x])[full], want[s.primary], rtol=1e-9, atol=1e-12,
                                           err_msg=f"d/d{x}{list(full)}: {where}")
                if mode == "unary":
                    for key in want:
                        np.testing.assert_allclose(np.asarray(got.components[x][key])[full], want[key], rtol=1e-9,
                                                   atol=1e-12, err_msg=f"{key} of d/d{x}{list(full)}: {where}")
