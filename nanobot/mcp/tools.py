"""An MCP server's tool as a registry tool ``<server>_<tool>``: the same entry serves native
tool calls, code mode, hybrid and cron code. Results are written by someone else, so the
tool is ``untrusted``: a call marks the turn, and tools mode wraps the text."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from nanobot.mcp.schema import Param, ToolFailed, identifier, params, render_stub, to_value
from nanobot.tools.registry import Tool, ToolContext
from nanobot.trust import OWNER

if TYPE_CHECKING:
    from nanobot.mcp.connection import McpConnection

SUMMARY_CHARS = 34  # the budgeted listing: one short line per tool (100 tools: about 1,400 tokens)


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class McpTool(Tool):
    server: str = ""
    tool_name: str = ""  # the server's own name for it
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    params: tuple[Param, ...] = ()

    @cached_property
    def parameters(self) -> dict[str, Any]:
        schema = {k: v for k, v in self.input_schema.items() if k not in ("title", "$schema")}
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return schema

    def available(self, ctx: ToolContext) -> bool:
        """Owner chats reach every server; a member chat only those its override lists."""
        if ctx.trust == OWNER:
            return True
        override = ctx.config.agents.overrides.get(ctx.session_key)
        return bool(override and override.mcp_servers and self.server in override.mcp_servers)

    def origin(self, arguments: dict[str, Any]) -> str:
        return f"the MCP server {self.server!r}, tool {self.tool_name}"

    def stub(self) -> str:
        return render_stub(self.name, self.description, list(self.params), self.output_schema)

    def listing_line(self) -> str:
        summary = " ".join(self.description.split()).split(". ")[0]
        summary = summary if len(summary) <= SUMMARY_CHARS else summary[:SUMMARY_CHARS - 1] + "…"
        return f"# {self.name}: {summary}"

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Python names (from code) or schema names (from a tool call) -> schema names; the
        server checks the values. A None for an optional parameter means "not given"."""
        by_name = {p.name: p for p in self.params} | {p.wire: p for p in self.params}
        unknown = [k for k in arguments if k not in by_name]
        free_form = not self.params or self.input_schema.get("additionalProperties") is True
        if unknown and not free_form:
            raise ValueError(f"{self.name}: unknown argument(s) {', '.join(unknown)}; "
                             f"it takes {', '.join(p.name for p in self.params) or 'none'}")
        out = {by_name[k].wire if k in by_name else k: v for k, v in arguments.items()
               if not (v is None and k in by_name and not by_name[k].required)}
        missing = [p.name for p in self.params if p.required and p.wire not in out]
        if missing:
            raise ValueError(f"{self.name}: missing required argument(s) {', '.join(missing)}")
        return out


def make_tool(connection: McpConnection, spec: Any) -> McpTool:
    """The registry tool for one listed MCP tool (``spec``: mcp.types.Tool)."""
    name = f"{identifier(connection.name)}_{identifier(spec.name)}"
    plist = tuple(params(spec.input_schema or {}))
    output_schema = spec.output_schema

    async def call(ctx: ToolContext, **arguments: Any) -> Any:
        result = await connection.call(spec.name, arguments)
        try:
            return to_value(result, output_schema)
        except ToolFailed as exc:
            raise RuntimeError(f"{name}: {exc}") from None

    signature = inspect.Signature([
        inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=inspect.Parameter.empty if p.required else None) for p in plist])
    description = (spec.description or spec.title or spec.name).strip()
    return McpTool(name, description, call, _AnyArgs, signature, untrusted="an MCP server", server=connection.name,
                   tool_name=spec.name, input_schema=dict(spec.input_schema or {}), output_schema=output_schema,
                   params=plist)
