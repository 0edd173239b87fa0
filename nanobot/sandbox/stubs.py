"""Python stubs of the tools, for the code-mode prompt and for Monty's type checker.

Both read the same text, generated from the tools' signatures, so what the model is told and
what the checker enforces cannot drift apart.
"""

from __future__ import annotations

from typing import Iterable

from nanobot.tools.registry import Tool

# Names the registry's annotation rendering may produce (``Optional[int]``, ``Literal['a']``).
STUB_HEADER = "from typing import Any, Literal, Optional, Union\n"


def render_stubs(tools: Iterable[Tool], *, header: bool = True) -> str:
    """One ``def name(...) -> T: \"\"\"summary\"\"\"`` per tool, blank-line separated.

    ``header`` adds the ``typing`` import the type checker needs; a prompt can leave it out.
    """
    body = "\n".join(t.stub() for t in tools)
    return f"{STUB_HEADER}\n{body}\n" if header else f"{body}\n"
