"""einsum: NumPy's `einsum` over explicit letters, with its shape rule, kernel, adjoint and
element-level form in one place.

Subscripts are letters (a-z, A-Z), one term per operand, an optional `->output`; without it
the output is the letters used once, in alphabetical order (NumPy's rule). Not supported, and
refused naming the node: `...` (batch axes are the engine's own: every term gets a leading
ellipsis for them) and a letter repeated within one term (diagonals, traces).

Edges at element level (docs/semirings.md): out[I] has an edge from x_k[J] wherever I and J
agree on their shared letters, with ∂ = Σ over the letters of neither of ∏ of the other
operands' elements (x_k's own factor removed). The semiring adjoint lifts exactly that
partial and ⊕-reduces φ(∂) ⊗ g over the output letters x_k lacks.
"""

from __future__ import annotations

import itertools
import math
import string

import numpy as np

from ..errors import GraphError
from ..ir import Type
from .base import AttrSpec, OpDef, Registry, element_array

LETTERS = frozenset(string.ascii_letters)


def parse(node, subscripts: str, in_types) -> tuple[list[str], str, dict[str, int]]:
    """(input terms, output term, letter -> size), checked against the operands."""
    text = subscripts.replace(" ", "")
    if "..." in text:
        raise GraphError(node.id, "einsum subscripts with '...' are not supported: name every axis with a letter "
                                  "(batch axes of requests are handled by the engine)")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(in_types):
        raise GraphError(node.id, f"einsum subscripts {subscripts!r} have {len(terms)} term(s) for "
                                  f"{len(in_types)} operand(s)")
    sizes: dict[str, int] = {}
    for k, (term, t) in enumerate(zip(terms, in_types)):
        bad = set(term) - LETTERS
        if bad:
            raise GraphError(node.id, f"einsum subscripts {subscripts!r}: {''.join(sorted(bad))!r} is not a letter")
        if len(set(term)) != len(term):
            raise GraphError(node.id, f"einsum term {term!r} repeats a letter (diagonals are not supported)")
        if len(term) != t.rank:
            raise GraphError(node.id, f"einsum term {term!r} has {len(term)} letters for operand {k} of shape "
                                      f"{list(t.shape)}")
        for letter, size in zip(term, t.shape):
            if sizes.setdefault(letter, size) != size:
                raise GraphError(node.id, f"einsum letter {letter!r} has size {sizes[letter]} and {size}")
    if arrow:
        out = rhs
        if set(out) - set(sizes) or len(set(out)) != len(out):
            raise GraphError(node.id, f"einsum output {out!r} must use distinct letters of the inputs")
    else:
        counts = {letter: lhs.count(letter) for letter in sizes}
        out = "".join(sorted(letter for letter, c in counts.items() if c == 1))
    return terms, out, sizes


def _infer(node, in_types, attrs):
    terms, out, sizes = parse(node, attrs["subscripts"], in_types)
    dtype = np.result_type(*(np.dtype(t.dtype) for t in in_types)).name
    if dtype not in ("float32", "float64"):
        raise GraphError(node.id, f"einsum takes float operands, got {', '.join(t.dtype for t in in_types)}")
    return Type(tuple(sizes[letter] for letter in out), dtype)


def _canonical(terms, out) -> str:
    return ",".join("..." + t for t in terms) + "->..." + out


def _kernel(attrs, in_types, out_type):
    """Two operands: one einsum. More: einsums of the operands NumPy's greedy path contracts
    together, in an order chosen once from the item shapes, so a result never depends on how
    many batch items came with it (a path chosen per call could change with the batch size,
    and the rounding too)."""
    terms, out, _ = parse(_NoNode, attrs["subscripts"], in_types)
    if len(terms) <= 2:
        spec = _canonical(terms, out)
        return lambda *xs: np.einsum(spec, *xs)
    steps = [(positions, _canonical(contracted, new)) for positions, contracted, new in _steps(terms, out, in_types)]

    def einsum(*xs):
        xs = list(xs)
        for positions, spec in steps:
            operands = [xs.pop(i) for i in positions]
            xs.append(np.einsum(spec, *reversed(operands)))
        return xs[0]

    return einsum


def _steps(terms, out, in_types):
    """The kernel's steps for three or more operands: (live positions in descending order,
    their terms in ascending order, result term), each contracting those live operands into
    one appended last, as NumPy's greedy path says. A step holds two operands, or more: the
    path contracts every operand at once when all letters are in the output ('i,i,i->i') or
    when no pair fits its memory bound ('u,uS,u')."""
    item_spec = ",".join(terms) + "->" + out
    path = np.einsum_path(item_spec, *(np.broadcast_to(0.0, t.shape) for t in in_types), optimize="greedy")[0][1:]
    steps, live = [], list(terms)
    for group in path:
        positions = sorted(group, reverse=True)
        contracted = [live.pop(i) for i in positions][::-1]
        rest = set(out).union(*live)
        new = "".join(c for c in dict.fromkeys("".join(contracted)) if c in rest) if live else out
        steps.append((tuple(positions), contracted, new))
        live.append(new)
    return steps


def _work(attrs, in_types, out_type) -> int:
    """Products one item's kernel computes: an einsum of two operands visits every combination
    of their letters ("ij,kl->" of two n×n operands: n⁴ products from 2n² elements), which the
    elements of the values do not bound; counted in max_request_elements before a request runs."""
    terms, out, sizes = parse(_NoNode, attrs["subscripts"], in_types)
    if len(terms) <= 2:
        return math.prod(sizes.values())
    return sum(math.prod(sizes[c] for c in set("".join(contracted))) for _, contracted, _ in _steps(terms, out, in_types))


