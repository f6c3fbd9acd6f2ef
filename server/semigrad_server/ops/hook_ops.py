"""Ops that run hooks inside a backward graph, bound to one request's hook attachments.

`hook_post(g)` replaces a node's accumulated gradient; `hook_pre(c0, c1, ...)` receives
every contribution to a node and returns the accumulated value. The attribute `slot`
indexes the attachment; `edges` names where each contribution comes from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..hooks.base import Contribution, Hook, HookCall
from ..hooks.run import current
from .base import AttrSpec, OpDef, Registry


@dataclass(frozen=True)
class HookSlot:
    node: str
    kind: str  # "post" or "pre"
    hook: Hook | None  # None: the hook runs in the client
    params: dict = field(default_factory=dict)
    shape: tuple = ()

    @property
    def key(self) -> str:
        return f"{self.node}/{self.kind}"


def hook_registry(base: Registry, slots: list[HookSlot], semiring) -> Registry:
    registry = Registry(dict(base.ops))

    def call_for(slot: HookSlot) -> HookCall:
        run = current()
        return HookCall(slot.node, slot.kind, slot.params, semiring, shape=slot.shape,
                        records=run.records.setdefault(slot.key, {}))

    def post_kernel(attrs, in_types, out_type):
        slot = slots[attrs["slot"]]
        if slot.hook is None:
            return lambda g: current().client.call(slot, [("", 0, g)])
        return lambda g: slot.hook.post(g, call_for(slot))

    def pre_kernel(attrs, in_types, out_type):
        slot = slots[attrs["slot"]]
        edges = [tuple(e) for e in json.loads(attrs["edges"])]
        if slot.hook is None:
            return lambda *values: current().client.call(slot, [(c, o, v) for (c, o), v in zip(edges, values)])
        return lambda *values: slot.hook.pre([Contribution(c, o, v) for (c, o), v in zip(edges, values)],
                                             call_for(slot))

    same_type = lambda node, in_types, attrs: in_types[0]  # noqa: E731
    for op in (
        OpDef("hook_post", "hook", ("g",), same_type, post_kernel, attrs=(AttrSpec("slot", "int", required=True),),
              doc="a post hook on a node's accumulated gradient"),
        OpDef("hook_pre", "hook", ("c",), same_type, pre_kernel, variadic=True,
              attrs=(AttrSpec("slot", "int", required=True), AttrSpec("edges", "string", required=True)),
              doc="a pre-accumulate hook: every contribution in, the accumulated value out"),
    ):
        op.internal = True
        registry.ops[op.name] = op
    return registry
