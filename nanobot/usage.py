"""Usage counters in ``nanobot.db``: every model call's tokens and every code execution.

``nanobot status`` reads the totals per execution mode.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from datetime import datetime, time as day_time, timedelta
from zoneinfo import ZoneInfo

from nanobot.chat_names import parent_chat
from nanobot.database import Database, Migrations, StoreUnavailable

log = logging.getLogger(__name__)

FAILED = "sum(CASE WHEN outcome != 'ok' THEN 1 ELSE 0 END)"

# Whether the call was a member chat's: members together have their own daily budget.
MEMBER_COLUMN = "ALTER TABLE model_calls ADD COLUMN member INTEGER NOT NULL DEFAULT 0;"
# Prompt tokens the provider read from its cache (what the prompt-cache work is measured by).
CACHED_COLUMN = "ALTER TABLE model_calls ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;"
# The bot's all-time figures (status, /status) kept as each call and run is recorded: a few rows
# to read, not every call of years (at a million calls the sums took 0.7 s each, and SQLite's one
# connection waited behind them). A chat's calls are found by index.
_TOTALS = f"""
CREATE INDEX model_calls_chat ON model_calls (session_key);
CREATE INDEX executions_chat ON executions (session_key);
CREATE TABLE usage_totals (
    provider TEXT NOT NULL, model TEXT NOT NULL, mode TEXT NOT NULL, member INTEGER NOT NULL,
    calls BIGINT NOT NULL, failed BIGINT NOT NULL, prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL, cost_usd DOUBLE PRECISION NOT NULL, PRIMARY KEY (provider, model, mode, member));
INSERT INTO usage_totals SELECT provider, model, mode, member, count(*), {FAILED}, sum(prompt_tokens),
    sum(completion_tokens), sum(cached_tokens), sum(cost_usd) FROM model_calls GROUP BY provider, model, mode, member;
