"""``agents`` and ``providers``: models, modes, budgets, per-chat overrides, the sandbox's limits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from nanobot.config.base import ExecutionMode, Section, ServerUrl, Timezone, Token

# What a chat request's body holds that nanobot writes itself (``providers.<name>.extraBody`` adds the rest).
OWN_REQUEST_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "stream", "stream_options", "max_tokens",
                                "max_completion_tokens", "temperature", "prompt_cache_key"})


class CodeRuntime(Section):
    max_memory_mb: int = Field(100, gt=0)
    max_execution_ms: int = Field(30000, gt=0)
    max_tool_calls: int = Field(200, gt=0)
    max_llm_queries: int = Field(20, ge=0)
    max_output_chars: int = Field(20000, gt=0)
    max_program_chars: int = Field(200_000, gt=0)  # longer programs are refused unparsed
    type_check: bool = False
    persist_state: bool = True
    large_input_chars: int = Field(8000, gt=0)


class ModelChoice(Section):
    """A model on a provider: an entry of ``agents.models`` or ``fallbacks``."""

    provider: str
    model: str


class TaskLimits(Section):
    """``agents.defaults.tasks``: background tasks started with spawn()."""

    max_per_chat: int = Field(3, gt=0)  # running or queued, per chat
    max_total: int = Field(10, gt=0)  # running or queued, in the whole assistant
    max_minutes: float = Field(30, gt=0)  # a task running longer is stopped, and says so
    max_iterations: int = Field(50, gt=0)  # model calls of a task's turn

    @property
    def member_total(self) -> int:
        """What member chats together may hold: one chat's worth of maxTotal stays the owner's."""
        return max(1, self.max_total - self.max_per_chat)


class AgentSettings(Section):
    workspace: str = "~/.nanobot/workspace"
    provider: str = "openai"
    model: str = "gpt-4.1-mini"
    max_tokens: int = Field(8192, gt=0)
    # The model server's context window: the prompt is trimmed to contextTokens - maxTokens.
    context_tokens: int = Field(65536, gt=0)
    temperature: float = 0.2
    max_iterations: int = Field(20, gt=0)
    memory_window: int = Field(50, gt=0)
    timezone: Timezone = "UTC"
    execution_mode: ExecutionMode = "code"
    code_runtime: CodeRuntime = CodeRuntime()
    fallbacks: list[ModelChoice] = []  # tried in order when the model fails (429, 5xx, timeout, no connection)
    daily_budget_usd: float | None = Field(None, gt=0)  # model calls stop for the day once spent
    tasks: TaskLimits = TaskLimits()  # background tasks (spawn)
    # What all member chats together may spend in a day (null: half of dailyBudgetUsd), so that
    # members can never spend the owner's share.
    member_daily_budget_usd: float | None = Field(None, gt=0)
    # Photos as image parts: "auto" sends them and, if the model server rejects them, falls
    # back to the file's path and remembers that for the model; "off" never sends them.
    vision: Literal["auto", "on", "off"] = "auto"

    @model_validator(mode="after")
    def _reply_fits_context(self) -> AgentSettings:
        if self.max_tokens >= self.context_tokens:
            raise ValueError(f"maxTokens ({self.max_tokens}) must be below contextTokens ({self.context_tokens}): "
                             "the reply has to fit in the model's context together with the prompt")
        return self

    def fallback_models(self) -> list[tuple[str, str]]:
        """(provider, model) of each fallback, in order, as a model request takes them."""
        return [(f.provider, f.model) for f in self.fallbacks]


class AgentOverride(Section):
    """Any field of ``defaults``, all optional; keyed by session key."""

    workspace: str | None = None
    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    context_tokens: int | None = None
    temperature: float | None = None
    max_iterations: int | None = None
    memory_window: int | None = None
    timezone: Timezone | None = None
    execution_mode: ExecutionMode | None = None
    code_runtime: CodeRuntime | None = None
    fallbacks: list[ModelChoice] | None = None
    vision: Literal["auto", "on", "off"] | None = None
    # Not fields of defaults: widens a member chat ("owner") or narrows an owner chat ("member");
    # the MCP servers a member chat may use (owner chats reach them all).
    trust: Literal["owner", "member"] | None = None
    mcp_servers: list[str] | None = None


class Agents(Section):
    defaults: AgentSettings = AgentSettings()
    overrides: dict[str, AgentOverride] = {}
    models: dict[str, ModelChoice] = {}  # the choices of /model NAME
    member_models: list[str] = []  # the names of models that member chats may pick (none: the default only)

    @field_validator("overrides")
    @classmethod
    def _chat_keys(cls, overrides: dict[str, AgentOverride]) -> dict[str, AgentOverride]:
        """Each key a chat's (``channel:chat_id``): another shape would override no chat, silently."""
        for key in overrides:
            channel, _, chat_id = key.partition(":")
            if not channel or not chat_id:
                raise ValueError(f"{key!r} names no chat: a key is CHANNEL:CHAT_ID, as /status shows it "
                                 "(telegram:123456, slack:C0123:1712345678.000100)")
        return overrides

    @model_validator(mode="after")
    def _member_models_exist(self) -> Agents:
        unknown = [name for name in self.member_models if name not in self.models]
        if unknown:
            raise ValueError(f"memberModels: {', '.join(map(repr, unknown))} not in agents.models")
        return self


class Price(Section):
    input: float = Field(0.0, ge=0)  # USD per 1M prompt tokens
    output: float = Field(0.0, ge=0)  # USD per 1M completion tokens
    cached_input: float | None = Field(None, ge=0)  # USD per 1M prompt tokens read from the cache (default: input)
    input_chars: float = Field(0.0, ge=0)  # USD per 1M characters of input (speech models price text so)
    input_minutes: float = Field(0.0, ge=0)  # USD per minute of audio in (transcription models price it so)

    def cost(self, prompt: int, completion: int, cached: int = 0) -> float:
        """USD for one call: the cached part of the prompt at ``cachedInput``."""
        cached = min(cached, prompt)
        rate = self.input if self.cached_input is None else self.cached_input
        return ((prompt - cached) * self.input + cached * rate + completion * self.output) / 1e6


class ProviderConfig(Section):
    api_key: Token = ""
    api_base: ServerUrl | None = None
    timeout: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)
    cooldown_seconds: float = Field(60.0, ge=0)  # after a failure, fallbacks are tried first for this long
    # Tools mode: tell the model the <tool_call>{...}</tool_call> text form (servers without native
    # tool calling); such blocks are accepted from any model either way.
    text_tool_calls: bool = False
    prices: dict[str, Price] = {}  # model name -> price
    # Send a per-chat prompt_cache_key (OpenAI's hint that routes a chat's requests to one cache).
    prompt_cache_key: bool = False
    # Fields added to every chat request to this server, as its API names them: reasoning_effort,
    # DeepSeek's thinking, vLLM's chat_template_kwargs, OpenRouter's provider routing.
    extra_body: dict[str, Any] = {}

    @field_validator("extra_body")
    @classmethod
    def _not_ours(cls, body: dict[str, Any]) -> dict[str, Any]:
        if taken := sorted(OWN_REQUEST_FIELDS.intersection(body)):
            raise ValueError(f"{', '.join(taken)}: set by nanobot itself (its own keys say how: maxTokens, temperature)")
        return body
