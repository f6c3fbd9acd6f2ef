"""Hooks on the backward pass: the plugin API, built-ins, discovery."""

from .base import Contribution, Hook, HookCall

__all__ = ["Contribution", "Hook", "HookCall"]
