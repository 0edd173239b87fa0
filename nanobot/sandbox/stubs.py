"""Python stubs of the tools, for the code-mode prompt and for Monty's type checker.

Both read the same text, generated from the tools' signatures, so what the model is told and
what the checker enforces cannot drift apart.
"""

from __future__ import annotations

from typing import Iterable

from nanobot.tools.registry import Tool

# Names the registry's annotation rendering may produce (``Optional[int]``, ``Literal['a']``).
STUB_HEADER = "from typing import Any, Literal, Optional, Union\n"


def render_stubs(tools: Iterable[Tool], *, header: bool = True, listed: set[str] | None = None) -> str:
    """One ``def name(...) -> T: ...  # summary`` per tool.

    ``header`` adds the ``typing`` import the type checker needs; a prompt can leave it out.
    ``listed`` (the prompt): built-in tools marked ``brief`` share one line of call forms, and
    the tools named in it (MCP tools offered on demand: ``agent.tool_offer``) get one line each;
    ``tool_help(name)`` gives any one's full stub.
    """
    tools = list(tools)
    if listed is None:
        body = "\n".join(t.stub() for t in tools)
        return f"{STUB_HEADER}\n{body}\n" if header else f"{body}\n"
    listed = [t for t in tools if t.name in listed and hasattr(t, "listing_line")]
    brief = [t for t in tools if t.brief and not hasattr(t, "listing_line")]
    stubs = [t.stub() for t in tools if t not in listed and t not in brief]
    if brief:
        stubs.append(f"# Also: {', '.join(t.call_form() for t in brief)}. tool_help(name) gives one's full stub.")
    if listed:
        stubs.append("# More functions; tool_help(name) returns one's full stub (parameters, result):")
        stubs += [t.listing_line() for t in listed]
    body = "\n".join(stubs)
    return f"{STUB_HEADER}\n{body}\n" if header else f"{body}\n"
