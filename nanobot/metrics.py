"""Prometheus metrics of one worker (``gateway.metrics``), through ``prometheus-client``.

The parts that count call ``metrics.current`` (``received``, ``turn``, ``model_call``...). By
default it is ``NoMetrics``, whose methods do nothing, so with metrics off the hot path pays one
call and ``prometheus_client`` is never imported. ``enable(worker)`` swaps in the real ones,
each labelled with the worker's id. No label holds a chat id, a user id or any text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class NoMetrics:
    """Metrics off: every method is a no-op."""

    enabled = False

    def received(self, channel: str, count: int = 1) -> None: ...
    def reply_sent(self, channel: str) -> None: ...
    def turn(self, mode: str, seconds: float, outcome: str) -> None: ...
    def model_call(self, provider: str, model: str, outcome: str, prompt_tokens: int = 0,
                   completion_tokens: int = 0, cost: float = 0.0, cached_tokens: int = 0) -> None: ...
    def tool_call(self, tool: str, outcome: str) -> None: ...
    def sandbox_run(self, outcome: str) -> None: ...
    def cron_run(self, outcome: str) -> None: ...
    def store_error(self) -> None: ...
    def failover(self, chats: int) -> None: ...
    def set_gauges(self, **values: float) -> None: ...
    def set_channels(self, up: dict[str, bool]) -> None: ...


class PrometheusMetrics(NoMetrics):
    enabled = True

    def __init__(self, worker: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry: CollectorRegistry = CollectorRegistry()
        self.worker = worker

        def make(kind: Any, name: str, doc: str, labels: tuple[str, ...] = (), **extra: Any) -> Any:
            return kind(f"nanobot_{name}", doc, (*labels, "worker"), registry=self.registry, **extra)

        self._received = make(Counter, "messages_received", "Messages received", ("channel",))
        self._replies = make(Counter, "replies_sent", "Replies the platform took", ("channel",))
        self._turns = make(Histogram, "turn_seconds", "Turn duration", ("mode",), buckets=TURN_BUCKETS)
        self._turn_outcomes = make(Counter, "turns", "Turns by outcome", ("mode", "outcome"))
        self._model_calls = make(Counter, "model_calls", "Model calls", ("provider", "model", "outcome"))
        self._tokens = make(Counter, "tokens", "Tokens", ("model", "kind"))
        self._cost = make(Counter, "model_cost_usd", "Model cost in USD", ("model",))
        self._cached = make(Counter, "model_cached_tokens", "Prompt tokens read from the provider's cache", ("model",))
        self._tools = make(Counter, "tool_calls", "Tool calls", ("tool", "outcome"))
        self._sandbox = make(Counter, "sandbox_runs", "Sandbox program runs", ("outcome",))
        self._cron = make(Counter, "cron_runs", "Cron job runs", ("outcome",))
        self._store_errors = make(Counter, "store_errors", "Writes that found the database away")
        self._failovers = make(Counter, "failovers", "Chats taken over from dead workers")
        self._gauges = {name: make(Gauge, name, doc) for name, doc in (
            ("unanswered_messages", "Messages recorded and not yet answered"),
            ("outbox_pending", "Replies recorded and not yet sent"),
            ("chats_held", "Chats this worker holds"),
            ("singletons_held", "Singletons this worker holds"))}
        self._channel_up = make(Gauge, "channel_up", "1 while the channel runs", ("channel",))

    def received(self, channel: str, count: int = 1) -> None:
        self._received.labels(channel, self.worker).inc(count)

    def reply_sent(self, channel: str) -> None:
        self._replies.labels(channel, self.worker).inc()

    def turn(self, mode: str, seconds: float, outcome: str) -> None:
        self._turns.labels(mode, self.worker).observe(seconds)
        self._turn_outcomes.labels(mode, outcome, self.worker).inc()

    def model_call(self, provider: str, model: str, outcome: str, prompt_tokens: int = 0,
                   completion_tokens: int = 0, cost: float = 0.0, cached_tokens: int = 0) -> None:
        self._model_calls.labels(provider, model, outcome, self.worker).inc()
        if cached_tokens:
            self._cached.labels(model, self.worker).inc(cached_tokens)
        if prompt_tokens:
            self._tokens.labels(model, "prompt", self.worker).inc(prompt_tokens)
        if completion_tokens:
            self._tokens.labels(model, "completion", self.worker).inc(completion_tokens)
        if cost:
            self._cost.labels(model, self.worker).inc(cost)

    def tool_call(self, tool: str, outcome: str) -> None:
        self._tools.labels(tool, outcome, self.worker).inc()

    def sandbox_run(self, outcome: str) -> None:
        self._sandbox.labels(outcome, self.worker).inc()

    def cron_run(self, outcome: str) -> None:
        self._cron.labels(outcome, self.worker).inc()

    def store_error(self) -> None:
        self._store_errors.labels(self.worker).inc()

    def failover(self, chats: int) -> None:
        self._failovers.labels(self.worker).inc(chats)

    def set_gauges(self, **values: float) -> None:
        for name, value in values.items():
            self._gauges[name].labels(self.worker).set(value)

    def set_channels(self, up: dict[str, bool]) -> None:
        for channel, running in up.items():
            self._channel_up.labels(channel, self.worker).set(1 if running else 0)

    def text(self) -> tuple[bytes, str]:
        """The exposition, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


current: NoMetrics = NoMetrics()


def enable(worker: str) -> PrometheusMetrics:
    """Count from now on (the gateway, when ``gateway.metrics.enabled``)."""
    global current
    current = PrometheusMetrics(worker)
    return current


def disable() -> None:
    global current
    current = NoMetrics()
