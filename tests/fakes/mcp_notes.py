"""A real MCP server written with the official SDK (``MCPServer``, FastMCP's name in mcp 2.x):
a small notes service with ten tools. Run it as a child over stdio, or over streamable HTTP
or SSE on 127.0.0.1::

    python -m tests.fakes.mcp_notes                          # stdio
    python -m tests.fakes.mcp_notes --http PORT [--sse]      # network transports
    python -m tests.fakes.mcp_notes --many 30                # ten tools plus 30 more

Tools cover what a client must handle: structured output (``add_note``, ``get_note``,
``search``), plain text (``render``), a tool error (``fail``), a slow call (``slow``), an enum
and optional parameters (``search``), a list result (``list_notes``), an image (``chart``)
and a crash mid-call (``crash``: the process exits). ``count_calls`` says how many calls the
server has seen, so a test can check that a timed-out call was cancelled. The notes live in
memory, per process.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from pydantic import BaseModel

server = MCPServer("notes")


class Note(BaseModel):
    id: int
    title: str
    body: str = ""
    tags: list[str] = []


NOTES: dict[int, Note] = {}
CALLS = {"count": 0, "cancelled": 0}


def _seen() -> None:
    CALLS["count"] += 1


@server.tool()
def add_note(title: str, body: str = "", tags: list[str] | None = None) -> Note:
    """Add a note; returns it with its id."""
    _seen()
    note = Note(id=len(NOTES) + 1, title=title, body=body, tags=tags or [])
    NOTES[note.id] = note
    return note


@server.tool()
def get_note(note_id: int) -> Note:
    """One note by id."""
    _seen()
    if note_id not in NOTES:
        raise ToolError(f"no note {note_id}")
    return NOTES[note_id]


@server.tool()
def list_notes() -> list[Note]:
    """Every note, oldest first."""
    _seen()
    return list(NOTES.values())


@server.tool()
def search(query: str, field: Literal["title", "body", "any"] = "any", limit: int = 10) -> list[int]:
    """Ids of notes whose field contains the query (case-insensitive)."""
    _seen()
    q = query.lower()
    hits = [n.id for n in NOTES.values()
            if any(q in getattr(n, f).lower() for f in (("title", "body") if field == "any" else (field,)))]
    return hits[:limit]


@server.tool(structured_output=False)
def render(note_id: int) -> str:
    """A note as Markdown text."""
    _seen()
    note = NOTES.get(note_id)
    return f"# {note.title}\n\n{note.body}" if note else "(no such note)"


@server.tool()
def fail(reason: str = "it broke") -> str:
    """Always fails."""
    _seen()
    raise ToolError(reason)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    _seen()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        CALLS["cancelled"] += 1
        raise
    return "finally"


@server.tool()
def count_calls() -> dict:
    """How many calls this server saw, and how many were cancelled."""
    return dict(CALLS)


@server.tool()
def chart() -> Image:
    """A tiny PNG."""
    _seen()
    return Image(data=base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8AAAAMBAQAY3Y2wAAAAAElFTkSuQmCC"),
                 format="png")


@server.tool()
def crash() -> str:
    """Kills the server process in the middle of the call."""
    os._exit(3)


def add_many(count: int) -> None:
    """``count`` more tools, like a big real server (a tracker, a mail service) offers."""
    def make(number: int):
        def operation(item_id: str, verbose: bool = False) -> dict:
            return {"tool": number, "item": item_id}

        return operation

    for i in range(count):
        server.add_tool(make(i), name=f"op_{i:03d}",
                        description=f"Operation number {i} on one item of the service, with details.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0)
    parser.add_argument("--sse", action="store_true")
    parser.add_argument("--many", type=int, default=0, help="add this many extra tools")
    parser.add_argument("--tag", default="", help="ignored: lets a test find this process")
    args = parser.parse_args()
    add_many(args.many)
    if not args.http:
        asyncio.run(server.run_stdio_async())
    elif args.sse:
        asyncio.run(server.run_sse_async(host="127.0.0.1", port=args.http))
    else:
        asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=args.http))


if __name__ == "__main__":
    main()
