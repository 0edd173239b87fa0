"""Which tool schemas a native-tools request carries, and ``find_tools`` for the rest.

Every schema goes with every request, so 17 built-in tools cost 6,000 characters a call and
MCP servers can add tens of thousands. Past ``SCHEMA_BUDGET`` characters a request carries
the core tools, the ones this turn found, and ``find_tools(query)``, whose description names
what else exists; a call to it adds the matching tools to the next request. Code mode has
the same split for its stubs (``brief`` tools, ``tool_help``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanobot.agent.loop import Turn
    from nanobot.tools.registry import Tool

SCHEMA_BUDGET = 3_000  # characters of schemas sent whole; past it, brief and MCP tools wait for find_tools
FIND_TOOLS = "find_tools"
FOUND_PER_CALL = 8


def native_schemas(turn: Turn) -> list[dict[str, Any]]:
    """The schemas for this request: all of them, or, past the budget, the core ones, what
    ``find_tools`` found this turn, and ``find_tools`` itself."""
    tools = turn.deps.tools.tools(include_code_only=False, ctx=turn.ctx)
    if sum(t.schema_size for t in tools) <= SCHEMA_BUDGET:
        return [t.openai_schema for t in tools]
    waiting = _waiting(tools, turn.found_tools)
    shown = [t.openai_schema for t in tools if t not in waiting]
    return [*shown, _find_tools_schema(waiting)] if waiting else shown


def find_tools(turn: Turn, raw_arguments: str) -> str:
    """Add the tools whose name or description has the query's words to the next request."""
    try:
        query = str(json.loads(raw_arguments or "{}").get("query", ""))
    except (ValueError, AttributeError):
        query = ""
    tools = turn.deps.tools.tools(include_code_only=False, ctx=turn.ctx)
    waiting = _waiting(tools, turn.found_tools)
    words = [w for w in query.lower().replace("_", " ").split() if len(w) > 1]
    scored = sorted(((sum(w in f"{t.name.replace('_', ' ')} {t.description}".lower() for w in words), t)
                     for t in waiting), key=lambda pair: -pair[0])
    found = [t for score, t in scored if score > 0][:FOUND_PER_CALL]
    if not found:
        return (f"No tool matches {query!r}. Not offered yet: {', '.join(t.name for t in waiting) or 'none'}; "
                "ask with other words or one of these names.")
    turn.found_tools.update(t.name for t in found)
    lines = [f"- {t.name}: {t.summary}" for t in found]
    return "These tools can be called from your next message on:\n" + "\n".join(lines)


def _waiting(tools: list[Tool], found: set[str]) -> list[Tool]:
    """Tools offered through find_tools: seldom-needed built-ins and MCP tools, not yet found."""
    return [t for t in tools if (t.brief or hasattr(t, "listing_line")) and t.name not in found]


def _find_tools_schema(waiting: list[Tool]) -> dict[str, Any]:
    builtin = [t.name for t in waiting if not hasattr(t, "listing_line")]
    servers: dict[str, int] = {}
    for t in waiting:
        if hasattr(t, "listing_line"):
            servers[t.server] = servers.get(t.server, 0) + 1  # type: ignore[attr-defined]
    more = [f"{', '.join(builtin)}" if builtin else "",
            *(f"{count} tools of the {name} server" for name, count in servers.items())]
    description = ("Make more tools callable from your next message: give words for what you need "
                   f"(e.g. \"move file\"). Not offered yet: {'; '.join(filter(None, more))}.")
    return {"type": "function", "function": {
        "name": FIND_TOOLS, "description": description,
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
