"""Brute-force path enumeration: a reference for semiring backward passes that shares no code
with the server's backward pass.

* `random_case(seed)`: a seeded generator of small graphs (≤ 8 op nodes, ≤ 4 elements per
  tensor) over elementwise ops with broadcasting (add sub mul div sin cos tanh exp square neg
  sigmoid), matmul (1-D, 2-D and 3-D operands, batch axes broadcast), sum / mean / max over
  axes (keepdims or not), basic indexing (ints, slices, negative steps), transpose, reshape,
  broadcast_to, concat, stack and where, with inputs carrying leading batch dimensions that
  broadcast together, and (for about half the graphs) explicit output seeds.
* `RefGraph.forward(item)`: a NumPy interpreter of one batch item, and `RefGraph.edges(values)`:
  every element-level edge (consumer node, operand position, output element, operand element,
  local partial) from partial formulas written out below by hand.
* `RefGraph.paths(input, element)`: every path from an input element to an output element,
  enumerated explicitly (depth first), as tuples of edge numbers.
* `over_paths(s, ...)`: ⊕ over the paths of the ⊗-product of φ(partials), using only the
  semiring object's own `zeros`, `ones`, `add`, `mul` and `lift` (its definition).

x*x is two edges (one per operand position), so it gives two paths; a seed given for an output
is one more factor φ(seed) at the end of each path reaching that output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import semigrad as sg

MAX_ELEMENTS = 4
MAX_OP_NODES = 8
MAX_PATHS = 3000  # per input element and batch item; bigger graphs are redrawn
SHAPES = [(), (1,), (2,), (3,), (4,), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1), (1, 4), (4, 1),
          (2, 1, 2), (1, 2, 1), (1, 1, 3)]
BATCHES = [(), (1,), (2,), (3,), (2, 1), (1, 2)]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# op -> (value, ∂/∂x): written out by hand, not taken from the server's SymPy table.
UNARY = {
    "sin": (np.sin, np.cos),
    "cos": (np.cos, lambda x: -np.sin(x)),
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "exp": (np.exp, np.exp),
    "square": (np.square, lambda x: 2.0 * x),
    "neg": (np.negative, lambda x: np.full_like(x, -1.0)),
    "sigmoid": (_sigmoid, lambda x: _sigmoid(x) * (1.0 - _sigmoid(x))),
}
# op -> (value, ∂/∂x, ∂/∂y), on operands already broadcast to the result's shape.
BINARY = {
    "add": (np.add, lambda x, y: np.ones_like(x), lambda x, y: np.ones_like(y)),
    "sub": (np.subtract, lambda x, y: np.ones_like(x), lambda x, y: np.full_like(y, -1.0)),
    "mul": (np.multiply, lambda x, y: y, lambda x, y: x),
    "div": (np.divide, lambda x, y: 1.0 / y, lambda x, y: -x / y**2),
}
REDUCTIONS = ("sum", "mean", "max")
STRUCTURAL = ("index", "transpose", "reshape", "broadcast_to", "concat", "stack")


@dataclass
class RefNode:
    id: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict
    shape: tuple[int, ...]
    value: np.ndarray | None = None  # const nodes only


@dataclass
class Edge:
    node: str  # the consumer
    pos: int  # operand position in the consumer
    src: str  # the operand (node id or input name)
    out: int  # flat index of the consumer's element
    inp: int  # flat index of the operand's element


@dataclass
class RefGraph:
    inputs: dict[str, tuple[int, ...]]  # input name -> item shape
    nodes: list[RefNode]
    outputs: dict[str, str]  # output name -> node id
    seed: int = 0
    edge_list: list[Edge] = field(default_factory=list)
    _paths: dict = field(default_factory=dict)

    # ------------------------------------------------------------ description
    def node(self, ref: str) -> RefNode:
        return next(n for n in self.nodes if n.id == ref)

    def shape(self, ref: str) -> tuple[int, ...]:
        return self.inputs[ref] if ref in self.inputs else self.node(ref).shape

    def describe(self) -> str:
        lines = [f"inputs {self.inputs}"]
        for n in self.nodes:
            what = f"const {n.value.tolist()}" if n.op == "const" else f"{n.op}({', '.join(n.inputs)}) {n.attrs or ''}"
            lines.append(f"  {n.id} {list(n.shape)} = {what}")
        lines.append(f"outputs {self.outputs}")
        return "\n".join(lines)

    def client_graph(self) -> sg.Graph:
        """The same graph built with the client API (node ids kept)."""
        g = sg.Graph()
        h = {name: g.input(name, shape) for name, shape in self.inputs.items()}
        for n in self.nodes:
            args = [h[r] for r in n.inputs]
            a = n.attrs
            if n.op == "const":
                h[n.id] = g.const(n.value, name=n.id)
            elif n.op in UNARY:
                h[n.id] = getattr(sg, n.op)(*args, name=n.id)
            elif n.op in BINARY or n.op in ("matmul", "gt"):
                h[n.id] = getattr(sg, n.op)(*args, name=n.id)
            elif n.op in REDUCTIONS:
                h[n.id] = getattr(sg, n.op)(args[0], a["axes"], a["keepdims"], name=n.id)
            elif n.op == "index":
                h[n.id] = sg.index(args[0], a["index"], name=n.id)
            elif n.op == "transpose":
                h[n.id] = sg.transpose(args[0], a["perm"], name=n.id)
            elif n.op == "reshape":
                h[n.id] = sg.reshape(args[0], a["shape"], name=n.id)
            elif n.op == "broadcast_to":
                h[n.id] = sg.broadcast_to(args[0], a["shape"], name=n.id)
            elif n.op in ("concat", "stack"):
                h[n.id] = getattr(sg, n.op)(args, axis=a["axis"], name=n.id)
            elif n.op == "where":
                h[n.id] = sg.where(*args, name=n.id)
            else:
                raise AssertionError(n.op)
            assert h[n.id].shape in (None, n.shape), (n.id, h[n.id].shape, n.shape)
        for name, ref in self.outputs.items():
            g.output(name, h[ref])
        return g

    # ------------------------------------------------------------ the interpreter
    def forward(self, item: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every value of one batch item (item-shaped input arrays in, item-shaped values out)."""
        v = dict(item)
        with np.errstate(all="ignore"):  # overflow or division by ~0: the generator redraws the graph
            for n in self.nodes:
                args = [v[r] for r in n.inputs]
                v[n.id] = np.asarray(_apply(n, args), dtype=bool if n.op == "gt" else np.float64)
                assert v[n.id].shape == n.shape, (n.id, v[n.id].shape, n.shape)
        return v

    def edges(self, values: dict[str, np.ndarray]) -> tuple[list[Edge], np.ndarray]:
        """Every element-level edge of the graph and its local partial at these values."""
        edges, partials = [], []
        for n in self.nodes:
            with np.errstate(all="ignore"):
                local = _local_edges(self, n, values)
            for pos, (out, inp, d) in local.items():
                src = n.inputs[pos]
                if src not in self.inputs and self.node(src).op in ("const", "gt"):
                    continue  # no path from an input goes through a const or a bool
                for o, i in zip(out.tolist(), inp.tolist()):
                    edges.append(Edge(n.id, pos, src, o, i))
                partials.append(np.asarray(d, dtype=np.float64).reshape(-1))
        return edges, np.concatenate(partials) if partials else np.zeros(0)

    # ------------------------------------------------------------ paths
    def structure(self, values) -> list[Edge]:
        if not self.edge_list:
            self.edge_list = self.edges(values)[0]
        return self.edge_list

    def out_edges(self):
        table: dict[tuple[str, int], list[int]] = {}
        for e, edge in enumerate(self.edge_list):
            table.setdefault((edge.src, edge.inp), []).append(e)
        return table

    def paths(self, name: str, flat: int) -> list[tuple[tuple[int, ...], str, int]]:
        """Every path from input element (name, flat) to an output element, explicitly, as
        (edge numbers, output name, output element)."""
        key = (name, flat)
        if key not in self._paths:
            table = self.out_edges()
            outputs_of: dict[str, list[str]] = {}
            for out_name, ref in self.outputs.items():
                outputs_of.setdefault(ref, []).append(out_name)
            found = []

            def dfs(ref, element, trail):
                for out_name in outputs_of.get(ref, ()):
                    found.append((tuple(trail), out_name, element))
                if len(found) > MAX_PATHS:
                    raise TooManyPaths
                for e in table.get((ref, element), ()):
                    edge = self.edge_list[e]
                    trail.append(e)
                    dfs(edge.node, edge.out, trail)
                    trail.pop()

            dfs(name, flat, [])
            self._paths[key] = found
        return self._paths[key]


