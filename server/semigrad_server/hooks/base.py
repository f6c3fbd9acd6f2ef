"""The hook plugin API: intervene in the backward pass at a node.

A *post* hook sees a node's accumulated gradient and returns its replacement. A
*pre-accumulate* hook sees every contribution arriving at the node (which consumer edge it
came from, and its value) and returns the accumulated value: the graph-level override of
accumulation that per-tensor hooks cannot reach. Values are whatever the request's
semiring carries (arrays, or tuples of arrays), with leading batch axes.

Subclass `Hook`, implement `post` (and `pre` if accumulation itself should change), and
declare an entry point in the group `semigrad.hooks`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Contribution:
    """One incoming edge's contribution to a node's gradient. `consumer` is the node the
    edge leads to (or "output:<name>" for an output's seed), `operand` its operand position."""

    consumer: str
    operand: int
    value: Any


@dataclass
class HookCall:
    """What a hook is told about where and how it runs."""

    node: str
    kind: str  # "post" or "pre"
    params: Mapping[str, object]
    semiring: Any  # the request's semiring (a semigrad_server.semiring.Semiring)
    shape: tuple[int, ...] = ()  # the node's per-item shape (values have leading batch axes)
    records: dict = field(default_factory=dict)  # filled by record(); returned with the response

    def record(self, name: str, value) -> None:
        self.records[name] = value

    def accumulate(self, contributions: Sequence[Contribution]):
        """⊕ of the contributions, as the backward pass would have done without the hook."""
        value = contributions[0].value
        for c in contributions[1:]:
            value = self.semiring.add(value, c.value)
        return value


class Hook:
    name: str = ""
    description: str = ""
    parameters: Mapping[str, str] = {}  # name -> description

    def check(self, params: Mapping[str, object]) -> None:
        """Raise ValueError for bad parameters (called when a request attaches the hook)."""
        unknown = set(params) - set(self.parameters)
        if unknown:
            raise ValueError(f"hook '{self.name}' has no parameter {', '.join(sorted(unknown))} "
                             f"(parameters: {', '.join(self.parameters) or 'none'})")

    def post(self, gradient, call: HookCall):
        return gradient

    def pre(self, contributions: Sequence[Contribution], call: HookCall):
        """Default: accumulate as usual, then apply `post`."""
        return self.post(call.accumulate(contributions), call)


def number(params: Mapping[str, object], name: str, default: float, *, minimum: float | None = None,
           integer: bool = False, finite: bool = False) -> float:
    """Parameter `name` as a number (`default` when absent); ValueError naming it unless it is a
    real number (a whole one, within int64, if `integer`; not NaN; finite if `finite`; at least
    `minimum`). Hooks call it in `check`, so a bad value is refused when the request attaches the
    hook, and again where they read it."""
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"parameter '{name}' must be a number, got {value!r}"[:200])
    if integer:
        if not (math.isfinite(value) and float(value).is_integer() and -2**63 <= value < 2**63):
            raise ValueError(f"parameter '{name}' must be a whole number within int64, got {value!r}")
        value = int(value)
    elif finite and not math.isfinite(value):
        raise ValueError(f"parameter '{name}' must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"parameter '{name}' must be at least {minimum:g}, got {value!r}")
    return value
