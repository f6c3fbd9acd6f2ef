"""Built-in hooks: scale, clip, clip_norm, zero, noise, record. They act on the semiring's
raw carrier arrays (for the real semiring: the gradient itself)."""

from __future__ import annotations

import numpy as np

from .base import Hook, number


def _each(call, fn, value):
    return call.semiring.map(fn, value)


class Scale(Hook):
    name = "scale"
    description = "multiply the gradient by `factor`"
    parameters = {"factor": "the multiplier (default 1)"}

    def check(self, params):
        super().check(params)
        number(params, "factor", 1.0)

    def post(self, gradient, call):
        factor = number(call.params, "factor", 1.0)
        return _each(call, lambda g: g * factor, gradient)


class Clip(Hook):
    name = "clip"
    description = "clip every element into [min, max]"
    parameters = {"min": "lower bound (default -inf)", "max": "upper bound (default +inf)"}

    def check(self, params):
        super().check(params)
        number(params, "min", -np.inf), number(params, "max", np.inf)

    def post(self, gradient, call):
        lo, hi = number(call.params, "min", -np.inf), number(call.params, "max", np.inf)
        return _each(call, lambda g: np.clip(g, lo, hi), gradient)


class ClipNorm(Hook):
    name = "clip_norm"
    description = "rescale each batch item's gradient at this node to L2 norm at most `max_norm`"
    parameters = {"max_norm": "the largest norm kept (required)"}

    def check(self, params):
        super().check(params)
        if "max_norm" not in params:
            raise ValueError("hook 'clip_norm' needs a non-negative max_norm")
        number(params, "max_norm", 0.0, minimum=0.0)

    def post(self, gradient, call):
        limit = number(call.params, "max_norm", 0.0, minimum=0.0)
        rank = len(call.shape)

        def clip(g):
            axes = tuple(range(g.ndim - rank, g.ndim))
            norm = np.sqrt(np.sum(np.square(g), axis=axes, keepdims=True)) if axes else np.abs(g)
            return g * np.minimum(1.0, limit / np.maximum(norm, np.finfo(float).tiny))

        return _each(call, clip, gradient)


class Zero(Hook):
    name = "zero"
    description = "replace the gradient by zeros (stop the gradient here)"

    def post(self, gradient, call):
        return _each(call, np.zeros_like, gradient)


class Noise(Hook):
    name = "noise"
    description = "add Gaussian noise N(0, std²), reproducible from `seed`"
    parameters = {"std": "standard deviation (default 1)", "seed": "random seed (default 0)"}

    def check(self, params):
        super().check(params)
        number(params, "seed", 0, integer=True, minimum=0)  # NumPy seeds are non-negative
        number(params, "std", 1.0, minimum=0.0, finite=True)

    def post(self, gradient, call):
        rng = np.random.default_rng(number(call.params, "seed", 0, integer=True, minimum=0))
        std = number(call.params, "std", 1.0, minimum=0.0, finite=True)
        return _each(call, lambda g: g + rng.normal(0.0, std, size=np.shape(g)), gradient)


class Record(Hook):
    name = "record"
    description = "return the gradient (post) or every incoming contribution (pre) with the response"

    def post(self, gradient, call):
        call.record("gradient", gradient)
        return gradient

    def pre(self, contributions, call):
        for c in contributions:
            call.record(f"{c.consumer}:{c.operand}", c.value)
        total = call.accumulate(contributions)
        call.record("accumulated", total)
        return total
