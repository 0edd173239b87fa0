"""One registry of tools, shared by tool calling, code mode and cron jobs.

A tool is a typed async function ``async def name(ctx: ToolContext, arg: T, ...) -> R`` whose
docstring describes it. Its JSON schema (for native tool calls), its argument validation and
its Python stub (for code mode) are all derived from that one signature, so they cannot drift.

Tools report failure by raising a built-in exception that fits (FileNotFoundError,
PermissionError, ValueError, TimeoutError, RuntimeError). Code mode re-raises it inside the
program; tool calling turns it into an ``Error: ...`` text for the model.
"""

from __future__ import annotations

import collections
import inspect
import json
import typing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from nanobot import metrics, tracing
from nanobot.trust import Trust, TurnGuard

if TYPE_CHECKING:
    from nanobot.config import Config
    from nanobot.tools.services import Services

# The exception types a tool may raise as-is; anything else is wrapped in RuntimeError.
TOOL_ERRORS = (FileNotFoundError, PermissionError, ValueError, TimeoutError, RuntimeError, IsADirectoryError,
               NotADirectoryError, FileExistsError)


@dataclass
class ToolContext:
    """What a tool may know about the turn that calls it."""

    config: Config
    workspace: Path  # the chat's root: the whole workspace for owner chats, its own folder for members
    # Whose chat and how far it is trusted: no defaults, so a context built with too little is
    # an error, never the owner's terminal chat by omission.
    session_key: str
    trust: Trust
    services: Services | None = None  # None in a bare context (tests of single tools)
    guard: TurnGuard = field(default_factory=TurnGuard)
    runs_code: bool = True  # the model can write programs this turn (code, hybrid): code-only hints apply
    # What started the turn: "user" (a message), "cron" (a job), "task" (a background task).
    origin: str = "user"
    state_key: str = ""  # whose saved Python state programs use ("": the chat's; a task has its own)

    async def announce(self, text: str) -> None:
        if self.services is not None:
            await self.services.announce(text)

    def needs_services(self, what: str) -> Services:
        """The process's services, or a RuntimeError naming ``what`` cannot work without them."""
        if self.services is None:
            raise RuntimeError(f"{what} is not available here (no database)")
        return self.services

    @property
    def channel(self) -> str:
        return self.session_key.partition(":")[0]

    @property
    def chat_id(self) -> str:
        return self.session_key.partition(":")[2]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    func: Callable[..., Awaitable[Any]]
    args_model: type[BaseModel]
    signature: inspect.Signature  # without the ctx parameter
    code_only: bool = False  # e.g. final_answer: a function in code, never a native tool
    # Returns text written by strangers: where it comes from, a template filled with the call's
    # arguments ("the web page {url}"); the turn is marked and tools mode labels the result.
    untrusted: str = ""
    # Seldom needed: prompts name it in one short line (code) or offer it through find_tools
    # (tools mode, when the schemas would be large); its full stub or schema comes on request.
    brief: bool = False

    @cached_property  # a schema never changes; building it costs ~0.5 ms, on every turn otherwise
    def parameters(self) -> dict[str, Any]:
        schema = self.args_model.model_json_schema()
        _drop_titles(schema)
        schema.pop("additionalProperties", None)
        schema.setdefault("properties", {})
        for name, prop in schema["properties"].items():
            schema["properties"][name] = _plain_optional(prop)
        return schema

    @cached_property
    def openai_schema(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @cached_property
    def schema_size(self) -> int:
        """Characters its schema adds to every native-tools request."""
        return len(json.dumps(self.openai_schema, ensure_ascii=False, separators=(",", ":")))  # as sent

    def available(self, ctx: ToolContext) -> bool:
        """Whether this chat may see and call the tool (MCP tools: not every member chat)."""
        return True

    def origin(self, arguments: dict[str, Any]) -> str:
        """Where an untrusted result came from, for its label: the page, the server."""
        return self.untrusted.format_map(collections.defaultdict(str, arguments)) if self.untrusted else ""

    def stub(self) -> str:
        """A one-function Python stub for the code-mode prompt and the type checker."""
        return f"def {self.name}{_format_signature(self.signature)}: ...  # {self.summary}"

    def call_form(self) -> str:
        """``name(a, b=None)``: how to call it, for a brief listing."""
        params = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                  for p in self.signature.parameters.values()]
        return f"{self.name}({', '.join(params)})"

    @property
    def summary(self) -> str:
        """The description's first paragraph on one line: what the stub comment says. Not its
        first line, which can stop mid-sentence (and drop where output goes, or what comes back)."""
        return " ".join(self.description.strip().split("\n\n")[0].split())

    def bind(self, args: tuple | list, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map a Python call's positional and keyword arguments onto parameter names."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}(): {exc}") from None
        return dict(bound.arguments)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"{self.name}: invalid arguments ({problems})") from None
        return {name: getattr(model, name) for name in model.model_fields_set | _required(self.args_model)}