class TooManyPaths(Exception):
    pass


class Rejected(Exception):
    pass


# ---------------------------------------------------------------- op semantics


def _apply(n: RefNode, args: list[np.ndarray]):
    a = n.attrs
    if n.op == "const":
        return n.value
    if n.op in UNARY:
        return UNARY[n.op][0](args[0])
    if n.op in BINARY:
        return BINARY[n.op][0](args[0], args[1])
    if n.op == "gt":
        return np.greater(args[0], args[1])
    if n.op == "where":
        return np.where(args[0], args[1], args[2])
    if n.op == "matmul":
        return np.matmul(args[0], args[1])
    if n.op in REDUCTIONS:
        axes = None if a["axes"] is None else tuple(a["axes"])
        return {"sum": np.sum, "mean": np.mean, "max": np.max}[n.op](args[0], axis=axes, keepdims=a["keepdims"])
    if n.op == "index":
        return args[0][a["index"]]
    if n.op == "transpose":
        return np.transpose(args[0], a["perm"])
    if n.op == "reshape":
        return np.reshape(args[0], a["shape"])
    if n.op == "broadcast_to":
        return np.broadcast_to(args[0], a["shape"])
    if n.op == "concat":
        return np.concatenate(args, axis=a["axis"])
    if n.op == "stack":
        return np.stack(args, axis=a["axis"])
    raise AssertionError(n.op)


