"""The Monty sandbox: programs written by the model run here, with tools as plain functions.

``Sandbox.run`` runs a program in a chat's persistent Python state and returns an
``ExecutionResult``; ``render_stubs`` describes the tools to the model and the type checker;
``CodeExecutor`` (executor.py) runs a chat's programs with its tools and saved state.

The names load on first use: importing Monty costs a tools-mode process time it never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanobot.sandbox.executor import CodeExecutor
    from nanobot.sandbox.limits import request_timeout_for, resource_limits
    from nanobot.sandbox.pool import MontyPool
    from nanobot.sandbox.result import ExecutionResult
    from nanobot.sandbox.runner import HostCall, StopProgram, execute
    from nanobot.sandbox.sandbox import Sandbox
    from nanobot.sandbox.stubs import render_stubs

_HOMES = {"CodeExecutor": "executor", "ExecutionResult": "result", "HostCall": "runner", "MontyPool": "pool",
          "Sandbox": "sandbox", "StopProgram": "runner", "execute": "runner", "render_stubs": "stubs",
          "request_timeout_for": "limits", "resource_limits": "limits"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'nanobot.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(f"nanobot.sandbox.{_HOMES[name]}"), name)
