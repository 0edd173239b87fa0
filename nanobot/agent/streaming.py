"""A reply shown as it is written: the visible part of the model's text, sent to the chat as
one message that grows (the channel edits it), at most once per ``interval`` seconds.

Visible means what the user would see of a plain reply: no ``<think>`` reasoning, nothing
from the first code fence, ``<run_python>`` or ``<tool_call>`` on (programs and calls are
never streamed), no ``<say>`` notes (they are sent as notes). A marker split across pieces
is held back until it is known not to be one. Each model call of the turn starts the text
afresh in the same message; the final reply then replaces it.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Awaitable, Callable

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_SAY = re.compile(r"<say>.*?(</say>|$)", re.DOTALL)
_STOPS = ("```", "<run_python>", "<tool_call>")
_MARKERS = (*_STOPS, "<think>", "<say>")
_ids = itertools.count(1)


def visible_text(raw: str) -> str:
    text = _SAY.sub("", _THINK.sub("", raw))
    cut = min((i for i in (text.find(stop) for stop in _STOPS) if i >= 0), default=len(text))
    text = text[:cut]
    for start in range(max(0, len(text) - max(map(len, _MARKERS))), len(text)):  # a marker still arriving
        if any(marker.startswith(text[start:]) for marker in _MARKERS):
            return text[:start].strip()
    return text.strip()


class ReplyStream:
    def __init__(self, publish: Callable[[str], Awaitable[None]], interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.interval = interval
        self.stream_id = next(_ids)  # names the chat message being edited
        self.clock = clock
        self.shown = ""  # what the chat shows now
        self._raw = ""
        self._last = float("-inf")

    def begin(self) -> None:
        """A new model call: its text replaces the last one's."""
        self._raw = ""

    async def feed(self, piece: str) -> None:
        self._raw += piece
        text = visible_text(self._raw)
        if text and text != self.shown and self.clock() - self._last >= self.interval:
            self._last = self.clock()
            self.shown = text
            await self.publish(text)
