"""Voice notes and audio to text, with any OpenAI-compatible transcription endpoint.

``tools.transcription.provider`` names a ``providers`` entry (OpenAI, Groq, a local Whisper
server), so its key, ``apiBase`` and HTTP client are reused: the call is the ``openai`` SDK's
``audio.transcriptions.create`` on that provider (see ``OpenAIProvider.transcribe``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Protocol, runtime_checkable

from nanobot.config import Config, ConfigError
from nanobot.media.aac import adts_to_m4a
from nanobot.providers.base import ProviderError, Transcript


class TranscriptionError(Exception):
    """One short line for the user: why a voice note was not transcribed. ``server_said``: the
    transcription server's words (an owner's business: they may name a key's ends)."""

    def __init__(self, reason: str, *, server_said: bool = False) -> None:
        super().__init__(reason)
        self.server_said = server_said


@runtime_checkable
class Transcriber(Protocol):
    async def transcribe(self, provider: str, audio: tuple[str, bytes], model: str, language: str | None,
                         timeout: float) -> Transcript: ...


def transcription_enabled(config: Config) -> bool:
    return bool(config.tools.transcription.provider)


def check_limits(config: Config, size: int, seconds: float | None) -> None:
    """Refuse, before any upload, a note over ``maxSeconds`` or ``maxMb``."""
    limits = config.tools.transcription
    if seconds is not None and seconds > limits.max_seconds:
        raise TranscriptionError(f"the voice note is {_duration(seconds)} long; I transcribe up to "
                                 f"{_duration(limits.max_seconds)} (tools.transcription.maxSeconds)")
    if size > limits.max_mb * 1024 * 1024:
        raise TranscriptionError(f"the recording is {size / 1048576:.1f} MB; I transcribe up to "
                                 f"{limits.max_mb} MB (tools.transcription.maxMb)")


async def transcribe(config: Config, models: object, name: str, data: bytes) -> Transcript:
    """The recording's words (stripped) and what the server counted of it; TranscriptionError with
    a short reason on any failure."""
    settings = config.tools.transcription
    if not isinstance(models, Transcriber):  # the offline demo's recorded model
        raise TranscriptionError("this model provider cannot transcribe")
    if (repacked := await asyncio.to_thread(adts_to_m4a, data)) is not None:  # raw AAC (Signal's): OpenAI refuses it
        name, data = str(PurePosixPath(name).with_suffix(".m4a")), repacked
    elif name.lower().endswith(".opus"):  # an Ogg file: OpenAI takes .ogg and .oga, not .opus
        name = str(PurePosixPath(name).with_suffix(".ogg"))
    try:
        heard = await models.transcribe(settings.provider, (name, data), settings.model, settings.language,
                                        settings.timeout)
    except ProviderError as exc:
        raise TranscriptionError(str(exc).replace("model server", "transcription server"), server_said=True) from exc
    except ConfigError as exc:
        raise TranscriptionError(str(exc)) from exc
    if not heard.text.strip():
        raise TranscriptionError("I could not make out any words in it")
    return replace(heard, text=heard.text.strip())


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"
