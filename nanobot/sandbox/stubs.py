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
    ``budgeted`` (the prompt): tools that can be listed (MCP tools) are, when their stubs
    would take more than ``LISTED_STUBS_BUDGET`` characters.
    """
    tools = list(tools)
    listable = [t for t in tools if hasattr(t, "listing_line")]
    stubs = [t.stub() for t in tools]
    if budgeted and sum(len(t.stub()) for t in listable) > LISTED_STUBS_BUDGET:
        stubs = [t.stub() for t in tools if t not in listable]
        stubs.append("# More functions; tool_help(name) returns one's full stub (parameters, result):")
        stubs += [t.listing_line() for t in listable]
    body = "\n".join(stubs)
    return f"{STUB_HEADER}\n{body}\n" if header else f"{body}\n"
