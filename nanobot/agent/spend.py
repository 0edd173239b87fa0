"""Every model call goes through here: the daily budgets are checked first, and the call is
recorded after (tokens, which provider and model answered, its cost, whose chat, or how it failed).

Cost comes from ``providers.<name>.prices[model]`` (USD per 1M input / output tokens; speech
per 1M characters, transcription per minute); a model without a price costs 0.
``agents.defaults.dailyBudgetUsd``: a call that would take today's spend (in the configured
timezone) past it is not made, until midnight, with a clear reply, and the owner chat is told
once that day. Member chats together stop at their share (``memberDailyBudgetUsd``, by default
half), so they never lock the owner out. Checked before every call, not once per turn: a turn
overshoots by one reply at most. Code-mode cron jobs make no model call and keep running.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Awaitable, Callable, TypeVar
from zoneinfo import ZoneInfo

from nanobot import metrics, tracing
from nanobot.agent.prompt_size import estimate_tokens
from nanobot.media.speech import SpeechError, synthesize
from nanobot.media.transcribe import TranscriptionError, transcribe
from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError, Transcript
from nanobot.trust import MEMBER
from nanobot.usage import start_of_today

if TYPE_CHECKING:
    from nanobot.agent.deps import AgentDeps
    from nanobot.config import Config, Price


T = TypeVar("T")


class BudgetSpent(ProviderError):
    """Today's budget is used up: the message is the reply."""


def _price(config: Config, provider: str | None, model: str) -> Price | None:
    settings = config.providers.get(provider or config.agents.defaults.provider)
    return settings.prices.get(model) if settings else None


