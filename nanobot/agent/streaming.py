"""A reply shown as it is written: the visible part of the model's text, sent to the chat as
one message that grows (the channel edits it), at most once per ``interval`` seconds.

Visible means what the user would see of a plain reply: no ``<think>`` reasoning, nothing
from the first code fence, ``<run_python>`` or ``<tool_call>`` on (programs and calls are
never streamed), no ``<say>`` notes (they are sent as notes). A marker split across pieces
is held back until it is known not to be one. Each model call of the turn starts the text
afresh in the same message; the final reply then replaces it.

In code mode, text next to a program is a working note, not for the user. Where the stream is
a preview the channel edits (``takes_back``: Telegram, Discord, Slack), a model call's text is
shown as it comes all the same, and taken back (``TAKEN_BACK``) once a program shows in it.
Where it only appends (the API, the page, the terminal), nothing shown can be taken back, so
code mode's text is held until it is ``HOLD_CHARS`` long: a working note is a sentence or two
before its program, an answer worth streaming is longer. A note longer than that stays shown
(the answer then follows it on a new line).

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
TAKEN_BACK = "…"  # what a preview shows once its text turned out to be a working note
HOLD_CHARS = 280  # append-only streams, code mode: text shorter than this may still be a working note


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
                 clock: Callable[[], float] = time.monotonic, *, takes_back: bool = False) -> None:
        self.publish = publish
        self.interval = interval
        self.takes_back = takes_back  # the chat shows one message it edits: text can be taken back
        self.stream_id = next(_ids)  # names the chat message being edited
        self.clock = clock
        self.shown = ""  # what the chat shows now
        self._pieces: list[str] = []
        self._stopped = False  # a program or call began in this model call's text
        self._notes = True  # text before a program stays shown (False: code mode's working notes)
        self._published = False  # this model call's text was shown
        self._last = self._checked = float("-inf")

    def begin(self, *, notes: bool = True) -> None:
        """A new model call: its text replaces the last one's. ``notes=False`` (code mode): text
        that turns out to precede a program is taken back."""
        self._pieces, self._stopped, self._checked = [], False, float("-inf")
        self._notes, self._published = notes, False

    async def end(self) -> None:
        """The model call is over: a working note it showed is taken back (code mode)."""
        if not self._notes and _visible("".join(self._pieces))[1]:
            await self._take_back()

    async def _take_back(self) -> None:
        if self._published and self.shown != TAKEN_BACK:
            self.shown, self._last = TAKEN_BACK, self.clock()
            await self.publish(TAKEN_BACK)

    async def feed(self, piece: str) -> None:
        self._pieces.append(piece)
        now = self.clock()
        if self._stopped or now - self._last < self.interval or now - self._checked < CHECK_EVERY:
            return
        self._checked = now
        raw = "".join(self._pieces)
        self._pieces = [raw]
        text, self._stopped = _visible(raw)
        if self._stopped and not self._notes:
            await self._take_back()
        elif text and text != self.shown and (self._notes or self.takes_back or len(text) >= HOLD_CHARS):
            self._last = self.clock()
            self.shown, self._published = text, True
            await self.publish(text)