class _NoNode:  # kernels run on checked nodes: parse never raises there
    id = "?"


def _expand(el, operands, attrs, in_types, out_type):
    terms, out, sizes = parse(_NoNode, attrs["subscripts"], in_types)
    summed = sorted(set("".join(terms)) - set(out))
    values = []
    for o in itertools.product(*(range(sizes[c]) for c in out)):
        at = dict(zip(out, o))
        products = []
        for s in itertools.product(*(range(sizes[c]) for c in summed)):
            at.update(zip(summed, s))
            factors = [x[tuple(at[c] for c in term)] for x, term in zip(operands, terms)]
            products.append(el.reduce("mul", factors, el.number(1.0)))
        values.append(el.reduce("add", products, el.number(0.0)))
    return element_array(values, out_type.shape)


def _cost(in_types, out_type) -> int:
    """A bound on the products an expansion builds: each letter is some operand's axis, so the
    combinations of letters are at most the product of the operands' sizes."""
    return len(in_types) * math.prod(max(1, t.size) for t in in_types)


def _vjp(ctx, node, g, positions):
    attrs = ctx.attrs(node)
    in_types = [ctx.type(r) for r in node.inputs]
    terms, out, sizes = parse(node, attrs["subscripts"], in_types)
    grads = {}
    for k in positions:
        term = terms[k]
        others = [(r, t) for m, (r, t) in enumerate(zip(node.inputs, terms)) if m != k]
        other_letters = set("".join(t for _, t in others))
        if ctx.real or not others:
            grads[k] = _real_like(ctx, node, g, k, term, out, others, other_letters, sizes)
        else:
            grads[k] = _semiring(ctx, g, term, out, others, other_letters, sizes)
    return grads


def _real_like(ctx, node, g, k, term, out, others, other_letters, sizes):
    """Σ over the letters x_k lacks of g ⊗ the others (an einsum), broadcast along x_k's
    letters that nothing else has (∂ does not depend on them). Without other operands ∂ = 1."""
    have = "".join(c for c in term if c in set(out) | other_letters)
    if not others:  # a permutation / sum of x alone: ∂ = 1 on every edge
        reduced = [i for i, c in enumerate(out) if c not in term]
        value = ctx.reduce(g, tuple(reduced), keepdims=False) if reduced else g
        kept = "".join(c for c in out if c in term)
        if kept != have:
            value = ctx.emit("transpose", [value], perm=tuple(kept.index(c) for c in have))
        value = ctx.edge_const(1, value)
    else:
        spec = ",".join([out] + [t for _, t in others]) + "->" + have
        value = ctx.emit("einsum", [g] + [r for r, _ in others], subscripts=spec)
    return _spread(ctx, value, have, term, sizes)


def _spread(ctx, value, have, term, sizes):
    """`value` over letters `have` as x's `term` shape (unit axes broadcast)."""
    if value is None or have == term:
        return value
    shape = tuple(sizes[c] if c in have else 1 for c in term)
    value = ctx.emit("reshape", [value], shape=shape)
    return ctx.emit("broadcast_to", [value], shape=tuple(sizes[c] for c in term))


def _semiring(ctx, g, term, out, others, other_letters, sizes):
    """⊕ over the output letters x_k lacks of φ(∂) ⊗ g, with ∂ over L = out + x_k's own
    letters: ∂[L] = Σ over the letters of neither of ∏ of the others (a real einsum)."""
    extra = "".join(c for c in term if c not in out)
    L = out + extra
    avail = "".join(c for c in L if c in other_letters)
    spec = ",".join(t for _, t in others) + "->" + avail
    partial = ctx.emit("einsum", [r for r, _ in others], subscripts=spec)
    partial = ctx.emit("reshape", [partial], shape=tuple(sizes[c] if c in avail else 1 for c in L))
    g_l = ctx.emit("reshape", [g], shape=tuple(sizes[c] for c in out) + (1,) * len(extra)) if extra else g
    product = ctx.edge_value(partial, g_l)
    reduced = tuple(i for i, c in enumerate(L) if c not in term)
    value = ctx.reduce(product, reduced, keepdims=False) if reduced else product
    kept = "".join(c for c in L if c in term)  # the value's letters: unit axes where neither g nor ∂ has one
    if kept != term:
        value = ctx.emit("transpose", [value], perm=tuple(kept.index(c) for c in term))
    if any(c not in out and c not in other_letters for c in term):
        value = ctx.emit("broadcast_to", [value], shape=tuple(sizes[c] for c in term))
    return value


def register(registry: Registry) -> None:
    registry.add(OpDef(
        "einsum", "linalg", ("x",), _infer, _kernel, vjp=_vjp, variadic=True,
        attrs=(AttrSpec("subscripts", "string", required=True, doc="e.g. 'bij,bjk->bik'; letters only, no '...'"),),
        derivatives=(("x", "einsum of the adjoint with the other operands (semiring: ⊕ of φ(∏ others) ⊗ g)"),),
        doc="numpy.einsum over explicit letters (implicit output: letters used once, sorted)",
        expand=_expand, scalar_cost=_cost, work=_work, analytic=True))
