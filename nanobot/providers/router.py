"""Models that do not go silent: one chat call, tried on the chat's model and then on its
fallbacks (``agents.defaults.fallbacks``, or the chat's override).

A provider that failed in a way another could answer (429, 5xx, a timeout, no connection;
after its own retries) is skipped for its ``cooldownSeconds`` while a fallback is left to try,
so a dead provider does not cost every turn a timeout. A bad request (400), a bad key or an
unknown model is not a reason to fall back: it is reported at once. When nothing answered,
the one line the user gets names every model tried and why it failed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

from nanobot.config import Config, ConfigError
from nanobot.eventloop import Changed
from nanobot.providers.base import ChatRequest, LLMResponse, Provider, ProviderError, Transcript

log = logging.getLogger(__name__)


class ModelRouter(Provider):
    name = "router"

    def __init__(self, config: Config, make: Callable[[str], Provider], clock: Callable[[], float] = time.monotonic,
                 changed: Changed | None = None):
        self.config = config
        self.make = make
        self.clock = clock
        self.changed = changed or Changed()  # set when a provider goes into cooldown (for status)
        self._providers: dict[str, Provider] = {}
        self._cooldown_until: dict[str, float] = {}

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            self._providers[name] = self.make(name)
        return self._providers[name]

    def cooling_down(self) -> dict[str, float]:
        """Providers being skipped, and for how many more seconds."""
        now = self.clock()
        return {name: until - now for name, until in self._cooldown_until.items() if until > now}

    async def chat(self, request: ChatRequest) -> LLMResponse:
        targets = [(request.provider or self.config.agents.defaults.provider, request.model), *request.fallbacks]
        cooling = self.cooling_down()
        ready = [t for t in targets if t[0] not in cooling]
        failures = [f"{p}/{m}: cooling down after a failure" for p, m in targets if p in cooling] if ready else []
        attempts: list[tuple[str, str, str]] = []  # recorded in usage by the caller
        for provider_name, model in ready or targets:
            try:
                response = await self.provider(provider_name).chat(replace(request, model=model, fallbacks=[]))
            except ProviderError as exc:
                if exc.status in (401, 403):  # which of the keys: there may be several providers
                    exc.args = (f"{exc} (the key is providers.{provider_name}.apiKey)",)
                if not exc.fallback or len(targets) == 1:
                    exc.failed_attempts = attempts
                    raise
                self._cool(provider_name)
                attempts.append((provider_name, model, str(exc)))
                failures.append(f"{provider_name}/{model}: {exc}")
                log.warning("model %s/%s failed, trying the next: %s", provider_name, model, exc)
                continue
            response.provider, response.model, response.failed_attempts = provider_name, model, attempts
            return response
        error = ProviderError("no model answered (tried " + "; ".join(failures) + ")")
        error.failed_attempts = attempts
        raise error

    def _cool(self, name: str) -> None:
        seconds = self.config.provider_config(name).cooldown_seconds
        if seconds > 0:
            self._cooldown_until[name] = self.clock() + seconds
            self.changed.set()

    async def transcribe(self, provider: str, audio: tuple[str, bytes], model: str, language: str | None,
                         timeout: float) -> Transcript:
        """Speech to text with the named provider's client (no fallbacks: the next provider
        would need a transcription model of its own)."""
        return await self.provider(provider).transcribe(audio, model, language, timeout)  # type: ignore[attr-defined]

    async def speak(self, provider: str, text: str, model: str, voice: str, timeout: float) -> bytes:
        """Text to speech with the named provider's client (no fallbacks, as for transcription)."""
        return await self.provider(provider).speak(text, model, voice, timeout)  # type: ignore[attr-defined]

    async def close(self) -> None:
        for provider in self._providers.values():
            await provider.close()


def make_router(config: Config, changed: Changed | None = None) -> ModelRouter:
    """The router over OpenAI-compatible providers; a missing key is a config error up front."""
    from nanobot.providers.openai_provider import OpenAIProvider

    def make(name: str) -> Provider:
        settings = config.provider_config(name)
        if not settings.api_key and not settings.api_base:  # OpenAI itself: every call would be a 401
            raise ConfigError(f"providers.{name}.apiKey is not set: set it in the config file (nanobot onboard "
                              f"writes one) or in NANOBOT_PROVIDERS__{name.upper()}__API_KEY (or set apiBase for a "
                              "local server)")
        return OpenAIProvider(name, settings)

    router = ModelRouter(config, make, changed=changed)
    router.provider(config.agents.defaults.provider)  # the default provider's problems show at start
    return router