def call_cost(config: Config, response: LLMResponse) -> float:
    price = _price(config, response.provider, response.model)
    if price is None:
        return 0.0
    usage = response.usage
    return price.cost(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def prompt_cost(config: Config, request: ChatRequest) -> float:
    """What sending ``request`` will cost at least: its prompt, estimated (the reply is unknown)."""
    price = _price(config, request.provider, request.model)
    return estimate_tokens(request.messages) * price.input / 1e6 if price else 0.0


async def check_budget(deps: AgentDeps, request: ChatRequest, session_key: str, *, member: bool) -> None:
    """BudgetSpent when ``request`` would take today's spend past ``dailyBudgetUsd``, or a member
    chat's past what member chats together may spend (``Config.member_budget_usd``); so a turn
    overshoots by one reply at most. Members are told no figures (cost is the owner's business)."""
    coming, settings = prompt_cost(deps.config, request), deps.config.agents.defaults
    if settings.daily_budget_usd is not None:
        _within_a_day(coming, settings.daily_budget_usd, "agents.defaults.dailyBudgetUsd", member)
    if member and (share := deps.config.member_budget_usd()) is not None:
        _within_a_day(coming, share, "agents.defaults.memberDailyBudgetUsd", member)
    await check_spend(deps, coming, session_key, member=member)


async def check_spend(deps: AgentDeps, coming: float, session_key: str, *, member: bool) -> None:
    """``check_budget`` for a call that will cost about ``coming`` USD."""
    settings = deps.config.agents.defaults
    since = start_of_today(settings.timezone)
    after_midnight = f"I can answer again after midnight ({settings.timezone})"
    if settings.daily_budget_usd is not None:
        spent = await deps.usage.cost_since(since)
        if spent + coming > settings.daily_budget_usd or spent >= settings.daily_budget_usd:
            await _tell_owner_once(deps, session_key, spent, settings.daily_budget_usd)
            if member:
                raise BudgetSpent(f"Today's model budget is spent. {after_midnight}.")
            raise BudgetSpent(f"Today's model budget is spent (${spent:.2f} of ${settings.daily_budget_usd:.2f}"
                              f"{f', and this call would cost about ${coming:.2f}' if spent < settings.daily_budget_usd else ''}"
                              f"). {after_midnight}; scheduled code jobs keep running.")
    share = deps.config.member_budget_usd() if member else None
    if share is not None:
        spent = await deps.usage.cost_since(since, members=True)
        if spent + coming > share or spent >= share:
            raise BudgetSpent(f"Today's model budget for member chats is spent. {after_midnight}.")


def _within_a_day(coming: float, budget: float, key: str, member: bool) -> None:
    """A model call costing more than a whole day's budget would be refused tomorrow too: "after
    midnight" would not be true, and no notice says the budget is spent (nothing was). Mostly a
    long history sent to a priced model: a fresh conversation is small again."""
    if coming <= budget:
        return
    if member:
        raise BudgetSpent("This conversation has grown too long for my daily model budget: /new starts a fresh one.")
    raise BudgetSpent(f"This call alone would cost about ${coming:.2f}, more than a whole day's model budget "
                      f"(${budget:.2f}, {key}): /new starts a fresh, shorter conversation, or raise the budget.")


async def _tell_owner_once(deps: AgentDeps, session_key: str, spent: float, budget: float) -> None:
    """The owner hears once a day, unless the one asking is the owner at the terminal (the reply
    says it, and a notice per ``nanobot agent`` run would repeat in the log)."""
    today = datetime.now(ZoneInfo(deps.config.agents.defaults.timezone)).date().isoformat()
    if deps.usage.budget_notice_day != today and not session_key.startswith("cli:"):
        deps.usage.budget_notice_day = today
        await deps.announce(f"Today's model budget is spent (${spent:.2f} of ${budget:.2f}, "
                            "agents.defaults.dailyBudgetUsd): no model calls until midnight.")


async def metered_chat(deps: AgentDeps, request: ChatRequest, *, session_key: str, mode: str,
                       purpose: str, member: bool) -> LLMResponse:
    """``deps.provider.chat`` within the budgets, recorded in usage whether it worked or not."""
    await check_budget(deps, request, session_key, member=member)
    with tracing.span("nanobot.model_call", model=request.model, provider=request.provider, purpose=purpose) as span:
        response = await _call(deps, request, session_key, mode, purpose, member)
        if span is not None:
            span.set_attributes({"model": response.model or request.model, "provider": response.provider or "",
                                 "prompt_tokens": response.usage.prompt_tokens,
                                 "completion_tokens": response.usage.completion_tokens,
                                 "cached_tokens": response.usage.cached_tokens})
    return response


async def _call(deps: AgentDeps, request: ChatRequest, session_key: str, mode: str, purpose: str,
                member: bool) -> LLMResponse:
    """The call, recorded in usage and metrics whether it worked or not."""
    try:
        response = await deps.provider.chat(request)
    except ProviderError as exc:
        failed = exc.failed_attempts or [(request.provider or deps.config.agents.defaults.provider,
                                          request.model, str(exc))]
        await _record_failures(deps, failed, session_key, mode, purpose)  # status shows how often a server fails
        raise
    await _record_failures(deps, response.failed_attempts, session_key, mode, purpose)
    model, cost = response.model or request.model, call_cost(deps.config, response)
    metrics.current.model_call(response.provider, model, "ok", response.usage.prompt_tokens,
                               response.usage.completion_tokens, cost, response.usage.cached_tokens)
    await deps.usage.record_call(session_key, mode, model, response.usage.prompt_tokens,
                                 response.usage.completion_tokens, purpose, provider=response.provider,
                                 cost=cost, member=member, cached_tokens=response.usage.cached_tokens)
    return response


async def _record_failures(deps: AgentDeps, failed: list[tuple[str, str, str]], session_key: str, mode: str,
                           purpose: str) -> None:
    for provider, model, error in failed:
        metrics.current.model_call(provider, model, "error")  # not its text: labels hold no message
        await deps.usage.record_call(session_key, mode, model, 0, 0, purpose, outcome=error[:200],
                                     provider=provider)


async def metered_speech(deps: AgentDeps, session_key: str, text: str) -> bytes:
    """A reply spoken (``tools.speech``), its characters priced at ``prices.<model>.inputChars``.
    BudgetSpent or SpeechError when it was not spoken."""
    settings = deps.config.tools.speech
    price = _price(deps.config, settings.provider, settings.model)
    cost = len(text) * price.input_chars / 1e6 if price else 0.0
    return await _metered(deps, session_key, "speech", settings.provider, settings.model, cost,
                          lambda: synthesize(deps.config, deps.provider, text), lambda _: cost, SpeechError)


async def metered_transcription(deps: AgentDeps, session_key: str, name: str, data: bytes,
                                seconds: float | None) -> str:
    """A voice note heard (``tools.transcription``): checked against the budgets at the minutes it
    lasts (``seconds``, at ``prices.<model>.inputMinutes``), recorded at what the server counted
    where it says (its seconds, or its tokens at ``input``/``output``): what it bills.
    BudgetSpent or TranscriptionError when it was not heard."""
    settings = deps.config.tools.transcription
    price = _price(deps.config, settings.provider, settings.model)

    def cost(heard: Transcript | None) -> float:  # the server's count first: it is what it bills
        if price is None:
            return 0.0
        if heard is not None and heard.usage is not None and (price.input or price.output):
            return price.cost(heard.usage.prompt_tokens, heard.usage.completion_tokens)
        return ((heard and heard.seconds) or seconds or 0.0) / 60 * price.input_minutes

    heard = await _metered(deps, session_key, "transcription", settings.provider, settings.model, cost(None),
                           lambda: transcribe(deps.config, deps.provider, name, data), cost, TranscriptionError)
    return heard.text


async def _metered(deps: AgentDeps, session_key: str, purpose: str, provider: str, model: str, estimate: float,
                   call: Callable[[], Awaitable[T]], cost_of: Callable[[T], float], failure: type[Exception]) -> T:
    """A call that is no chat completion (speech, transcription) within the same budgets as model
    calls: checked at ``estimate``, recorded under ``purpose`` at ``cost_of`` its result, or at 0
    with the reason when it failed."""
    member = deps.trust(session_key) == MEMBER
    await check_spend(deps, estimate, session_key, member=member)
    try:
        result = await call()
    except failure as exc:
        metrics.current.model_call(provider, model, "error")
        await deps.usage.record_call(session_key, purpose, model, 0, 0, purpose, outcome=str(exc)[:200],
                                     provider=provider, member=member)
        raise
    cost = cost_of(result)
    metrics.current.model_call(provider, model, "ok", cost=cost)
    await deps.usage.record_call(session_key, purpose, model, 0, 0, purpose, provider=provider, cost=cost,
                                 member=member)
    return result
