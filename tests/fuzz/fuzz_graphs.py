"""Random graphs for the differential fuzzer (test_engine_differential.py), and an independent
NumPy reference for them.

* `Vocabulary`: the ops to draw, from the server's own op list (`Client.list_ops()`) and the op
  test table (`tests/test_op_gradients.py: CASES`). An elementwise op is drawn as soon as it has a
  single-op row in the table: the row's NumPy function is the reference, the row's samplers give
  its domain (an operand the row samples with anything but `normal`, such as log's positives or
  max's well-separated values, is a fresh input or const drawn by that sampler, never an
  intermediate value). Ops that take attributes (reductions, structural ops, matmul, where,
  comparisons) have builders below that draw their attributes; `Vocabulary.unfuzzed` lists any
  op of the server that neither covers, so a new op without a row fails the suite.
* `cases(vocabulary)`: a hypothesis strategy of `FuzzCase`s: a graph (chains of ops as users
  write them, every value nothing consumes an output), input values with batch axes on a random
  subset of the inputs (weights included, broadcast axes of size 1 included), optional output
  seeds, and sizes from a drawn regime (`REGIMES`) whose dimensions and batches sit on both
  sides of the engine's thresholds (test_engine_differential.py checks that they do).
  Hypothesis draws the regime, batch, number of ops and a seed; the graph comes from a NumPy
  generator with that seed (hypothesis's own choices repeat near-copies of earlier graphs in a
  short run).
* `FuzzCase.forward(item)`: a NumPy interpreter of one batch item (plain NumPy per op, written
  here, sharing nothing with the server's kernels), and `Reference`: each checked item's outputs,
  and central differences of Σ seed·outputs along a random direction, which the server's
  gradient of that item must match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import semigrad as sg
from hypothesis import reject, strategies as st

from test_op_gradients import CASES, build, distinct, normal, shifted

# Each case draws a regime: its item dimensions and batch shapes.
# * "narrow": dimensions up to 5 (scalar programs under auto: at most 16 elements per compute node),
#   batches on both sides of JIT_MIN_BATCH (255, 256) and with two batch axes;
# * "wide": dimensions 17 and 64 too (past 16 elements per node: auto takes the tensor plan), batches
#   of 76 and 77 (the shared-memory transformer batch);
# * "large": values of more than 2^15 elements, either one item of 182 × 182 (the issue's
#   `sum(tanh(x) @ W)`) or hundreds of items (buffer reuse, output regions, stream chunks).
REGIMES = {
    "narrow": ((1, 2, 3, 4, 5), ((), (1,), (2,), (3,), (7,), (2, 3), (5, 1), (3, 4), (255,), (256,))),
    "wide": ((1, 2, 3, 4, 5, 17, 64), ((), (2,), (7,), (76,), (77,), (3, 4))),
    "large": ((2, 3, 17, 64, 182), ((), (77,), (255,), (256,), (1000,))),
}
LARGE = 1 << 15  # "large" shapes reach this many elements over the batch (runtime/plan.py REUSE_MIN_ELEMENTS)
MAX_ITEM_ELEMENTS = 182 * 182  # per value and batch item
MAX_TOTAL_ELEMENTS = 1 << 19  # per value over the whole batch: bounds the fuzzer's run time
MAX_OPS = 8
TAME = 1e5  # every value's magnitude in a case (else the case is redrawn)

COMPARISONS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
               "eq": np.equal, "ne": np.not_equal}
FAMILY_DRAWS = ("elementwise",) * 4 + ("where", "reduction", "reduction", "structural", "structural") + ("matmul",) * 3 \
    + ("normalisation", "normalisation", "indexing", "indexing", "window", "window")
STRUCTURAL = ("sum", "mean", "max", "reshape", "transpose", "broadcast_to", "index", "concat", "stack",
              "matmul", "where")
# The ops with attributes merged after the first builders, by family (each has a builder below).
FAMILIES = {
    "reduction": ("sum", "mean", "max", "min", "logsumexp"),
    "matmul": ("matmul", "einsum"),
    "normalisation": ("softmax", "log_softmax", "layer_norm", "clamp", "cumsum"),
    "indexing": ("gather", "scatter_add", "argmax", "argmin"),
    "window": ("conv1d", "conv2d", "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"),
}
# Ops whose value has kinks (ties, bounds, the arg of a maximum): their operand is a fresh input
# or const of well-separated values (`distinct`), so central differences never straddle a kink.
KINKED = frozenset({"max", "min", "max_pool1d", "max_pool2d", "argmax", "argmin", "clamp"})


@dataclass(frozen=True)
class Elementwise:
    name: str
    arity: int
    reference: object  # the op table's NumPy function
    samplers: tuple  # one per operand: the op table's


class Vocabulary:
    """What to draw: every op the server lists, from the op table (elementwise) or a builder."""

    def __init__(self, ops):
        listed = {op.name: op for op in ops}
        self.elementwise: dict[str, Elementwise] = {}
        self.domains: dict[str, tuple] = {}  # op -> samplers of its single-op rows (restricted operands)
        for case in CASES:
            name, _, reference, shapes, samplers = case
            used = [n.op for n in build(case).to_proto().nodes]
            if len(used) != 1 or used[0] not in listed:
                continue
            op = used[0]
            self.domains.setdefault(op, tuple(samplers))
            if listed[op].kind == "elementwise" and reference is not None and op not in self.elementwise:
                self.elementwise[op] = Elementwise(op, len(samplers), reference, tuple(samplers))
        self.comparisons = [n for n in COMPARISONS if n in listed]
        self.structural = [n for n in STRUCTURAL if n in listed]
        built = [n for names in FAMILIES.values() for n in names if n in listed]
        self.names = sorted(self.elementwise) + self.comparisons + sorted(set(self.structural) | set(built))
        # Ops are drawn family first, so the graphs look like users' (matmul-heavy), whatever the
        # number of elementwise ops: a family's weight is its number of entries in FAMILY_DRAWS.
        self.families = {"elementwise": sorted(self.elementwise), "where": self.comparisons,
                         "structural": [n for n in STRUCTURAL if n in listed and n not in
                                        ("matmul", "where", "sum", "mean", "max")]}
        self.families.update({f: [n for n in names if n in listed] for f, names in FAMILIES.items()})
        self.unfuzzed = sorted(n for n, op in listed.items()
                               if n not in self.names and op.kind != "source")

    def restricted(self, op: str, position: int):
        """The sampler an operand must be drawn with (a fresh input or const), or None: any value."""
        if op in KINKED and position == 0:
            return distinct
        samplers = self.domains.get(op, ())
        if position < len(samplers) and samplers[position] is not normal:
            return samplers[position]
        return None


# ---------------------------------------------------------------- the graph


@dataclass
class Node:
    id: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict
    shape: tuple[int, ...]
    dtype: str = "float64"
    value: np.ndarray | None = None  # const nodes


@dataclass
class Input:
    name: str
    shape: tuple[int, ...]
    lead: tuple[int, ...]  # its batch axes (broadcast against the others')
    sampler: object
    dtype: str = "float64"  # int64: indices (no gradient, no perturbation)


@dataclass
class FuzzCase:
    vocabulary: Vocabulary = field(repr=False)
    inputs: dict[str, Input]
    nodes: list[Node]
    outputs: dict[str, str]
    values: dict[str, np.ndarray] = field(repr=False)
    seeds: dict[str, np.ndarray] = field(repr=False)
    batch: tuple[int, ...] = ()

    def _repr_pretty_(self, p, cycle) -> None:  # how hypothesis prints a failing case
        p.text(repr(self))

    def __repr__(self) -> str:
        lines = ["FuzzCase(batch=%s)" % (self.batch,)]
        for x in self.inputs.values():
            lines.append(f"  input {x.name} {list(x.shape)} {x.dtype} batch axes {list(x.lead)} "
                         f"({getattr(x.sampler, '__qualname__', x.sampler)})")
        for n in self.nodes:
            if n.op == "const":
                lines.append(f"  {n.id} {list(n.shape)} = const")
            else:
                attrs = "".join(f" {k}={v}" for k, v in n.attrs.items())
                lines.append(f"  {n.id} {list(n.shape)} = {n.op}({', '.join(n.inputs)}){attrs}")
        lines.append(f"  outputs {self.outputs}, seeds {'given' if self.seeds else '1'}")
        return "\n".join(lines)

    # ------------------------------------------------------------ sizes
    def shape(self, ref: str) -> tuple[int, ...]:
        return self.inputs[ref].shape if ref in self.inputs else self.node(ref).shape

    def node(self, ref: str) -> Node:
        return next(n for n in self.nodes if n.id == ref)

    def elements(self) -> int:
        """Elements of all values over the whole batch (a cost measure)."""
        n = max(1, math.prod(self.batch))
        return n * (sum(math.prod(x.shape) for x in self.inputs.values())
                    + sum(math.prod(node.shape) for node in self.nodes))

    def item_elements(self) -> int:
        return sum(math.prod(x.shape) for x in self.inputs.values()) + sum(math.prod(n.shape) for n in self.nodes)

    # ------------------------------------------------------------ the client graph
    def client_graph(self) -> sg.Graph:
        g = sg.Graph()
        h = {name: g.input(name, x.shape, dtype=x.dtype) for name, x in self.inputs.items()}
        for n in self.nodes:
            args = [h[r] for r in n.inputs]
            a = n.attrs
            if n.op == "const":
                h[n.id] = g.const(n.value, name=n.id)
            elif n.op in self.vocabulary.elementwise or n.op in COMPARISONS:
                h[n.id] = sg.elementwise(n.op, *args, name=n.id)
            elif n.op == "where":
                h[n.id] = sg.where(*args, name=n.id)
            elif n.op == "matmul":
                h[n.id] = sg.matmul(*args, name=n.id)
            elif n.op in ("sum", "mean", "max"):
                h[n.id] = getattr(sg, n.op)(args[0], a["axes"], a["keepdims"], name=n.id)
            elif n.op == "reshape":
                h[n.id] = sg.reshape(args[0], a["shape"], name=n.id)
            elif n.op == "transpose":
                h[n.id] = sg.transpose(args[0], a["perm"], name=n.id)
            elif n.op == "broadcast_to":
                h[n.id] = sg.broadcast_to(args[0], a["shape"], name=n.id)
            elif n.op == "index":
                h[n.id] = sg.index(args[0], a["index"], name=n.id)
            elif n.op in ("concat", "stack"):
                h[n.id] = getattr(sg, n.op)(args, axis=a["axis"], name=n.id)
            elif n.op in CLIENT_CALLS:
                h[n.id] = CLIENT_CALLS[n.op](a, *args, name=n.id)
            else:
                raise AssertionError(n.op)
        for name, ref in self.outputs.items():
            g.output(name, h[ref])
        return g

    # ------------------------------------------------------------ the reference
    def items(self) -> list[tuple]:
        return list(np.ndindex(*self.batch)) if self.batch else [()]

    def item(self, b: tuple, values: dict | None = None) -> dict[str, np.ndarray]:
        values = self.values if values is None else values
        return {k: np.broadcast_to(v, self.batch + self.inputs[k].shape)[b] for k, v in values.items()}

    def forward(self, item: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every value of one batch item: plain NumPy, op by op."""
        v = dict(item)
        with np.errstate(all="ignore"):
            for n in self.nodes:
                v[n.id] = np.asarray(self._apply(n, [v[r] for r in n.inputs]))
                assert v[n.id].shape == n.shape, (n.id, v[n.id].shape, n.shape)
        return v

    def _apply(self, n: Node, args: list):
        a = n.attrs
        if n.op == "const":
            return n.value
        if n.op in self.vocabulary.elementwise:
            return self.vocabulary.elementwise[n.op].reference(*args)
        if n.op in COMPARISONS:
            return COMPARISONS[n.op](*args)
        if n.op == "where":
            return np.where(*args)
        if n.op == "matmul":
            return np.matmul(*args)
        if n.op in ("sum", "mean", "max"):
            axes = None if a["axes"] is None else tuple(a["axes"])
            return {"sum": np.sum, "mean": np.mean, "max": np.max}[n.op](args[0], axis=axes, keepdims=a["keepdims"])
        if n.op == "reshape":
            return np.reshape(args[0], a["shape"])
        if n.op == "transpose":
            return np.transpose(args[0], a["perm"])
        if n.op == "broadcast_to":
            return np.broadcast_to(args[0], a["shape"])
        if n.op == "index":
            return args[0][a["index"]]
        if n.op == "concat":
            return np.concatenate(args, axis=a["axis"])
        if n.op == "stack":
            return np.stack(args, axis=a["axis"])
        if n.op in REFERENCES:
            return REFERENCES[n.op](a, *args)
        raise AssertionError(n.op)

    def total(self, values: dict, b: tuple) -> tuple[float, float]:
        """Σ seed·output of one item (seed 1 without seeds), and Σ |seed·output| (its rounding's scale)."""
        out = magnitude = 0.0
        for name, ref in self.outputs.items():
            seed = np.broadcast_to(self.seeds[name], self.batch + self.shape(ref))[b] if self.seeds else 1.0
            terms = values[ref] * seed
            out += float(np.sum(terms))
            magnitude += float(np.sum(np.abs(terms)))
        return out, magnitude

    def float_inputs(self) -> list[str]:
        return [k for k, x in self.inputs.items() if x.dtype == "float64"]

    def has_ints(self) -> bool:
        """Whether an int64 value is in the graph (scalar programs refuse it by declaration)."""
        return any(x.dtype != "float64" for x in self.inputs.values()) or \
            any(n.dtype not in ("float64", "bool") for n in self.nodes)


