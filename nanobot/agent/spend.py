"""Every model call goes through here: the daily budget is checked first, and the call is
recorded after (tokens, which provider and model answered, its cost, or how it failed).

Cost comes from ``providers.<name>.prices[model]`` (USD per 1M input / output tokens); a
model without a price costs 0. ``agents.defaults.dailyBudgetUsd``, once today's spend (in the
configured timezone) reaches it, stops model calls until midnight with a clear reply, and
tells the owner chat once that day. Code-mode cron jobs make no model call and keep running.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from nanobot.providers.base import ChatRequest, LLMResponse, ProviderError
from nanobot.usage import start_of_today

if TYPE_CHECKING:
    from nanobot.agent.deps import AgentDeps
    from nanobot.config import Config


class BudgetSpent(ProviderError):
    """Today's budget is used up: the message is the reply."""


def call_cost(config: Config, response: LLMResponse) -> float:
    provider = config.providers.get(response.provider or config.agents.defaults.provider)
    price = provider.prices.get(response.model) if provider else None
    if price is None:
        return 0.0
    return (response.usage.prompt_tokens * price.input + response.usage.completion_tokens * price.output) / 1e6


async def check_budget(deps: AgentDeps, session_key: str) -> None:
    """BudgetSpent once today's cost reaches the budget; the owner is told once a day, unless
    the one asking is the owner at the terminal (the reply says it, and a notice per
    ``nanobot agent`` run would repeat in the log)."""
    settings = deps.config.agents.defaults
    budget = settings.daily_budget_usd
    if budget is None or deps.usage is None:
        return
    spent = await deps.usage.cost_since(start_of_today(settings.timezone))
    if spent < budget:
        return
    today = datetime.now(ZoneInfo(settings.timezone)).date().isoformat()
    if deps.usage.budget_notice_day != today and not session_key.startswith("cli:"):
        deps.usage.budget_notice_day = today
        await deps.services.announce(f"Today's model budget is spent (${spent:.2f} of ${budget:.2f}, "
                                     "agents.defaults.dailyBudgetUsd): no model calls until midnight.")
    raise BudgetSpent(f"Today's model budget is spent (${spent:.2f} of ${budget:.2f}). I can answer again after "
                      f"midnight ({settings.timezone}); scheduled code jobs keep running.")


async def metered_chat(deps: AgentDeps, request: ChatRequest, *, session_key: str, mode: str,
                       purpose: str) -> LLMResponse:
    """``deps.provider.chat`` within the budget, recorded in usage whether it worked or not."""
    await check_budget(deps, session_key)
    usage = deps.usage
    try:
        response = await deps.provider.chat(request)
    except ProviderError as exc:
        if usage:  # failed calls are counted too: status shows how often a server fails
            failed = exc.failed_attempts or [(request.provider or deps.config.agents.defaults.provider,
                                              request.model, str(exc))]
            await _record_failures(deps, failed, session_key, mode, purpose)
        raise
    if usage:
        await _record_failures(deps, response.failed_attempts, session_key, mode, purpose)
        await usage.record_call(session_key, mode, response.model or request.model, response.usage.prompt_tokens,
                                response.usage.completion_tokens, purpose, provider=response.provider,
                                cost=call_cost(deps.config, response))
    return response


async def _record_failures(deps: AgentDeps, failed: list[tuple[str, str, str]], session_key: str, mode: str,
                           purpose: str) -> None:
    assert deps.usage is not None
    for provider, model, error in failed:
        await deps.usage.record_call(session_key, mode, model, 0, 0, purpose, outcome=error[:200], provider=provider)