CREATE TABLE execution_totals (mode TEXT PRIMARY KEY, runs BIGINT NOT NULL, failures BIGINT NOT NULL);
INSERT INTO execution_totals SELECT mode, count(*), {FAILED} FROM executions GROUP BY mode;
"""
_COUNT_CALL = """INSERT INTO usage_totals VALUES (NEW.provider, NEW.model, NEW.mode, NEW.member, 1,
        CASE WHEN NEW.outcome != 'ok' THEN 1 ELSE 0 END, NEW.prompt_tokens, NEW.completion_tokens, NEW.cached_tokens,
        NEW.cost_usd)
    ON CONFLICT (provider, model, mode, member) DO UPDATE SET calls = usage_totals.calls + 1,
        failed = usage_totals.failed + excluded.failed, prompt_tokens = usage_totals.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = usage_totals.completion_tokens + excluded.completion_tokens,
        cached_tokens = usage_totals.cached_tokens + excluded.cached_tokens, cost_usd = usage_totals.cost_usd + excluded.cost_usd;"""
_COUNT_RUN = """INSERT INTO execution_totals VALUES (NEW.mode, 1, CASE WHEN NEW.outcome != 'ok' THEN 1 ELSE 0 END)
    ON CONFLICT (mode) DO UPDATE SET runs = execution_totals.runs + 1,
        failures = execution_totals.failures + excluded.failures;"""
_SQLITE_TOTALS = _TOTALS + f"""
CREATE TRIGGER model_calls_counted AFTER INSERT ON model_calls BEGIN {_COUNT_CALL} END;
CREATE TRIGGER executions_counted AFTER INSERT ON executions BEGIN {_COUNT_RUN} END;
"""
SQLITE_MIGRATIONS = [
    """
    CREATE TABLE model_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, session_key TEXT NOT NULL,
        mode TEXT NOT NULL, purpose TEXT NOT NULL, model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL);
    CREATE TABLE executions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, session_key TEXT NOT NULL,
        mode TEXT NOT NULL, duration_ms REAL NOT NULL, function_calls INTEGER NOT NULL,
        outcome TEXT NOT NULL);
    """,
    # Failed model calls are recorded too (tokens 0), so status shows how often the server fails.
    "ALTER TABLE model_calls ADD COLUMN outcome TEXT NOT NULL DEFAULT 'ok';",
    # Which provider answered (fallbacks), and what the call cost (providers.<name>.prices).
    """
    ALTER TABLE model_calls ADD COLUMN provider TEXT NOT NULL DEFAULT '';
    ALTER TABLE model_calls ADD COLUMN cost_usd REAL NOT NULL DEFAULT 0;
    CREATE INDEX model_calls_ts ON model_calls (ts);
    """,
    MEMBER_COLUMN,
    CACHED_COLUMN,
    _SQLITE_TOTALS,
]
_PG_TOTALS = _TOTALS + f"""
CREATE FUNCTION count_model_call() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {_COUNT_CALL} RETURN NULL; END $$;
CREATE TRIGGER model_calls_counted AFTER INSERT ON model_calls FOR EACH ROW EXECUTE FUNCTION count_model_call();
CREATE FUNCTION count_execution() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {_COUNT_RUN} RETURN NULL; END $$;
CREATE TRIGGER executions_counted AFTER INSERT ON executions FOR EACH ROW EXECUTE FUNCTION count_execution();
"""
MIGRATIONS: Migrations = {"sqlite": SQLITE_MIGRATIONS, "postgresql": ["""
    CREATE TABLE model_calls (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ts DOUBLE PRECISION NOT NULL,
        session_key TEXT NOT NULL, mode TEXT NOT NULL, purpose TEXT NOT NULL, model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, outcome TEXT NOT NULL DEFAULT 'ok',
        provider TEXT NOT NULL DEFAULT '', cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0);
    CREATE INDEX model_calls_ts ON model_calls (ts);
    CREATE TABLE executions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ts DOUBLE PRECISION NOT NULL,
        session_key TEXT NOT NULL, mode TEXT NOT NULL, duration_ms DOUBLE PRECISION NOT NULL,
        function_calls INTEGER NOT NULL, outcome TEXT NOT NULL);
    """, MEMBER_COLUMN, CACHED_COLUMN, _PG_TOTALS]}


def start_of_today(timezone: str) -> float:
    """Midnight today in ``timezone``, as a Unix time (the budget's day)."""
    zone = ZoneInfo(timezone)
    return datetime.combine(datetime.now(zone).date(), day_time(0), tzinfo=zone).timestamp()


@dataclass
class CallTotals:
    """Model calls of one kind (a mode, a model): how many, how many failed, tokens, cost."""

    model_calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cached_tokens: int = 0

    def summary(self, noun: str = "model call", *, cost: bool = True) -> str:
        """Calls and tokens (and how many of the prompt's came from the provider's cache), and
        the cost when ``cost`` (members are shown none)."""
        failed_calls = f" ({self.failed_calls} failed)" if self.failed_calls else ""
        cost_text = f", ${self.cost_usd:.4f}" if self.cost_usd and cost else ""
        cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
        return (f"{plural(self.model_calls, noun)}{failed_calls}, {self.prompt_tokens} prompt{cached} + "
                f"{self.completion_tokens} completion tokens{cost_text}")


@dataclass
class ModeTotals(CallTotals):
    executions: int = 0
    failures: int = 0

    def summary(self, noun: str = "model call", *, cost: bool = True) -> str:
        return f"{super().summary(noun, cost=cost)}, {plural(self.executions, 'execution')}, {self.failures} failed"


def _call_totals(calls: Any, failed: Any, prompt: Any, completion: Any, cost: Any, cached: Any) -> CallTotals:
    """A row's sums (None where there were no rows, a Decimal from PostgreSQL's sum of BIGINTs) as numbers."""
    return CallTotals(int(calls or 0), int(failed or 0), int(prompt or 0), int(completion or 0), float(cost or 0.0),
                      int(cached or 0))


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and the noun ("1 reply", "2 replies": ``many`` where it is not ``noun`` + "s")."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.budget_notice_day: str | None = None  # the day the owner was told the budget is spent

    @classmethod
    async def create(cls, db: Database) -> "UsageStore":
        await db.migrate("usage", MIGRATIONS)
        return cls(db)

    async def record_call(self, session_key: str, mode: str, model: str, prompt_tokens: int,
                          completion_tokens: int, purpose: str = "turn", *, outcome: str = "ok", provider: str = "",
                          cost: float = 0.0, member: bool = False, cached_tokens: int = 0) -> None:
        await self._record(
            "INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, completion_tokens, outcome, "
            "provider, cost_usd, member, cached_tokens) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            time.time(), session_key, mode, purpose, model, prompt_tokens, completion_tokens, outcome, provider,
            float(cost), int(member), cached_tokens)

    async def record_execution(self, session_key: str, mode: str, duration_ms: float, function_calls: int,
                               outcome: str) -> None:
        await self._record(
            "INSERT INTO executions (ts, session_key, mode, duration_ms, function_calls, outcome) "
            "VALUES ($1, $2, $3, $4, $5, $6)", time.time(), session_key, mode, float(duration_ms), function_calls, outcome)

    async def _record(self, sql: str, *args: object) -> None:
        """A usage row; while the database is away it is skipped (logged): the turn goes on."""
        try:
            await self.db.execute(sql, *args)
        except StoreUnavailable as exc:
            log.warning("usage not recorded: %s", exc)

    async def totals(self, session_key: str | None = None) -> dict[str, ModeTotals]:
        """Per execution mode: for the whole bot (its running totals), or for one chat (what a
        member chat may see)."""
        calls, runs, args = (
            f"SELECT mode, count(*), {FAILED}, sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), "
            "sum(cached_tokens) FROM model_calls WHERE session_key = $1 GROUP BY mode",
            f"SELECT mode, count(*), {FAILED} FROM executions WHERE session_key = $1 GROUP BY mode", (session_key,),
        ) if session_key else (
            "SELECT mode, sum(calls), sum(failed), sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), "
            "sum(cached_tokens) FROM usage_totals GROUP BY mode", "SELECT mode, runs, failures FROM execution_totals", ())
        result: dict[str, ModeTotals] = {}
        for mode, *figures in await self.db.fetch(calls, *args):
            result[mode] = ModeTotals(**vars(_call_totals(*figures)))
        for mode, executions, failures in await self.db.fetch(runs, *args):
            totals = result.setdefault(mode, ModeTotals())
            totals.executions, totals.failures = int(executions), int(failures or 0)
        return result

    async def tokens_since(self, session_key: str, since: float) -> tuple[int, int]:
        """(prompt, completion) tokens of one chat's calls since ``since`` (an API reply's usage)."""
        row = await self.db.fetchrow("SELECT coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) "
                                     "FROM model_calls WHERE session_key = $1 AND ts >= $2", session_key, since)
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def per_day(self, timezone: str, days: int) -> list[dict[str, Any]]:
        """Calls, tokens (``cached``: prompt tokens the provider's cache served) and cost per local
        day for the last ``days`` days, oldest first, with each model's calls and cost that day."""
        zone = ZoneInfo(timezone)
        today = datetime.now(zone).date()
        totals: dict[str, dict[str, Any]] = {
            (today - timedelta(days=n)).isoformat(): {"calls": 0, "tokens": 0, "cached": 0, "cost": 0.0, "models": {}}
            for n in range(days)}
        for ts, prompt, completion, cost, model, cached in await self.db.fetch(
                "SELECT ts, prompt_tokens, completion_tokens, cost_usd, model, cached_tokens FROM model_calls "
                "WHERE ts >= $1",
                time.time() - (days + 1) * 86400):
            day = totals.get(datetime.fromtimestamp(ts, zone).date().isoformat())
            if day is not None:
                day["calls"] += 1
                day["tokens"] += prompt + completion
                day["cached"] += cached
                day["cost"] += cost
                per_model = day["models"].setdefault(model, {"calls": 0, "cost": 0.0})
                per_model["calls"] += 1
                per_model["cost"] += cost
        return [{"day": day, **values} for day, values in sorted(totals.items())]

    async def top_chats(self, since: float, limit: int = 5) -> list[dict[str, Any]]:
        """The chats that cost most since ``since`` (a background task counts for its chat)."""
        rows = await self.db.fetch("SELECT session_key, count(*), sum(cost_usd) FROM model_calls WHERE ts >= $1 "
                                   "GROUP BY session_key", float(since))
        chats: dict[str, dict[str, Any]] = {}
        for key, calls, cost in rows:
            chat = chats.setdefault(parent_chat(key), {"chat": parent_chat(key), "calls": 0, "cost": 0.0})
            chat["calls"] += int(calls)
            chat["cost"] += float(cost or 0.0)
        return sorted(chats.values(), key=lambda c: (-c["cost"], -c["calls"]))[:limit]

    async def of_chat(self, session_key: str) -> tuple[int, float]:
        """(model calls, cost) of one chat's history (a background task's, say)."""
        row = await self.db.fetchrow("SELECT count(*), sum(cost_usd) FROM model_calls WHERE session_key = $1",
                                     session_key)
        return (int(row[0]), float(row[1] or 0.0)) if row else (0, 0.0)

    async def cost_since(self, since: float, *, members: bool = False) -> float:
        """What calls since ``since`` (0: ever, from the running totals) cost (``members``: member
        chats' calls only)."""
        return float(await self.db.fetchval(
            "SELECT sum(cost_usd) FROM usage_totals WHERE member >= $1" if not since else
            "SELECT sum(cost_usd) FROM model_calls WHERE member >= $1 AND ts >= $2", int(members),
            *([float(since)] if since else [])) or 0.0)

    async def by_model(self, since: float = 0.0) -> dict[str, CallTotals]:
        """Per "provider/model" since ``since`` (0: ever, from the running totals): fallbacks show
        up as models of their own."""
        sums = f"count(*), {FAILED}, sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), sum(cached_tokens) " \
                  "FROM model_calls WHERE ts >= $1" if since else \
                  "sum(calls), sum(failed), sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), " \
                  "sum(cached_tokens) FROM usage_totals"
        rows = await self.db.fetch(f"SELECT provider, model, {sums} GROUP BY provider, model ORDER BY 3 DESC",
                                   *([float(since)] if since else []))
        return {f"{p}/{m}" if p else m: _call_totals(*figures) for p, m, *figures in rows}

    async def last_failures(self, timezone: str) -> dict[str, str]:
        """Per "provider/model" whose call failed today: "last failed at 03:10: why"."""
        rows = await self.db.fetch(
            "SELECT provider, model, ts, outcome FROM model_calls WHERE id IN (SELECT max(id) FROM model_calls "
            "WHERE ts >= $1 AND outcome != 'ok' GROUP BY provider, model)", start_of_today(timezone))
        return {f"{p}/{m}" if p else m: f"last failed at {datetime.fromtimestamp(ts, ZoneInfo(timezone)):%H:%M}: {why}"
                for p, m, ts, why in rows}

    async def cost_lines(self, timezone: str) -> list[str]:
        """For status and /status: cost today and in total, each model's calls, tokens and cost,
        and why its last failed call today failed (an operator's first question)."""
        today_start = start_of_today(timezone)
        per_model = await self.by_model()
        if not per_model:
            return []
        today_models, failures = await self.by_model(today_start), await self.last_failures(timezone)
        total, today = await self.cost_since(0.0), await self.cost_since(today_start)
        lines = [f"Cost: ${today:.4f} today, ${total:.4f} in total" if total else "Models:"]
        for name, t in per_model.items():
            lines.append(f"  {name}: today {today_models.get(name, CallTotals()).summary('call')}; "
                         f"in total {t.summary('call')}")
            if name in failures:
                lines.append(f"    {failures[name]}")
        return lines
