"""The Monty sandbox: programs written by the model run here, with tools as plain functions.

``Sandbox.run`` runs a program in a chat's persistent Python state and returns an
``ExecutionResult``; ``render_stubs`` describes the tools to the model and the type checker.
"""

from nanobot.sandbox.limits import request_timeout_for, resource_limits
from nanobot.sandbox.pool import MontyPool
from nanobot.sandbox.result import ExecutionResult
from nanobot.sandbox.runner import HostCall, StopProgram, execute
from nanobot.sandbox.sandbox import Sandbox
from nanobot.sandbox.stubs import render_stubs

__all__ = ["ExecutionResult", "HostCall", "MontyPool", "Sandbox", "StopProgram", "execute", "render_stubs",
           "request_timeout_for", "resource_limits"]
