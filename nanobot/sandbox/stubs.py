"""Python stubs of the tools, for the code-mode prompt and for Monty's type checker.

Both read the same text, generated from the tools' signatures, so what the model is told and
what the checker enforces cannot drift apart.
"""

from __future__ import annotations

from typing import Iterable

from nanobot.tools.registry import Tool

# Names the registry's annotation rendering may produce (``Optional[int]``, ``Literal['a']``).
STUB_HEADER = "from typing import Any, Literal, Optional, Union\n"


# Past this many characters of MCP stubs (about 1,300 tokens), the prompt lists those
# functions by name and one line each, and ``tool_help(name)`` gives a full stub.
LISTED_STUBS_BUDGET = 4000


def render_stubs(tools: Iterable[Tool], *, header: bool = True, budgeted: bool = False) -> str:
    """One ``def name(...) -> T: ...  # summary`` per tool.

    ``header`` adds the ``typing`` import the type checker needs; a prompt can leave it out.
    ``budgeted`` (the prompt): built-in tools marked ``brief`` share one line of call forms, and
    tools that can be listed (MCP tools) are, when their stubs would take more than
    ``LISTED_STUBS_BUDGET`` characters; ``tool_help(name)`` gives any one's full stub.
    """
    tools = list(tools)
    if not budgeted:
        body = "\n".join(t.stub() for t in tools)
        return f"{STUB_HEADER}\n{body}\n" if header else f"{body}\n"
    listable = [t for t in tools if hasattr(t, "listing_line")]
    listed = listable if sum(len(t.stub()) for t in listable) > LISTED_STUBS_BUDGET else []
    brief = [t for t in tools if t.brief and t not in listable]
    stubs = [t.stub() for t in tools if t not in listed and t not in brief]
    if brief:
        stubs.append(f"# Also: {', '.join(t.call_form() for t in brief)}. tool_help(name) gives one's full stub.")
    if listed:
        stubs.append("# More functions; tool_help(name) returns one's full stub (parameters, result):")
        stubs += [t.listing_line() for t in listed]
    body = "\n".join(stubs)
    return f"{STUB_HEADER}\n{body}\n" if header else f"{body}\n"
