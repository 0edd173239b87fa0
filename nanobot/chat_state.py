"""What a chat remembers besides its messages, checked by type as it is set and as it is read."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

from nanobot.bus import Identity


@dataclass
class ChatState:
    """What a chat remembers besides its messages: the ``_meta`` lines of its history file,
    each field under its own name (so histories written before this class read the same)."""

    created: str | None = None
    mode: str | None = None  # the /mode choice; None: agents.overrides / agents.defaults decide
    model: str | None = None  # the /model choice, a name in agents.models
    voice: str | None = None  # the /voice choice (always, whenVoice, never); None: tools.speech.reply
    # Who a private chat is with, as the platform vouches (its trust is decided from it): never a name.
    peer_id: str | None = None
    peer_handle: str | None = None
    group: bool = False  # a group speaks here (its messages are not private): trust follows (Agent.meet)
    long_message: str | None = None  # the chat file holding the latest long message (code mode's `context`)
    voice_hint_sent: bool = False  # the how-to-enable-transcription reply went out once
    consolidated_upto: int | None = None  # messages since /new that memory consolidation has covered
    consolidated_ts: str | None = None  # the "ts" of the last of them: a marker from before /new fails it
    consolidation_retry_at: int | None = None  # after a failed consolidation: the message count to wait for
    intake_started: int | None = None  # the intake id of the latest turn begun (a crash resumes it)
    intake_started_at: int | None = None  # where in the history that turn's message went
    intake_starts: int = 0  # how often that turn has begun: a crash each time is a loop (MAX_TURN_STARTS)
    # Where (positions since /new) the messages kept for a reader who was away are: a job's output
    # or reply, a task's result in the terminal's chat, shown at its next start (``waiting_messages``).
    waiting: list[int] = field(default_factory=list)

    @property
    def peer(self) -> Identity | None:
        return Identity(self.peer_id, self.peer_handle) if self.peer_id is not None else None

    def check(self, values: dict[str, Any]) -> None:
        """Raise for a name that is not a field or a value of the wrong type (a typo in code)."""
        for name, value in values.items():
            if name not in _STATE_TYPES:
                raise AttributeError(f"a chat has no setting {name!r}")
            if not _fits(value, _STATE_TYPES[name]):
                raise TypeError(f"chat setting {name!r} cannot be {value!r}")

    def merge(self, record: dict[str, Any]) -> None:
        """Take a ``_meta`` line's known fields of the right type; anything else (the file's
        ``key``, settings of older versions, a hand-edited value) is left out."""
        for name, value in record.items():
            if name in _STATE_TYPES and _fits(value, _STATE_TYPES[name]):
                setattr(self, name, value)
        old_peer = record.get("peer")  # [id, name] written before names were told from handles: the id only
        if isinstance(old_peer, list) and old_peer and "peer_id" not in record:
            self.peer_id, self.peer_handle = str(old_peer[0]), None

    def record(self) -> dict[str, Any]:
        """The fields that differ from a new chat's, as the first ``_meta`` line stores them."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != (f.default_factory() if f.default is MISSING else f.default)}


_STATE_TYPES = get_type_hints(ChatState)


def _fits(value: Any, hint: Any) -> bool:
    if get_origin(hint) is list:  # list[int]: each item fits
        return isinstance(value, list) and all(_fits(item, get_args(hint)[0]) for item in value)
    for option in get_args(hint) or (hint,):
        if option is type(None):
            if value is None:
                return True
        elif isinstance(value, get_origin(option) or option) and not (option is int and isinstance(value, bool)):
            return True
    return False
