"""Files read on every turn, read again only when they change.

The system prompt is rebuilt for each turn from files the user may edit at any time (the
steering files, MEMORY.md, every SKILL.md). Reading and parsing them each turn cost more
than the rest of the prompt: a ``stat`` decides instead. A file counts as changed when its
modification time (nanoseconds) or its size differs, which catches every edit short of one
that keeps the size within the same clock tick.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
Stamp = tuple[int, int]  # (mtime_ns, size)


def stamp(path: str | Path) -> Stamp | None:
    """The file's change stamp, or None if it cannot be stat'ed (missing, no permission)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    return st.st_mtime_ns, st.st_size


class StampedCache(Generic[T]):
    """``load(path)`` results, kept per path while its stamp holds; the oldest go past ``size``.

    ``get`` raises what ``stat`` raised for a missing file, and whatever ``load`` raises."""

    def __init__(self, load: Callable[[str], T], size: int = 1024) -> None:
        self._load = load
        self._size = size
        self._kept: OrderedDict[str, tuple[Stamp, T]] = OrderedDict()

    def get(self, path: str | Path) -> T:
        key = os.fspath(path)
        st = os.stat(key)
        now = (st.st_mtime_ns, st.st_size)
        kept = self._kept.get(key)
        if kept is not None and kept[0] == now:
            self._kept.move_to_end(key)
            return kept[1]
        value = self._load(key)
        self._kept[key] = (now, value)
        if len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return value
