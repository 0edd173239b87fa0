"""A reply shown as it is written: the visible part of the model's text, sent to the chat as
one message that grows (the channel edits it), at most once per ``interval`` seconds.

Visible means what the user would see of a plain reply: no ``<think>`` reasoning, nothing
from the first code fence, ``<run_python>`` or ``<tool_call>`` on (programs and calls are
never streamed), no ``<say>`` notes (they are sent as notes). A marker split across pieces
is held back until it is known not to be one. Each model call of the turn starts the text
afresh in the same message; the final reply then replaces it.

Pieces are kept in a list and the visible text is worked out at most every ``CHECK_EVERY``
seconds, and never again once a program or call has begun: a reply of a megabyte in
four-character pieces would otherwise cost time quadratic in its length (it hung a chat).
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
CHECK_EVERY = 0.05  # seconds between looks at the text so far


def visible_text(raw: str) -> str:
    return _visible(raw)[0]


def _visible(raw: str) -> tuple[str, bool]:
    """The visible text, and whether a program or call has begun (nothing after it is shown)."""
    text = _SAY.sub("", _THINK.sub("", raw))
    cut = min((i for i in (text.find(stop) for stop in _STOPS) if i >= 0), default=-1)
    if cut >= 0:
        return text[:cut].strip(), True
    for start in range(max(0, len(text) - max(map(len, _MARKERS))), len(text)):  # a marker still arriving
        if any(marker.startswith(text[start:]) for marker in _MARKERS):
            return text[:start].strip(), False
    return text.strip(), False


class ReplyStream:
    def __init__(self, publish: Callable[[str], Awaitable[None]], interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.interval = interval
        self.stream_id = next(_ids)  # names the chat message being edited
        self.clock = clock
        self.shown = ""  # what the chat shows now
        self._pieces: list[str] = []
        self._stopped = False  # a program or call began in this model call's text
        self._last = self._checked = float("-inf")

    def begin(self) -> None:
        """A new model call: its text replaces the last one's."""
        self._pieces, self._stopped, self._checked = [], False, float("-inf")

    async def feed(self, piece: str) -> None:
        self._pieces.append(piece)
        now = self.clock()
        if self._stopped or now - self._last < self.interval or now - self._checked < CHECK_EVERY:
            return
        self._checked = now
        raw = "".join(self._pieces)
        self._pieces = [raw]
        text, self._stopped = _visible(raw)
        if text and text != self.shown:
            self._last = self.clock()
            self.shown = text
            await self.publish(text)