def _required(model: type[BaseModel]) -> set[str]:
    return {name for name, f in model.model_fields.items() if f.is_required()}


def _plain_optional(prop: dict[str, Any]) -> dict[str, Any]:
    """``{"anyOf": [X, {"type": "null"}], "default": null}`` -> X: a parameter left out is None
    anyway, and the short form is what every model reads (and half the size)."""
    variants = prop.get("anyOf")
    if prop.get("default", 0) is not None or not isinstance(variants, list) or len(variants) != 2 \
            or {"type": "null"} not in variants:
        return prop
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    return {**next(v for v in variants if v != {"type": "null"}), **rest}


def _drop_titles(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("title", None)
        for value in node.values():
            _drop_titles(value)
    elif isinstance(node, list):
        for value in node:
            _drop_titles(value)


def _annotation_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "Any"
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _format_signature(sig: inspect.Signature) -> str:
    parts = []
    for p in sig.parameters.values():
        text = f"{p.name}: {_annotation_text(p.annotation)}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    return f"({', '.join(parts)}) -> {_annotation_text(sig.return_annotation)}"


def tool(func: Callable[..., Awaitable[Any]] | None = None, *, name: str | None = None, code_only: bool = False,
         untrusted: str = "", brief: bool = False):
    """Turn ``async def f(ctx, ...)`` into a Tool. Usable bare (``@tool``) or with options."""

    def build(fn: Callable[..., Awaitable[Any]]) -> Tool:
        hints = typing.get_type_hints(fn, include_extras=True)
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())[1:]  # the first one is ctx
        fields = {}
        for p in params:
            annotation = hints.get(p.name, Any)
            default = ... if p.default is inspect.Parameter.empty else p.default
            fields[p.name] = (annotation, default)
        tool_name = name or fn.__name__
        args_model = create_model(f"{tool_name}_args", __base__=_Args, **fields)
        public_sig = sig.replace(
            parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in params],
            return_annotation=hints.get("return", sig.return_annotation),
        )
        return Tool(tool_name, inspect.cleandoc(fn.__doc__ or tool_name), fn, args_model, public_sig, code_only,
                    untrusted, brief)

    return build(func) if func is not None else build


def format_result(value: Any) -> str:
    """A tool's return value as text for the model: strings as-is, the rest as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "OK"
    return json.dumps(value, ensure_ascii=False, default=str)


class ToolRegistry:
    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.register(t)

    def register(self, t: Tool) -> None:
        self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        return list(self._tools)

    def tools(self, *, include_code_only: bool = True, ctx: ToolContext | None = None) -> list[Tool]:
        """Every tool, or (with ``ctx``) those that chat may use."""
        return [t for t in self._tools.values()
                if (include_code_only or not t.code_only) and (ctx is None or t.available(ctx))]

    async def call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Validate and run; raises one of TOOL_ERRORS with a clear message on failure."""
        t = self._tools.get(name)
        if t is None or not t.available(ctx):
            raise ValueError(f"unknown tool {name!r}; available: {', '.join(x.name for x in self.tools(ctx=ctx))}")
        kwargs = t.validate(arguments)
        try:
            with tracing.span("nanobot.tool", tool=name):
                result = await t.func(ctx, **kwargs)
            if t.untrusted:  # what it returned was written by someone else: the turn is tainted
                ctx.guard.taint(t.origin(arguments) or name)
        except TOOL_ERRORS as exc:
            metrics.current.tool_call(name, type(exc).__name__)
            raise
        except OSError as exc:
            metrics.current.tool_call(name, "OSError")
            raise RuntimeError(f"{name}: {exc.strerror or exc}") from exc
        except Exception as exc:  # a tool bug must reach the model as an error, not kill the turn
            metrics.current.tool_call(name, "bug")
            raise RuntimeError(f"{name}: {type(exc).__name__}: {exc}") from exc
        metrics.current.tool_call(name, "ok")
        return result

    async def call_for_model(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Tool-calling mode: the result, or the error, as text for the model."""
        try:
            return format_result(await self.call(name, arguments, ctx))
        except TOOL_ERRORS as exc:
            return f"Error: {type(exc).__name__}: {exc}"