def _size(shape) -> int:
    return math.prod(shape)


def _source_map(n: RefNode, shapes: list[tuple], pos: int) -> np.ndarray:
    """For each element of n (flat), the flat index of the operand `pos` element it copies
    (-1 where it comes from another operand): n applied to arange tags."""
    tags = [np.arange(_size(s)).reshape(s) if k == pos else np.full(s, -1) for k, s in enumerate(shapes)]
    if n.op in BINARY or n.op == "where":
        return np.broadcast_to(tags[pos], n.shape).reshape(-1)
    return np.asarray(_apply(n, tags)).reshape(-1)


def _local_edges(g: RefGraph, n: RefNode, values) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{operand position: (output flat indices, operand flat indices, partials)}."""
    shapes = [g.shape(r) for r in n.inputs]
    args = [values[r] for r in n.inputs]
    size = _size(n.shape)
    every = np.arange(size)
    if n.op in ("const", "gt"):
        return {}
    if n.op in UNARY:
        return {0: (every, every, UNARY[n.op][1](args[0]).reshape(-1))}
    if n.op in BINARY:
        x, y = (np.broadcast_to(v, n.shape) for v in args)
        return {pos: (every, _source_map(n, shapes, pos), np.broadcast_to(BINARY[n.op][1 + pos](x, y), n.shape))
                for pos in (0, 1)}
    if n.op == "where":
        cond = np.broadcast_to(args[0], n.shape)
        return {1: (every, _source_map(n, shapes, 1), np.where(cond, 1.0, 0.0)),
                2: (every, _source_map(n, shapes, 2), np.where(cond, 0.0, 1.0))}
    if n.op in STRUCTURAL:
        out = {}
        for pos in range(len(args)):
            src = _source_map(n, shapes, pos)
            hit = np.flatnonzero(src >= 0)
            out[pos] = (hit, src[hit], np.ones(hit.size))
        return out
    if n.op in REDUCTIONS:
        (x,) = args
        axes = tuple(range(x.ndim)) if n.attrs["axes"] is None else tuple(a % x.ndim for a in n.attrs["axes"])
        kshape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        target = np.broadcast_to(np.arange(_size(kshape)).reshape(kshape), x.shape).reshape(-1)
        count = _size(x.shape) // max(1, _size(kshape))
        if n.op == "sum":
            d = np.ones(x.size)
        elif n.op == "mean":
            d = np.full(x.size, 1.0 / count)
        else:  # 1 at the maximum, ties share it evenly
            hit = (x == np.max(x, axis=axes, keepdims=True)).astype(np.float64)
            d = (hit / np.sum(hit, axis=axes, keepdims=True)).reshape(-1)
        return {0: (target, np.arange(x.size), d)}
    if n.op == "matmul":  # out[..., i, j] = Σ_k a[..., i, k] b[..., k, j], batch axes broadcast
        a, b = args
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        b2 = b.reshape(-1, 1) if b.ndim == 1 else b
        tag_a, tag_b = np.arange(a.size).reshape(a2.shape), np.arange(b.size).reshape(b2.shape)
        lead = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        (m, k), p = a2.shape[-2:], b2.shape[-1]
        full = lead + (m, k, p)  # one entry per (out element, k): the edges
        out = np.broadcast_to(np.arange(_size(lead) * m * p).reshape(lead + (m, 1, p)), full)
        in_a = np.broadcast_to(np.broadcast_to(tag_a, lead + (m, k))[..., :, :, None], full)
        in_b = np.broadcast_to(np.broadcast_to(tag_b, lead + (k, p))[..., None, :, :], full)
        d_a = np.broadcast_to(np.broadcast_to(b2, lead + (k, p))[..., None, :, :], full)
        d_b = np.broadcast_to(np.broadcast_to(a2, lead + (m, k))[..., :, :, None], full)
        flat = [v.reshape(-1) for v in (out, in_a, in_b, d_a, d_b)]  # unit axes of 1-D operands: same order
        return {0: (flat[0], flat[1], flat[3]), 1: (flat[0], flat[2], flat[4])}
    raise AssertionError(n.op)


# ---------------------------------------------------------------- the semiring fold


def _take(s, value, start, stop):
    return s.map(lambda c: c[start:stop], value)


def _concat(s, values):
    if s.components == 1:
        return np.concatenate(values)
    return tuple(np.concatenate(parts) for parts in zip(*values))


def over_paths(s, paths: list[tuple[int, ...]], partials: np.ndarray):
    """⊕ over `paths` (tuples of indices into `partials`) of φ(d₁) ⊗ φ(d₂) ⊗ … (d₁ nearest the
    input), vectorised over the paths but built from add, mul, lift, ones and zeros only."""
    if not paths:
        return s.zeros(())
    products = []
    for length in sorted({len(p) for p in paths}):
        index = np.array([p for p in paths if len(p) == length], dtype=np.int64).reshape(-1, length)
        value = s.ones((index.shape[0],))
        for j in range(length):
            value = s.mul(value, s.lift(partials[index[:, j]]))
        products.append(value)
    total = _concat(s, products)
    n = s.shape(total)[0]
    while n > 1:  # ⊕ pairwise, as a balanced tree
        if n % 2:
            total, n = _concat(s, [total, s.zeros((1,))]), n + 1
        total, n = s.add(_take(s, total, 0, n // 2), _take(s, total, n // 2, n)), n // 2
    return s.map(lambda c: c[0], total)


# ---------------------------------------------------------------- the generator


@dataclass
class Case:
    """A random graph, its input values (with batch dimensions) and optional output seeds."""

    graph: RefGraph
    inputs: dict[str, np.ndarray]
    seeds: dict[str, np.ndarray]  # empty: every output seeded with 1̄
    batch: tuple[int, ...]

    def item(self, b: tuple) -> dict[str, np.ndarray]:
        return {k: np.broadcast_to(v, self.batch + self.graph.inputs[k])[b] for k, v in self.inputs.items()}

    def seed_item(self, b: tuple) -> dict[str, np.ndarray]:
        return {k: np.broadcast_to(v, self.batch + self.graph.shape(self.graph.outputs[k]))[b]
                for k, v in self.seeds.items()}

    def items(self):
        return list(np.ndindex(*self.batch)) if self.batch else [()]

    def item_partials(self, b: tuple) -> tuple[dict, np.ndarray]:
        """(values, partials) of batch item b; with seeds, the seed values follow the edges'
        partials (see `path_index`)."""
        values = self.graph.forward(self.item(b))
        edges, partials = self.graph.edges(values)
        assert [(e.node, e.pos, e.out, e.inp) for e in edges] == \
               [(e.node, e.pos, e.out, e.inp) for e in self.graph.structure(values)]
        if self.seeds:
            seeds = self.seed_item(b)
            partials = np.concatenate([partials] + [np.asarray(seeds[name], dtype=np.float64).reshape(-1)
                                                    for name in self.graph.outputs])
        return values, partials

    def path_index(self, path: tuple[tuple[int, ...], str, int]) -> tuple[int, ...]:
        """A path as indices into item_partials' vector (the seed factor appended)."""
        trail, out_name, element = path
        if not self.seeds:
            return trail
        offset = len(self.graph.edge_list)
        for name, ref in self.graph.outputs.items():
            if name == out_name:
                return trail + (offset + element,)
            offset += _size(self.graph.shape(ref))
        raise AssertionError(out_name)