class Reference:
    """What the interpreter says about some batch items of a case, computed once for every
    configuration the case runs on: each item's outputs, and the central difference of
    Σ seed·outputs along a random direction v (each element moving in proportion to its
    magnitude), which <gradient of the item, v> must match."""

    H = 1e-6

    def __init__(self, case: FuzzCase, items: list[tuple], rng: np.random.Generator):
        self.case, self.items = case, items
        self.outputs, self.directions, self.differences = {}, {}, {}
        floats = case.float_inputs()
        for b in items:
            item = {k: np.array(v, dtype=case.inputs[k].dtype) for k, v in case.item(b).items()}
            values = case.forward(item)
            self.outputs[b] = {name: values[ref] for name, ref in case.outputs.items()}
            v = {k: rng.normal(size=item[k].shape) * np.maximum(1.0, np.abs(item[k])) for k in floats}
            up, up_terms = case.total(case.forward({**item, **{k: item[k] + self.H * v[k] for k in floats}}), b)
            down, down_terms = case.total(case.forward({**item, **{k: item[k] - self.H * v[k] for k in floats}}), b)
            self.directions[b] = v
            # rounding in the totals, amplified by the division by 2h, is part of the tolerance; a
            # total that cancels (Σ of a layer_norm's or softmax's outputs) rounds like its terms
            rounding = 1e-9 * (abs(up) + abs(down)) + 1e-14 * (up_terms + down_terms)
            self.differences[b] = ((up - down) / (2 * self.H), rounding / self.H)

    def check_outputs(self, got: dict, items: list[tuple], where: str) -> None:
        for name, ref in self.case.outputs.items():
            full = np.broadcast_to(np.asarray(got[name]), self.case.batch + self.case.shape(ref))
            for b in items:
                want = self.outputs[b][name]
                scale = 1.0 + float(np.max(np.abs(want))) if want.size else 1.0
                np.testing.assert_allclose(full[b], want, rtol=1e-9, atol=1e-9 * scale,
                                           err_msg=f"{where}: output {name}, item {b}")

    def check_gradients(self, grads: dict, where: str) -> None:
        ints = sorted(set(self.case.inputs) - set(self.case.float_inputs()))
        assert not any(k in grads for k in ints), f"{where}: a gradient for the int64 input(s) {ints}"
        for x in self.case.float_inputs():
            spec = self.case.inputs[x]
            assert np.shape(grads[x]) == self.case.batch + spec.shape, (
                f"{where}: the gradient for {x} has shape {np.shape(grads[x])}, not {self.case.batch + spec.shape}")
        for b in self.items:
            fd, rounding = self.differences[b]
            terms = [np.asarray(grads[k])[b] * v for k, v in self.directions[b].items()]
            got = float(sum(np.sum(t) for t in terms))
            magnitude = float(sum(np.sum(np.abs(t)) for t in terms))
            tolerance = 1e-6 * (abs(fd) + magnitude) + rounding + 1e-9
            assert abs(got - fd) <= tolerance, (
                f"{where}: item {b}: <gradient, v> = {got!r}, central differences {fd!r} (tolerance {tolerance:.3g})")


