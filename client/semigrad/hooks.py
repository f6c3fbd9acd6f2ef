"""Hooks on the backward pass, as a client attaches them: `f.gradient(..., hooks={node: hook})`.

* a plain callable `fn(gradient) -> gradient` runs in this process as a *post* hook: the
  server pauses at the node, sends the accumulated gradient, and continues with what `fn`
  returns;
* `PreHook(fn)` runs `fn(contributions) -> value` in this process, before accumulation:
  it gets every incoming `Contribution` (which consumer edge, its value) and returns the
  accumulated value;
* `ServerHook(name, kind="post", **params)` runs a hook on the server (see
  `Client.list_hooks()`: scale, clip, clip_norm, zero, noise, record, and plugins).
A node may carry a list of hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from . import codec
from .v1 import semigrad_pb2 as pb


@dataclass(frozen=True)
class Contribution:
    """One edge's contribution to a node's gradient: from `consumer` (a node id, or
    "output:<name>" for a seed), its operand position `operand`, and the value."""

    consumer: str
    operand: int
    value: Any


@dataclass(frozen=True)
class PreHook:
    fn: Callable[[list[Contribution]], Any]


@dataclass(frozen=True)
class ServerHook:
    name: str
    kind: str = "post"
    params: dict = field(default_factory=dict)

    def __init__(self, name: str, kind: str = "post", **params):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "params", params)


def attachments(hooks) -> tuple[list[pb.HookAttachment], dict[tuple[str, str], Callable]]:
    """Wire attachments for `hooks`, and the client-side functions by (node, kind)."""
    wire, local = [], {}
    for node, attached in (hooks or {}).items():
        for hook in attached if isinstance(attached, (list, tuple)) else [attached]:
            if isinstance(hook, ServerHook):
                wire.append(pb.HookAttachment(node=node, hook=hook.name, kind=hook.kind,
                                              params={k: codec.attr_value(v) for k, v in hook.params.items()}))
            elif isinstance(hook, PreHook):
                wire.append(pb.HookAttachment(node=node, kind="pre", client=True))
                local[node, "pre"] = hook.fn
            elif callable(hook):
                wire.append(pb.HookAttachment(node=node, kind="post", client=True))
                local[node, "post"] = hook
            else:
                raise TypeError(f"hook for node '{node}' must be a callable, PreHook or ServerHook, "
                                f"got {type(hook).__name__}")
    return wire, local
