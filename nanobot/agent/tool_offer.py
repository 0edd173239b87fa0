"""Which tool schemas a native-tools request carries, and ``find_tools`` for the rest.

Every schema goes with every request, so 17 built-in tools cost 6,000 characters a call and
MCP servers can add tens of thousands. Past ``SCHEMA_BUDGET`` characters the seldom-needed
built-ins (``brief``) wait; MCP servers' tools are sent unless they are ``on_demand``: a
server with ``"load": "onDemand"``, or (``"auto"``) when all MCP schemas together would pass
``MCP_SHARE`` of the model's context. What waits is named in ``find_tools(query)``'s
description; its result carries the matching tools' schemas, and ``use_tool(name, arguments)``
(or a call by the tool's own name) runs one. The tools list itself never changes in a chat, so
every request starts with the bytes of the one before and a provider's prompt cache reuses
them. Code mode has the same split for its stubs (``brief`` tools and on-demand MCP tools are
listed by name, ``tool_help`` gives their stubs).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nanobot.agent.prompt_size import CHARS_PER_TOKEN

if TYPE_CHECKING:
    from nanobot.agent.turn import Turn
    from nanobot.config import Config
    from nanobot.tools.registry import Tool

SCHEMA_BUDGET = 3_000  # characters of built-in schemas sent whole; past it, brief ones wait for find_tools
MCP_SHARE = 0.10  # MCP schemas together past this share of contextTokens wait too ("load": "auto")
FIND_TOOLS = "find_tools"
USE_TOOL = "use_tool"
FOUND_PER_CALL = 8


def on_demand(tools: list[Tool], config: Config, context_tokens: int) -> set[str]:
    """The MCP tools offered only on demand (find_tools, tool_help): their server says so, or,
    for ``"auto"`` servers, all MCP schemas sent would take more than ``MCP_SHARE`` of the context."""
    servers = config.tools.mcp_servers
    mcp = [t for t in tools if _is_mcp(t) and t.server in servers]  # type: ignore[attr-defined]
    load = {t.name: servers[t.server].load for t in mcp}  # type: ignore[attr-defined]
    sent = sum(t.schema_size for t in mcp if load[t.name] != "onDemand")
    crowded = sent > MCP_SHARE * context_tokens * CHARS_PER_TOKEN
    return {t.name for t in mcp if load[t.name] == "onDemand" or load[t.name] == "auto" and crowded}


def native_schemas(turn: Turn) -> list[dict[str, Any]]:
    """The schemas for every request of the chat: the core ones, the MCP tools not on demand,
    and ``find_tools`` with ``use_tool`` while anything waits. The same list each time: what
    find_tools finds reaches the model in its result, after the last message."""
    tools = turn.deps.tools.tools(include_code_only=False, ctx=turn.ctx)
    waiting = _waiting(tools, turn)
    shown = [t.openai_schema for t in tools if t not in waiting]
    return [*shown, _find_tools_schema(waiting), USE_TOOL_SCHEMA] if waiting else shown


def find_tools(turn: Turn, raw_arguments: str) -> str:
    """The schemas of the waiting tools whose name or description has the query's words."""
    query = str(_json_object(raw_arguments).get("query", ""))
    waiting = _waiting(turn.deps.tools.tools(include_code_only=False, ctx=turn.ctx), turn)
    words = [w for w in query.lower().replace("_", " ").split() if len(w) > 1]
    scored = sorted(((sum(w in f"{t.name.replace('_', ' ')} {t.description}".lower() for w in words), t)
                     for t in waiting), key=lambda pair: -pair[0])
    found = [t for score, t in scored if score > 0][:FOUND_PER_CALL]
    if not found:
        return (f"No tool matches {query!r}. Not offered yet: {', '.join(t.name for t in waiting) or 'none'}; "
                "ask with other words or one of these names.")
    lines = [f"- {t.name}: {t.summary}\n  arguments: {json.dumps(t.openai_schema['function']['parameters'])}"
             for t in found]
    return f"Call one with {USE_TOOL}(name, arguments):\n" + "\n".join(lines)


def use_tool_call(raw_arguments: str) -> tuple[str, str] | str:
    """``use_tool``'s arguments as the (name, arguments JSON) of the call it stands for, or an
    error text for the model."""
    arguments = _json_object(raw_arguments)
    name, inner = arguments.get("name"), arguments.get("arguments", {})
    if not isinstance(name, str) or name in (FIND_TOOLS, USE_TOOL) or not isinstance(inner, dict):
        return (f"Error: {USE_TOOL} takes the name of a tool {FIND_TOOLS} showed and its arguments as "
                'an object, e.g. {"name": "move_file", "arguments": {"src": "a", "dst": "b"}}.')
    return name, json.dumps(inner)


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _waiting(tools: list[Tool], turn: Turn) -> list[Tool]:
    """Tools offered through find_tools and not found yet: seldom-needed built-ins past the
    budget, and MCP tools on demand."""
    builtin = [t for t in tools if not _is_mcp(t)]
    crowded = sum(t.schema_size for t in builtin) > SCHEMA_BUDGET
    later = on_demand(tools, turn.deps.config, turn.settings.context_tokens)
    return [t for t in tools if t.name in later or crowded and t.brief and not _is_mcp(t)]


def _is_mcp(tool: Tool) -> bool:
    return hasattr(tool, "listing_line")


def _find_tools_schema(waiting: list[Tool]) -> dict[str, Any]:
    builtin = [t.name for t in waiting if not hasattr(t, "listing_line")]
    servers: dict[str, int] = {}
    for t in waiting:
        if hasattr(t, "listing_line"):
            servers[t.server] = servers.get(t.server, 0) + 1  # type: ignore[attr-defined]
    more = [f"{', '.join(builtin)}" if builtin else "",
            *(f"{count} tools of the {name} server" for name, count in servers.items())]
    description = (f"Find tools by words (\"move file\") to run with {USE_TOOL}. "
                   f"Waiting: {'; '.join(filter(None, more))}.")
    return {"type": "function", "function": {
        "name": FIND_TOOLS, "description": description,
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


USE_TOOL_SCHEMA = {"type": "function", "function": {
    "name": USE_TOOL, "description": f"Run a tool {FIND_TOOLS} showed.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}}}}}