# ---------------------------------------------------------------- the strategy


class rs:
    """The few strategies the builder uses, drawn from a NumPy generator instead of hypothesis:
    hypothesis's own generation repeats near-copies of earlier graphs in a short run, while a
    seeded generator gives a new graph every example (hypothesis still draws the regime, batch,
    number of ops and the seed, and shrinks those)."""

    @staticmethod
    def integers(lo, hi):
        return lambda rng: int(rng.integers(lo, hi + 1))

    @staticmethod
    def sampled_from(options):
        options = list(options)
        return lambda rng: options[int(rng.integers(len(options)))]

    @staticmethod
    def booleans():
        return lambda rng: bool(rng.integers(2))

    @staticmethod
    def lists(element, min_size, max_size):
        return lambda rng: [element(rng) for _ in range(int(rng.integers(min_size, max_size + 1)))]

    @staticmethod
    def permutations(values):
        values = list(values)
        return lambda rng: [values[i] for i in rng.permutation(len(values))]

    @staticmethod
    def none():
        return lambda rng: None

    @staticmethod
    def one_of(*options):
        return lambda rng: options[int(rng.integers(len(options)))](rng)


class _Builder:
    def __init__(self, vocabulary: Vocabulary, batch: tuple, rng: np.random.Generator, dims: tuple):
        """`rng` draws the structure (`draw(rs.…)`) and the const values."""
        self.v, self.batch, self.rng, self.dims = vocabulary, batch, rng, dims
        self.draw = lambda choice: choice(rng)
        self.large = dims == REGIMES["large"][0]
        self.inputs: dict[str, Input] = {}
        self.nodes: list[Node] = []
        self.shapes: dict[str, tuple] = {}
        self.floats: list[str] = []  # float refs an op may consume

    # -- sizes
    def fits(self, shape) -> bool:
        n = math.prod(shape)
        return n <= MAX_ITEM_ELEMENTS and n * max(1, math.prod(self.batch)) <= MAX_TOTAL_ELEMENTS \
            and len(shape) <= 4

    def dim(self) -> int:
        return self.draw(rs.sampled_from(self.dims))

    def new_shape(self, rank: int | None = None) -> tuple:
        """A shape that fits; in the "large" regime, preferably one of at least 2^15 elements over the batch."""
        fitting = (1,) * (rank or 0)
        for _ in range(8 if self.large else 4):
            r = self.draw(rs.integers(0, 3)) if rank is None else rank
            shape = tuple(self.dim() for _ in range(r))
            if self.fits(shape):
                fitting = shape
                if not self.large or math.prod(shape) * max(1, math.prod(self.batch)) >= LARGE:
                    break
        return fitting

    # -- leaves
    def fresh(self, shape: tuple, sampler=normal, dtype: str = "float64") -> str:
        """A new input (with or without batch axes) or, sometimes, a const, drawn by `sampler`."""
        if self.inputs and self.draw(rs.integers(0, 9)) < 2:
            ref = f"c{len(self.nodes)}"
            value = np.asarray(sampler(self.rng, shape), dtype=dtype)
            self.nodes.append(Node(ref, "const", (), {}, shape, dtype, value=value))
        else:
            ref = f"x{len(self.inputs)}"
            kind = self.draw(rs.sampled_from(("none",) * 3 + ("full",) * 4 + ("ones", "suffix") * 2))
            if not self.batch or kind == "none":
                lead = ()
            elif kind == "full":
                lead = self.batch
            elif kind == "ones":  # some batch axes of size 1 (broadcast)
                lead = tuple(d if self.draw(rs.booleans()) else 1 for d in self.batch)
            else:
                lead = self.batch[self.draw(rs.integers(0, len(self.batch))):]
            self.inputs[ref] = Input(ref, shape, lead, sampler, dtype)
        self.shapes[ref] = shape
        if sampler is normal and dtype == "float64":
            self.floats.append(ref)
        return ref

    def operand(self, op: str, position: int, shape_ok=lambda s: True, make=None) -> str | None:
        """An existing value that fits (recent ones first) or a fresh leaf, respecting the op's domain."""
        sampler = self.v.restricted(op, position)
        if sampler is None:
            options = [r for r in self.floats if shape_ok(self.shapes[r])]
            if options and self.draw(rs.integers(0, 9)) < 8:  # chains, as users write them: the latest value mostly
                return options[-1] if self.draw(rs.booleans()) else options[self.draw(rs.integers(0, len(options) - 1))]
        shape = make() if make else None
        if shape is None or not shape_ok(shape) or not self.fits(shape):
            return None
        return self.fresh(shape, sampler or normal)

    def add(self, op, inputs, attrs, shape, dtype="float64") -> str | None:
        if not self.fits(shape):
            return None
        ref = f"n{len(self.nodes)}"
        self.nodes.append(Node(ref, op, tuple(inputs), attrs, tuple(shape), dtype))
        self.shapes[ref] = tuple(shape)
        if dtype == "float64":
            self.floats.append(ref)
        return ref

    # -- ops
    def build(self, op: str) -> str | None:
        if op in self.v.elementwise:
            return self.elementwise(op)
        if op in COMPARISONS:  # a comparison is drawn as the condition of a where
            return self.where(op)
        return getattr(self, op)()

    def elementwise(self, op: str) -> str | None:
        arity = self.v.elementwise[op].arity
        x = self.operand(op, 0, make=self.new_shape)
        if x is None:
            return None
        args = [x]
        for k in range(1, arity):
            sx = self.shapes[x]
            if self.v.restricted(op, k) is None and self.v.restricted(op, 0) is None \
                    and self.draw(rs.integers(0, 4)) == 0:
                args.append(x)  # the same value twice (x*x: two edges per element)
                continue
            partner = self.draw(rs.sampled_from(("same", "suffix", "ones")))  # a broadcasting partner
            if partner == "same" or not sx:
                target = sx
            elif partner == "suffix":
                target = sx[self.draw(rs.integers(0, len(sx))):]
            else:
                target = tuple(d if self.draw(rs.booleans()) else 1 for d in sx)
            y = self.operand(op, k, lambda s, t=target: s == t, lambda t=target: t)
            if y is None:
                return None
            args.append(y)
        if arity == 2 and self.v.restricted(op, 0) is self.v.restricted(op, 1) and self.draw(rs.booleans()):
            args.reverse()
        shape = tuple(np.broadcast_shapes(*(self.shapes[a] for a in args)))
        return self.add(op, args, {}, shape)

    def where(self, comparison: str | None = None) -> str | None:
        comparison = comparison or self.draw(rs.sampled_from(self.v.comparisons))
        shape = self.new_shape()
        # the condition compares well-separated fresh values: no ties, no kinks near the point
        c0 = self.fresh(shape, distinct)
        c1 = self.fresh(tuple(shape[self.draw(rs.integers(0, len(shape))):]), shifted)
        cond = self.add(comparison, (c0, c1), {}, shape, dtype="bool")
        if cond is None:
            return None
        a = self.operand("where", 1, lambda s: _broadcasts(s, shape), lambda: shape)
        b = self.operand("where", 2, lambda s: _broadcasts(s, shape), lambda: shape)
        if a is None or b is None:
            return None
        return self.add("where", (cond, a, b), {}, shape)

    def matmul(self) -> str | None:
        a = self.operand("matmul", 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if a is None:
            return None
        sa = self.shapes[a]
        left = self.draw(rs.booleans())  # a as the left operand, else as the right one
        k = sa[-1] if left or len(sa) == 1 else sa[-2]
        # the partner: 1-D, 2-D, or with item batch axes of its own (broadcast against a's);
        # its new dimension is one whose result fits
        rank = self.draw(rs.sampled_from((1, 2, 2, 2, 3)))  # mostly a matrix of weights
        lead = () if rank < 3 else (self.draw(rs.sampled_from((1, 2, 3) if len(sa) < 3 else (1, sa[-3]))),)
        candidates = []
        for n in self.dims:
            core = (k, n) if left else (n, k)
            partner = (k,) if rank == 1 else lead + core
            try:
                x, y = (sa, partner) if left else (partner, sa)
                shape = np.matmul(np.zeros(x), np.zeros(y)).shape
            except ValueError:
                continue
            if self.fits(shape) and self.fits(partner):
                candidates.append((partner, shape))
        if not candidates:
            return None
        partner, shape = self.draw(rs.sampled_from(candidates))
        b = self.operand("matmul", 1, lambda s: s == partner, lambda: partner)
        if b is None:
            return None
        return self.add("matmul", (a, b) if left else (b, a), {}, shape)

    def _reduction(self, op: str) -> str | None:
        x = self.operand(op, 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        if self.draw(rs.integers(0, 3)) == 0:
            axes = None
        else:
            chosen = sorted(set(self.draw(rs.lists(rs.integers(0, len(sx) - 1), min_size=1, max_size=len(sx)))))
            axes = tuple(a - len(sx) if self.draw(rs.booleans()) else a for a in chosen)
        keepdims = self.draw(rs.booleans())
        norm = set(range(len(sx))) if axes is None else {a % len(sx) for a in axes}
        shape = tuple((1 if i in norm else d) for i, d in enumerate(sx) if keepdims or i not in norm)
        return self.add(op, (x,), {"axes": axes, "keepdims": keepdims}, shape)

    def sum(self):
        return self._reduction("sum")

    def mean(self):
        return self._reduction("mean")

    def max(self):
        return self._reduction("max")

    def reshape(self) -> str | None:
        x = self.operand("reshape", 0, make=self.new_shape)
        if x is None:
            return None
        sx = self.shapes[x]
        size = math.prod(sx)
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        d = self.draw(rs.sampled_from(divisors))
        target = self.draw(rs.sampled_from(((size,), (d, size // d), (size // d, 1, d), (1, size))))
        if target == sx:
            return None
        spec = list(target)
        if self.draw(rs.booleans()) and spec:
            spec[self.draw(rs.integers(0, len(spec) - 1))] = -1
        return self.add("reshape", (x,), {"shape": tuple(spec)}, target)

    def transpose(self) -> str | None:
        x = self.operand("transpose", 0, lambda s: len(s) >= 2, lambda: self.new_shape(self.draw(rs.integers(2, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        perm = None if self.draw(rs.integers(0, 3)) == 0 else tuple(self.draw(rs.permutations(range(len(sx)))))
        return self.add("transpose", (x,), {"perm": perm}, np.transpose(np.empty(sx), perm).shape)

    def broadcast_to(self) -> str | None:
        x = self.operand("broadcast_to", 0, make=self.new_shape)
        if x is None:
            return None
        sx = self.shapes[x]
        target = tuple(self.dim() if d == 1 and self.draw(rs.booleans()) else d for d in sx)
        if self.draw(rs.booleans()) or target == sx:
            target = (self.dim(),) + target
        return self.add("broadcast_to", (x,), {"shape": target}, target)

    def index(self) -> str | None:
        x = self.operand("index", 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        key = []
        for d in sx[: self.draw(rs.integers(1, len(sx)))]:
            if self.draw(rs.integers(0, 2)) == 0:
                key.append(self.draw(rs.integers(-d, d - 1)))
            else:
                step = self.draw(rs.sampled_from((1, 1, 2, -1, -3)))
                start = self.draw(rs.one_of(rs.none(), rs.integers(-d, d - 1)))
                stop = self.draw(rs.one_of(rs.none(), rs.integers(-d - 1, d)))
                key.append(slice(start, stop, step))
        key = tuple(key)
        shape = np.empty(sx)[key].shape
        if 0 in shape:
            return None
        return self.add("index", (x,), {"index": key}, shape)

    def concat(self) -> str | None:
        x = self.operand("concat", 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        axis = self.draw(rs.integers(-len(sx), len(sx) - 1))
        other = list(sx)
        other[axis] = self.dim()
        other = tuple(other)
        y = x if self.draw(rs.integers(0, 3)) == 0 else self.operand("concat", 1, lambda s: s == other, lambda: other)
        if y is None:
            return None
        args = (x, y) if self.draw(rs.booleans()) else (y, x)
        shape = np.concatenate([np.empty(self.shapes[r]) for r in args], axis=axis).shape
        return self.add("concat", args, {"axis": axis}, shape)

    def stack(self) -> str | None:
        x = self.operand("stack", 0, make=self.new_shape)
        if x is None:
            return None
        sx = self.shapes[x]
        y = x if self.draw(rs.integers(0, 3)) == 0 else self.operand("stack", 1, lambda s: s == sx, lambda: sx)
        if y is None:
            return None
        axis = self.draw(rs.integers(-len(sx) - 1, len(sx)))
        return self.add("stack", (x, y), {"axis": axis}, np.stack([np.empty(sx)] * 2, axis=axis).shape)

    # -- ops with attributes merged after the first builders
    def min(self):
        return self._reduction("min")

    def logsumexp(self):
        return self._reduction("logsumexp")

    def _along_axis(self, op: str) -> str | None:
        x = self.operand(op, 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        return self.add(op, (x,), {"axis": self.draw(rs.integers(-len(sx), len(sx) - 1))}, sx)

    def softmax(self):
        return self._along_axis("softmax")

    def log_softmax(self):
        return self._along_axis("log_softmax")

    def cumsum(self):
        return self._along_axis("cumsum")

    def layer_norm(self) -> str | None:
        x = self.operand("layer_norm", 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        chosen = sorted(set(self.draw(rs.lists(rs.integers(0, len(sx) - 1), min_size=1, max_size=len(sx)))))
        axes = tuple(a - len(sx) if self.draw(rs.booleans()) else a for a in chosen)
        return self.add("layer_norm", (x,), {"axes": axes, "eps": self.draw(rs.sampled_from((1e-5, 0.1, 1.0)))}, sx)

    def clamp(self) -> str | None:
        # distinct values lie within 0.1 of a multiple of 0.5: bounds half-way between two
        x = self.operand("clamp", 0, make=self.new_shape)
        if x is None:
            return None
        n = math.prod(self.shapes[x])
        lo, hi = sorted(0.5 * self.draw(rs.integers(-1, n)) + 0.25 for _ in range(2))
        bounds = self.draw(rs.sampled_from(({"min": lo, "max": hi}, {"min": lo}, {"max": hi})))
        return self.add("clamp", (x,), bounds, self.shapes[x])

    # indices: int64 inputs (batch axes too) or consts in [-n, n), or the argmax/argmin of a
    # fresh value whose arg-reduced axis is at most n long
    def indices(self, shape: tuple, n: int, source: str | None = None) -> str | None:
        source = source or self.draw(rs.sampled_from(("input", "input", "input", "argmax", "argmin")))
        if source == "input":
            return self.fresh(shape, index_sampler(n), dtype="int64")
        ones = [j for j, d in enumerate(shape) if d == 1]
        form = self.draw(rs.sampled_from(("axis", "axis", "keepdims", "flat")))
        if form == "flat" and shape in ((), (1,) * len(shape)):  # the index into the flattened value
            zs = tuple(self.draw(rs.integers(1, 3)) for _ in shape) or (self.draw(rs.integers(1, 3)),)
            zs = zs if math.prod(zs) <= n else (1,) * len(zs)
            attrs = {"axis": None, "keepdims": bool(shape)}
        elif form == "keepdims" and ones:  # along an axis kept as 1
            axis = self.draw(rs.sampled_from(ones))
            zs = shape[:axis] + (self.draw(rs.integers(1, n)),) + shape[axis + 1:]
            attrs = {"axis": axis, "keepdims": True}
        else:  # along an axis of length at most n, inserted anywhere
            axis = self.draw(rs.integers(0, len(shape)))
            zs = shape[:axis] + (self.draw(rs.integers(1, n)),) + shape[axis:]
            attrs = {"axis": axis, "keepdims": False}
        if attrs["axis"] is not None and self.draw(rs.booleans()):
            attrs["axis"] -= len(zs)
        if not self.fits(zs):
            return None
        z = self.fresh(zs, distinct)
        return self.add(source, (z,), attrs, shape, dtype="int64")

    def gather(self, source: str | None = None) -> str | None:
        x = self.operand("gather", 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if x is None:
            return None
        sx = self.shapes[x]
        axis = self.draw(rs.integers(-len(sx), len(sx) - 1))
        a = axis % len(sx)
        ishape = tuple(self.draw(rs.sampled_from(self.dims[:4])) for _ in range(self.draw(rs.integers(0, 2))))
        shape = sx[:a] + ishape + sx[a + 1:]
        if not self.fits(shape):
            return None
        idx = self.indices(ishape, sx[a], source)
        if idx is None:
            return None
        return self.add("gather", (x, idx), {"axis": axis}, shape)

    def argmax(self):
        return self.gather("argmax")

    def argmin(self):
        return self.gather("argmin")

    def scatter_add(self) -> str | None:
        u = self.operand("scatter_add", 0, lambda s: len(s) >= 1, lambda: self.new_shape(self.draw(rs.integers(1, 3))))
        if u is None:
            return None
        su = self.shapes[u]
        a = self.draw(rs.integers(0, len(su) - 1))
        q = self.draw(rs.integers(0, min(2, len(su) - a)))
        size = self.draw(rs.sampled_from(self.dims))
        shape = su[:a] + (size,) + su[a + q:]
        if not self.fits(shape):
            return None
        idx = self.indices(su[a:a + q], size)
        if idx is None:
            return None
        axis = a - len(shape) if self.draw(rs.booleans()) else a
        return self.add("scatter_add", (u, idx), {"size": size, "axis": axis}, shape)

    def einsum(self) -> str | None:
        """Random subscripts: 1-3 operands, letters shared between terms (contractions, outer
        products), sometimes one batch letter in every term, and an explicit output (any subset
        of the letters, any order) or NumPy's implicit one (the letters used once, sorted)."""
        x = self.operand("einsum", 0, lambda s: len(s) <= 3, lambda: self.new_shape(self.draw(rs.integers(0, 3))))
        if x is None:
            return None
        pool = list(self.rng.permutation(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")))
        sizes: dict[str, int] = {}
        terms = ["".join(pool.pop() for _ in self.shapes[x])]
        sizes.update(zip(terms[0], self.shapes[x]))
        batch = terms[0][0] if terms[0] and self.draw(rs.integers(0, 2)) == 0 else None
        args = [x]
        for k in range(1, self.draw(rs.integers(1, 3))):
            term = batch or ""
            for _ in range(self.draw(rs.integers(0, 2 if batch else 3))):
                shared = [c for c in sizes if c not in term]
                if shared and self.draw(rs.booleans()):
                    term += self.draw(rs.sampled_from(shared))
                else:
                    c = pool.pop()
                    sizes[c] = self.dim()
                    term += c
            shape = tuple(sizes[c] for c in term)
            if math.prod(sizes.values()) > EINSUM_PRODUCTS or not self.fits(shape):
                return None
            y = self.operand("einsum", k, lambda s, t=shape: s == t, lambda t=shape: t)
            if y is None:
                return None
            terms.append(term)
            args.append(y)
        if math.prod(sizes.values()) > EINSUM_PRODUCTS:
            return None
        used = "".join(terms)
        if self.draw(rs.integers(0, 3)) == 0:
            out = "".join(sorted(c for c in sizes if used.count(c) == 1))
            subscripts = ",".join(terms)
        else:
            out = "".join(c for c in self.rng.permutation(list(sizes)) if self.draw(rs.booleans()))
            if batch and batch not in out and self.draw(rs.booleans()):
                out = batch + out
            subscripts = ",".join(terms) + "->" + out
        return self.add("einsum", args, {"subscripts": subscripts}, tuple(sizes[c] for c in out))

    def _window_input(self, op: str, nd: int) -> str | None:
        def make():
            spatial = tuple(self.draw(rs.sampled_from(self.dims)) for _ in range(nd))
            shape = (self.draw(rs.integers(1, 3)), self.draw(rs.sampled_from((1, 2, 3, 4, 6)))) + spatial
            return shape if self.fits(shape) else (1, 1) + spatial
        return self.operand(op, 0, lambda s: len(s) == nd + 2, make)

    def _geometry(self, spatial, nd: int, pool: bool):
        """kernel, stride, padding, dilation (each one int per spatial axis) whose windows fit."""
        for _ in range(4):
            kernel = tuple(self.draw(rs.sampled_from((1, 2, 3, 3, min(s, 5), s))) for s in spatial)
            if math.prod(kernel) > WINDOW_OFFSETS:
                continue
            stride = tuple(self.draw(rs.integers(1, 3)) for _ in range(nd))
            dilation = (1,) * nd if pool else tuple(self.draw(rs.integers(1, 2)) for _ in range(nd))
            padding = tuple(self.draw(rs.integers(0, k // 2 if pool else 2)) for k in kernel)
            if all(s + 2 * p - d * (k - 1) - 1 >= 0 for s, k, p, d in zip(spatial, kernel, padding, dilation)):
                return kernel, stride, padding, dilation
        return None

    def _spelled(self, values: tuple):
        """An attribute as users pass it: one int for every axis when they agree, or one per axis."""
        return values[0] if len(set(values)) == 1 and self.draw(rs.booleans()) else values

    def _conv(self, nd: int) -> str | None:
        op = f"conv{nd}d"
        x = self._window_input(op, nd)
        if x is None:
            return None
        sx = self.shapes[x]
        c, spatial = sx[1], sx[2:]
        geometry = self._geometry(spatial, nd, pool=False)
        if geometry is None:
            return None
        kernel, stride, padding, dilation = geometry
        groups = self.draw(rs.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
        ws = (groups * self.draw(rs.integers(1, 3)), c // groups) + kernel
        w = self.operand(op, 1, lambda s: s == ws, lambda: ws)
        if w is None:
            return None
        out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                    for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation))
        attrs = {"stride": self._spelled(stride), "padding": self._spelled(padding),
                 "dilation": self._spelled(dilation), "groups": groups}
        return self.add(op, (x, w), attrs, (sx[0], ws[0]) + out)

    def conv1d(self):
        return self._conv(1)

    def conv2d(self):
        return self._conv(2)

    def _pool(self, kind: str, nd: int) -> str | None:
        op = f"{kind}_pool{nd}d"
        x = self._window_input(op, nd)
        if x is None:
            return None
        sx = self.shapes[x]
        geometry = self._geometry(sx[2:], nd, pool=True)
        if geometry is None:
            return None
        kernel, stride, padding, _ = geometry
        out = tuple((s + 2 * p - k) // st + 1 for s, k, st, p in zip(sx[2:], kernel, stride, padding))
        attrs = {"kernel_size": self._spelled(kernel), "padding": self._spelled(padding),
                 "stride": None if stride == kernel and self.draw(rs.booleans()) else self._spelled(stride)}
        if attrs["stride"] is None:
            out = tuple((s + 2 * p - k) // k + 1 for s, k, p in zip(sx[2:], kernel, padding))
        return self.add(op, (x,), attrs, sx[:2] + out)

    def max_pool1d(self):
        return self._pool("max", 1)

    def max_pool2d(self):
        return self._pool("max", 2)

    def avg_pool1d(self):
        return self._pool("avg", 1)

    def avg_pool2d(self):
        return self._pool("avg", 2)


def index_sampler(n: int):
    """int64 indices in [-n, n) (negative ones count from the end; repeats add up in scatters)."""

    def sample(rng, shape):
        return rng.integers(-n, n, size=shape)

    sample.__qualname__ = f"indices in [-{n}, {n})"
    return sample


WINDOW_OFFSETS = 64  # kernel offsets of a conv or pool (each is a step of its kernel and adjoint)
EINSUM_PRODUCTS = 1 << 16  # the product of an einsum's letter sizes per item (the reference's np.einsum work)


# ---------------------------------------------------------------- references of the ops with attributes
# Plain NumPy, per item, written here from each op's definition (docs/conventions.md); nothing is
# shared with the server's kernels.


def _axes(a):
    return None if a.get("axes") is None else tuple(a["axes"])


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _logsumexp(a, x):
    axes = _axes(a)
    m = np.max(x, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return out if a["keepdims"] else np.squeeze(out, axis=axes)


def _layer_norm(a, x):
    axes = tuple(a["axes"])
    centred = x - np.mean(x, axis=axes, keepdims=True)
    return centred / np.sqrt(np.mean(centred * centred, axis=axes, keepdims=True) + a["eps"])


def _clamp(a, x):
    if "min" in a:
        x = np.where(x < a["min"], a["min"], x)
    if "max" in a:
        x = np.where(x > a["max"], a["max"], x)
    return x


def _arg(fn):
    def reference(a, x):
        if a["axis"] is None:
            i = fn(x.reshape(-1))
            return np.reshape(i, (1,) * x.ndim) if a["keepdims"] else np.asarray(i)
        return fn(x, axis=a["axis"], keepdims=a["keepdims"])
    return reference


def _scatter_add(a, u, idx):
    size, q = a["size"], idx.ndim
    axis = a["axis"] % (u.ndim - q + 1)
    out = np.zeros(u.shape[:axis] + (size,) + u.shape[axis + q:])
    for k in np.ndindex(*idx.shape):  # one index at a time, wrapped as NumPy wraps negative ones
        out[(slice(None),) * axis + (idx[k] % size,)] += u[(slice(None),) * axis + k]
    return out


def _per_axis(value, nd):
    return tuple(value) if isinstance(value, tuple) else (value,) * nd


def window_offsets(op: str, attrs: dict, x_shape: tuple, w_shape: tuple | None) -> int:
    """The kernel offsets a conv or pool visits, as docs/limits.md counts them: every offset of
    a conv's kernel; for a pool, per axis the offsets k in [p - (OS-1)·s, p + S - 1] (the only
    ones that can read an input element)."""
    nd = len(x_shape) - 2
    if op.startswith("conv"):
        return math.prod(w_shape[2:])
    kernel = _per_axis(attrs["kernel_size"], nd)
    stride = kernel if attrs["stride"] is None else _per_axis(attrs["stride"], nd)
    padding = _per_axis(attrs["padding"], nd)
    count = 1
    for size, k, s, p in zip(x_shape[2:], kernel, stride, padding):
        out = (size + 2 * p - k) // s + 1
        count *= max(0, min(k - 1, p + size - 1) - max(0, p - (out - 1) * s) + 1)
    return count


def _windows(xp, kernel, stride, dilation, out):
    """(offset, what offset reads in every window) over the padded item `xp` (N, C, *S)."""
    for k in np.ndindex(*kernel):
        index = tuple(slice(k[i] * dilation[i], k[i] * dilation[i] + stride[i] * (out[i] - 1) + 1, stride[i])
                      for i in range(len(kernel)))
        yield k, xp[(slice(None), slice(None)) + index]


def _conv(a, x, w):
    nd = x.ndim - 2
    stride, padding, dilation = (_per_axis(a[k], nd) for k in ("stride", "padding", "dilation"))
    groups, kernel = a["groups"], w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    out_sp = tuple((x.shape[2 + i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
                   for i in range(nd))
    out = np.zeros((x.shape[0], w.shape[0]) + out_sp)
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    for k, window in _windows(xp, kernel, stride, dilation, out_sp):
        for g in range(groups):
            for o in range(g * og, (g + 1) * og):
                for c in range(cg):
                    out[:, o] += w[(o, c) + k] * window[:, g * cg + c]
    return out


def _pool(kind):
    def reference(a, x):
        nd = x.ndim - 2
        kernel = _per_axis(a["kernel_size"], nd)
        stride = kernel if a["stride"] is None else _per_axis(a["stride"], nd)
        padding = _per_axis(a["padding"], nd)
        xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding], constant_values=-np.inf if kind == "max" else 0.0)
        out_sp = tuple((x.shape[2 + i] + 2 * padding[i] - kernel[i]) // stride[i] + 1 for i in range(nd))
        out = np.full(x.shape[:2] + out_sp, -np.inf if kind == "max" else 0.0)
        for _, window in _windows(xp, kernel, stride, (1,) * nd, out_sp):
            out = np.maximum(out, window) if kind == "max" else out + window
        return out if kind == "max" else out / math.prod(kernel)
    return reference


REFERENCES = {
    "min": lambda a, x: np.min(x, axis=_axes(a), keepdims=a["keepdims"]),
    "logsumexp": _logsumexp,
    "softmax": lambda a, x: _softmax(x, a["axis"]),
    "log_softmax": lambda a, x: np.log(_softmax(x, a["axis"])),
    "cumsum": lambda a, x: np.cumsum(x, axis=a["axis"]),
    "layer_norm": _layer_norm,
    "clamp": _clamp,
    "argmax": _arg(np.argmax),
    "argmin": _arg(np.argmin),
    "gather": lambda a, x, idx: np.take(x, idx, axis=a["axis"]),
    "scatter_add": _scatter_add,
    "einsum": lambda a, *xs: np.einsum(a["subscripts"], *xs, optimize=False),
    "conv1d": _conv,
    "conv2d": _conv,
    "max_pool1d": _pool("max"),
    "max_pool2d": _pool("max"),
    "avg_pool1d": _pool("avg"),
    "avg_pool2d": _pool("avg"),
}

# How a user writes each of them with the client.
CLIENT_CALLS = {
    "min": lambda a, x, name: sg.min(x, a["axes"], a["keepdims"], name=name),
    "logsumexp": lambda a, x, name: sg.logsumexp(x, a["axes"], a["keepdims"], name=name),
    "softmax": lambda a, x, name: sg.softmax(x, a["axis"], name=name),
    "log_softmax": lambda a, x, name: sg.log_softmax(x, a["axis"], name=name),
    "cumsum": lambda a, x, name: sg.cumsum(x, a["axis"], name=name),
    "layer_norm": lambda a, x, name: sg.layer_norm(x, a["axes"], a["eps"], name=name),
    "clamp": lambda a, x, name: sg.clamp(x, a.get("min"), a.get("max"), name=name),
    "argmax": lambda a, x, name: sg.argmax(x, a["axis"], a["keepdims"], name=name),
    "argmin": lambda a, x, name: sg.argmin(x, a["axis"], a["keepdims"], name=name),
    "gather": lambda a, x, idx, name: sg.gather(x, idx, a["axis"], name=name),
    "scatter_add": lambda a, u, idx, name: sg.scatter_add(u, idx, a["size"], a["axis"], name=name),
    "einsum": lambda a, *xs, name: sg.einsum(a["subscripts"], *xs, name=name),
    "conv1d": lambda a, x, w, name: sg.conv1d(x, w, a["stride"], a["padding"], a["dilation"], a["groups"], name=name),
    "conv2d": lambda a, x, w, name: sg.conv2d(x, w, a["stride"], a["padding"], a["dilation"], a["groups"], name=name),
    "max_pool1d": lambda a, x, name: sg.max_pool1d(x, a["kernel_size"], a["stride"], a["padding"], name=name),
    "max_pool2d": lambda a, x, name: sg.max_pool2d(x, a["kernel_size"], a["stride"], a["padding"], name=name),
    "avg_pool1d": lambda a, x, name: sg.avg_pool1d(x, a["kernel_size"], a["stride"], a["padding"], name=name),
    "avg_pool2d": lambda a, x, name: sg.avg_pool2d(x, a["kernel_size"], a["stride"], a["padding"], name=name),
}


def _broadcasts(s: tuple, shape: tuple) -> bool:
    """Whether a value of shape `s` broadcasts to `shape` (without growing it)."""
    try:
        return np.broadcast_shapes(s, shape) == tuple(shape)
    except ValueError:
        return False


@st.composite
def cases(draw, vocabulary: Vocabulary, ops: tuple | None = None, seeds=None) -> FuzzCase:
    """A random FuzzCase. `ops`: draw from these only; `seeds`: True/False forces explicit output seeds."""
    families = {f: [n for n in names if n in (ops or names)] for f, names in vocabulary.families.items()}
    families = {f: names for f, names in families.items() if names}
    draws = [f for f in FAMILY_DRAWS if f in families]
    dims, batches = REGIMES[draw(st.sampled_from(("narrow", "wide", "large", "large")))]
    batch = draw(st.sampled_from(batches))
    target = draw(st.integers(1, MAX_OPS))
    seed = draw(st.integers(0, 2**32 - 1))
    b = _Builder(vocabulary, batch, np.random.default_rng(seed), dims)
    b.fresh(b.new_shape())  # the first input
    built = []
    for _ in range(4 * MAX_OPS):  # ops in turn: fewer ops give a prefix of the same graph
        if len(built) >= target:
            break
        ref = b.build(b.draw(rs.sampled_from(families[b.draw(rs.sampled_from(draws))])))
        if ref is not None:
            built.append(ref)
    if not built:
        reject()
    # Every value nothing consumes is an output (so no op is dead code), and sometimes an inner one too.
    consumed = {r for n in b.nodes for r in n.inputs}
    sinks = [ref for ref in built if ref not in consumed]
    outputs = {f"y{k}": ref for k, ref in enumerate(sinks)}
    inner = [ref for ref in built if ref in consumed]
    if inner and draw(st.integers(0, 3)) == 3:
        outputs[f"y{len(outputs)}"] = inner[draw(st.integers(0, len(inner) - 1))]
    rng = np.random.default_rng([seed, 1])  # the inputs' values and seeds
    values = {}
    for name, x in b.inputs.items():  # item by item: a sampler's spacing is per item
        items = [x.sampler(rng, x.shape) for _ in np.ndindex(*x.lead)]
        values[name] = np.asarray(items, dtype=x.dtype).reshape(x.lead + x.shape)
    leads = [x.lead for x in b.inputs.values()]
    full_batch = tuple(np.broadcast_shapes(*leads)) if leads else ()
    with_seeds = draw(st.booleans()) if seeds is None else seeds
    seed_values = {name: rng.normal(size=full_batch + b.shapes[ref]) for name, ref in outputs.items()} \
        if with_seeds else {}
    case = FuzzCase(vocabulary, dict(b.inputs), list(b.nodes), outputs, values, seed_values, full_batch)
    # tame values only (no overflow, no huge magnitudes): checked on a few items
    items = case.items()
    for item in {items[0], items[-1], items[len(items) // 2]}:
        for ref, v in case.forward(case.item(item)).items():
            if v.dtype != bool and not (np.all(np.isfinite(v)) and np.all(np.abs(v) <= TAME)):
                reject()
    return case