class _Builder:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.inputs: dict[str, tuple] = {}
        self.nodes: list[RefNode] = []
        self.shapes: dict[str, tuple] = {}
        self.values: list[str] = []  # float refs an op may consume (inputs and op nodes)

    def shape_choice(self, fits=lambda s: True):
        options = [s for s in SHAPES if fits(s)]
        return options[self.rng.integers(len(options))] if options else None

    def pick(self, fits=lambda s: True):
        options = [r for r in self.values if fits(self.shapes[r])]
        if not options:
            return None
        weights = np.arange(1, len(options) + 1, dtype=float) ** 1.5  # favour recent values: deeper graphs
        return options[self.rng.choice(len(options), p=weights / weights.sum())]

    def add(self, op, inputs, attrs, shape, value=None, consumable=True) -> str:
        ref = f"c{len(self.nodes)}" if op == "const" else f"n{len(self.nodes)}"
        self.nodes.append(RefNode(ref, op, tuple(inputs), attrs, tuple(shape), value))
        self.shapes[ref] = tuple(shape)
        if consumable and op != "const":
            self.values.append(ref)
        return ref

    def const(self, shape, nonzero=False) -> str:
        if nonzero:
            value = self.rng.uniform(0.5, 2.0, size=shape) * self.rng.choice([-1.0, 1.0], size=shape)
        else:
            value = self.rng.normal(size=shape) * (self.rng.random(size=shape) > 0.15)
        return self.add("const", (), {}, shape, np.asarray(value, dtype=np.float64))

    # -- one op of each kind; None when the drawn operands do not fit
    def unary(self):
        x = self.pick()
        op = list(UNARY)[self.rng.integers(len(UNARY))]
        return self.add(op, (x,), {}, self.shapes[x])

    def binary(self, op=None):
        op = op or list(BINARY)[self.rng.integers(len(BINARY))]
        x = self.pick()
        sx = self.shapes[x]

        def fits(s):
            try:
                return _size(np.broadcast_shapes(sx, s)) <= MAX_ELEMENTS
            except ValueError:
                return False

        r = self.rng.random()
        if r < 0.2:
            y = x  # x*x, x+x, ...: two edges per element
        elif r < 0.75:
            y = self.pick(fits)
            if y is None:
                return None
        else:
            y = self.const(self.shape_choice(fits), nonzero=op == "div")
        if op != "div" and self.rng.random() < 0.5:
            x, y = y, x
        elif op == "div" and y in self.values and self.rng.random() < 0.3:
            x, y = y, x
        shape = tuple(np.broadcast_shapes(self.shapes[x], self.shapes[y]))
        return self.add(op, (x, y), {}, shape)

    def matmul(self):
        """a @ b with 1-D, 2-D or 3-D operands (item-level batch axes broadcast), a drawn
        value on either side, the other a value or a const."""
        a = self.pick(lambda s: len(s) >= 1)
        if a is None:
            return None
        left = self.rng.random() < 0.5  # a as the left operand (else as the right one)

        def result(sx, sy):
            try:
                shape = np.matmul(np.zeros(sx), np.zeros(sy)).shape
            except ValueError:
                return None
            return shape if _size(shape) <= MAX_ELEMENTS else None

        def fits(s):
            return len(s) >= 1 and (result(self.shapes[a], s) if left else result(s, self.shapes[a])) is not None

        b = self.pick(fits) if self.rng.random() < 0.6 else None
        if b is None:
            shape = self.shape_choice(fits)
            if shape is None:
                return None
            b = self.const(shape)
        x, y = (a, b) if left else (b, a)
        return self.add("matmul", (x, y), {}, result(self.shapes[x], self.shapes[y]))

    def reduction(self):
        x = self.pick(lambda s: len(s) >= 1)
        if x is None:
            return None
        sx = self.shapes[x]
        op = REDUCTIONS[self.rng.choice(3, p=[0.45, 0.35, 0.2])]
        if self.rng.random() < 0.3:
            axes = None
        else:
            count = self.rng.integers(1, len(sx) + 1)
            axes = tuple(int(a) - (len(sx) if self.rng.random() < 0.3 else 0)
                         for a in sorted(self.rng.choice(len(sx), size=count, replace=False)))
        keepdims = bool(self.rng.random() < 0.4)
        norm = set(range(len(sx))) if axes is None else {a % len(sx) for a in axes}
        shape = tuple((1 if i in norm else d) for i, d in enumerate(sx) if keepdims or i not in norm)
        return self.add(op, (x,), {"axes": axes, "keepdims": keepdims}, shape)

    def structural(self):
        op = STRUCTURAL[self.rng.choice(len(STRUCTURAL), p=[0.3, 0.14, 0.14, 0.14, 0.14, 0.14])]
        x = self.pick(lambda s: len(s) >= 1) if op in ("index", "transpose") else self.pick()
        if x is None:
            return None
        sx = self.shapes[x]
        view = np.empty(sx)
        if op == "index":
            key = []
            for d in sx[: self.rng.integers(1, len(sx) + 1)]:
                if self.rng.random() < 0.4:
                    key.append(int(self.rng.integers(-d, d)))
                else:
                    step = int(self.rng.choice([1, 1, 2, -1, -2]))
                    start = None if self.rng.random() < 0.5 else int(self.rng.integers(-d, d))
                    stop = None if self.rng.random() < 0.5 else int(self.rng.integers(-d - 1, d + 1))
                    key.append(slice(start, stop, step))
            key = tuple(key)
            shape = view[key].shape
            if 0 in shape:
                return None
            return self.add("index", (x,), {"index": key}, shape)
        if op == "transpose":
            perm = None if self.rng.random() < 0.3 else tuple(int(p) for p in self.rng.permutation(len(sx)))
            return self.add("transpose", (x,), {"perm": perm}, np.transpose(view, perm).shape)
        if op == "reshape":
            shape = self.shape_choice(lambda s: _size(s) == _size(sx) and s != sx)
            if shape is None:
                return None
            target = list(shape)
            if target and self.rng.random() < 0.3:
                target[self.rng.integers(len(target))] = -1
            return self.add("reshape", (x,), {"shape": tuple(target)}, shape)
        if op == "broadcast_to":
            def fits(s):
                try:
                    return np.broadcast_shapes(sx, s) == s and s != sx
                except ValueError:
                    return False

            shape = self.shape_choice(fits)
            if shape is None:
                return None
            return self.add("broadcast_to", (x,), {"shape": shape}, shape)
        # concat / stack of two operands (possibly x twice)
        if op == "stack":
            if 2 * _size(sx) > MAX_ELEMENTS:
                return None
            y = x if self.rng.random() < 0.4 else (self.pick(lambda s: s == sx) or self.const(sx))
            axis = int(self.rng.integers(-len(sx) - 1, len(sx) + 1))
            return self.add("stack", (x, y), {"axis": axis}, np.stack([view, view], axis=axis).shape)
        if not sx:
            return None
        axis = int(self.rng.integers(-len(sx), len(sx)))

        def fits(s):
            return len(s) == len(sx) and all(a == b for i, (a, b) in enumerate(zip(s, sx)) if i != axis % len(sx)) \
                and _size(s) + _size(sx) <= MAX_ELEMENTS

        y = x if self.rng.random() < 0.3 and 2 * _size(sx) <= MAX_ELEMENTS else self.pick(fits)
        if y is None:
            shape = self.shape_choice(fits)
            if shape is None:
                return None
            y = self.const(shape)
        x, y = (x, y) if self.rng.random() < 0.5 else (y, x)
        shape = np.concatenate([np.empty(self.shapes[x]), np.empty(self.shapes[y])], axis=axis).shape
        return self.add("concat", (x, y), {"axis": axis}, shape)

    def where(self):
        c = self.pick()
        cond = self.add("gt", (c, self.const(())), {}, self.shapes[c], consumable=False)
        a = self.pick()
        sc, sa = self.shapes[cond], self.shapes[a]

        def fits(s):
            try:
                return _size(np.broadcast_shapes(sc, sa, s)) <= MAX_ELEMENTS
            except ValueError:
                return False

        try:
            if _size(np.broadcast_shapes(sc, sa)) > MAX_ELEMENTS:
                return None
        except ValueError:
            return None
        b = self.pick(fits) if self.rng.random() < 0.5 else None
        b = b if b is not None else self.const(self.shape_choice(fits))
        a, b = (a, b) if self.rng.random() < 0.5 else (b, a)
        shape = tuple(np.broadcast_shapes(sc, self.shapes[a], self.shapes[b]))
        return self.add("where", (cond, a, b), {}, shape)


