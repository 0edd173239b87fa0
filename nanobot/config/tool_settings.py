"""``tools``: the shell, the web, MCP servers, transcription, speech."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from nanobot.config.base import AddressAndPort, Section, ServerUrl, Token, address_and_port


class ExecTool(Section):
    enabled: bool = True
    timeout: int = Field(60, gt=0)
    max_output_chars: int = Field(10000, gt=0)
    # "auto": confine every command (Landlock + seccomp), refuse if this machine cannot;
    # "off": run commands with the daemon's own rights (a warning in the log and in status).
    sandbox: Literal["auto", "off"] = "auto"
    network: bool = False  # let confined commands open sockets
    read_paths: list[str] = []  # more read-only paths for confined commands, besides the system's
    max_memory_mb: int = Field(4096, gt=0)  # address space of each confined process


class WebSearch(Section):
    provider: Literal["duckduckgo", "brave", "tavily", "searxng"] = "duckduckgo"
    api_key: Token = ""
    url: ServerUrl = ""  # searxng: the instance ("http://searxng:8080"), with json among its search.formats
    max_results: int = Field(5, gt=0)

    @model_validator(mode="after")
    def _instance_named(self) -> "WebSearch":
        if self.provider == "searxng" and not self.url:
            raise ValueError("url is empty while provider is searxng: name the instance (\"http://searxng:8080\")")
        return self


class WebFetch(Section):
    max_chars: int = Field(50000, gt=0)
    max_bytes: int = Field(5_000_000, gt=0)
    timeout: float = Field(20.0, gt=0)
    # Private addresses web_fetch may reach all the same, each as "ADDRESS:PORT" (a service on
    # your LAN): that address and port only, so a redirect to any other private one is refused.
    allow_private: list[AddressAndPort] = []

    def allowed_private(self) -> frozenset[tuple[str, int]]:
        return frozenset(address_and_port(entry) for entry in self.allow_private)


class Web(Section):
    search: WebSearch = WebSearch()
    fetch: WebFetch = WebFetch()


class McpServer(Section):
    """One MCP server: a command (stdio) or a URL (streamable HTTP, or SSE)."""

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: ServerUrl | None = None
    headers: dict[str, str] = {}
    transport: Literal["stdio", "streamable-http", "sse"] | None = None  # default: from command / url
    enabled: bool = True
    tool_timeout: float = Field(30.0, gt=0)  # a call past it raises TimeoutError (and is cancelled)
    start_timeout: float = Field(30.0, gt=0)  # connecting and listing the tools
    allowed_tools: list[str] | None = None  # the server's own tool names; all when absent
    # "auto": its tools go with every request (native schemas, code stubs) unless all MCP
    # schemas together pass 10% of contextTokens; "onDemand": found through find_tools / tool_help.
    load: Literal["auto", "always", "onDemand"] = "auto"

    @model_validator(mode="after")
    def _one_way_to_reach_it(self) -> McpServer:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either 'command' (a stdio server) or 'url' (an HTTP server), not both or neither")
        if self.transport is None:
            self.transport = "stdio" if self.command else "streamable-http"
        if (self.transport == "stdio") != bool(self.command):
            raise ValueError(f"transport {self.transport!r} needs {'command' if self.transport == 'stdio' else 'url'}")
        return self


class Transcription(Section):
    """Voice notes to text; ``provider`` names a ``providers`` entry (empty: off)."""

    provider: str = ""
    model: str = "whisper-1"
    language: str | None = None  # ISO-639-1 hint, e.g. "de"; None lets the server detect it
    max_seconds: int = Field(600, gt=0)  # longer notes are refused with a reply saying so
    max_mb: int = Field(25, gt=0)  # OpenAI's own upload limit
    timeout: float = Field(120.0, gt=0)


class Speech(Section):
    """Replies spoken as voice notes; ``provider`` names a ``providers`` entry (empty: off)."""

    provider: str = ""
    model: str = "gpt-4o-mini-tts"
    voice: str = "alloy"
    # "whenVoice": a reply to a voice note is spoken too; "always"; "never". /voice sets it per chat.
    reply: Literal["whenVoice", "always", "never"] = "whenVoice"
    max_chars: int = Field(1500, gt=0)  # a longer reply is not spoken (its text goes, as always)
    timeout: float = Field(60.0, gt=0)


class Tools(Section):
    restrict_to_workspace: bool = True
    max_workspace_mb: int = Field(1024, gt=0)  # what the file tools may fill the workspace up to
    exec: ExecTool = ExecTool()
    web: Web = Web()
    mcp_servers: dict[str, McpServer] = {}
    transcription: Transcription = Transcription()
    speech: Speech = Speech()