KINDS = ("unary", "binary", "matmul", "reduction", "structural", "where")
WEIGHTS = np.array([0.2, 0.27, 0.12, 0.16, 0.2, 0.05])


def random_case(seed: int, *, with_seeds: bool | None = None) -> Case:
    """A random graph with inputs (and, for about half the seeds, output seeds), redrawn until
    its values are tame (finite, |v| ≤ 30, divisors |y| ≥ 0.2) and its paths few (≤ MAX_PATHS)."""
    for attempt in range(200):
        rng = np.random.default_rng([seed, attempt])
        try:
            return _draw(rng, seed, with_seeds)
        except (Rejected, TooManyPaths):
            continue
    raise AssertionError(f"no acceptable graph for seed {seed}")


def _draw(rng: np.random.Generator, seed: int, with_seeds: bool | None) -> Case:
    b = _Builder(rng)
    for i in range(int(rng.integers(1, 3))):
        name = f"x{i}"
        b.inputs[name] = b.shape_choice(lambda s: _size(s) >= 1)
        b.shapes[name] = b.inputs[name]
        b.values.append(name)
    target = int(rng.integers(5, MAX_OP_NODES + 1))
    ops = 0
    while ops < target:
        kind = KINDS[rng.choice(len(KINDS), p=WEIGHTS / WEIGHTS.sum())]
        if kind == "where" and ops + 2 > target:
            continue
        if getattr(b, kind)() is not None:
            ops = sum(n.op != "const" for n in b.nodes)
    if any(all(name not in n.inputs for n in b.nodes) for name in b.inputs):
        raise Rejected  # an unused input: every gradient 0̄ (still covered by dead branches and indexing)
    op_nodes = [n.id for n in b.nodes if n.op not in ("const", "gt")]
    outputs = {"y": op_nodes[-1]}
    if len(op_nodes) > 1 and rng.random() < 0.4:
        outputs["z"] = op_nodes[int(rng.integers(len(op_nodes) - 1))]
    graph = RefGraph(dict(b.inputs), b.nodes, outputs, seed=seed)

    batch = BATCHES[rng.integers(len(BATCHES))]
    inputs = {}
    for name, shape in graph.inputs.items():
        lead = tuple(d if rng.random() < 0.7 else 1 for d in batch)[len(batch) - int(rng.integers(0, len(batch) + 1)):]
        value = rng.normal(size=lead + shape) * (rng.random(size=lead + shape) > 0.15)  # some exact zeros
        inputs[name] = value
    batch = tuple(np.broadcast_shapes(*(v.shape[: v.ndim - len(graph.inputs[k])] for k, v in inputs.items())))
    if with_seeds is None:
        with_seeds = bool(rng.random() < 0.5)
    seeds = {}
    if with_seeds:
        for name, ref in outputs.items():
            shape = batch + graph.shape(ref)
            seeds[name] = rng.normal(size=shape) * (rng.random(size=shape) > 0.2)
    case = Case(graph, inputs, seeds, batch)

    for item in case.items():
        values, partials = case.item_partials(item)
        for n in graph.nodes:
            v = values[n.id]
            if v.dtype != bool and not (np.all(np.isfinite(v)) and np.all(np.abs(v) <= 30)):
                raise Rejected
            if n.op == "div" and np.any(np.abs(np.broadcast_to(values[n.inputs[1]], n.shape)) < 0.2):
                raise Rejected
        if not np.all(np.isfinite(partials)):
            raise Rejected
    reachable = 0
    for name, shape in graph.inputs.items():
        for flat in range(_size(shape)):
            reachable += len(graph.paths(name, flat))
    if reachable == 0:
        raise Rejected
    return case


def finite_difference(case: Case, b: tuple, name: str, h: float = 1e-6) -> np.ndarray:
    """Central differences of Σ seed·output (seed 1 without seeds) for batch item b, by the interpreter."""
    item = {k: np.array(v, dtype=np.float64) for k, v in case.item(b).items()}
    seeds = case.seed_item(b)

    def total(values):
        return sum(float(np.sum(values[ref] * (seeds[out] if seeds else 1.0)))
                   for out, ref in case.graph.outputs.items())

    grad = np.zeros(item[name].shape)
    for flat in range(item[name].size):
        idx = np.unravel_index(flat, item[name].shape)
        step = h * max(1.0, abs(item[name][idx]))
        up, down = dict(item), dict(item)
        up[name], down[name] = item[name].copy(), item[name].copy()
        up[name][idx] += step
        down[name][idx] -= step
        grad[idx] = (total(case.graph.forward(up)) - total(case.graph.forward(down))) / (2 * step)
    return grad
