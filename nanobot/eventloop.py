"""The daemon's event loop: uvloop where it is installed, asyncio's own loop otherwise.

Under load the gateway is CPU-bound on one core, and a good share of that CPU is the event
loop itself: waking up, reading sockets, scheduling callbacks. uvloop (libuv, in C) does that
work for less; measured on the whole trip of a Telegram message it took the gateway from
3.8 to 3.3 CPU-ms a message (bench/RESULTS.md, "Durable delivery"). It is a dependency on
Linux and macOS (a wheel, no system package); on Windows, or after ``pip uninstall uvloop``,
the gateway runs on asyncio's loop, with the same behaviour.

Beside it, the small pieces every part uses on the loop: ``Background`` (the tasks an object
runs), ``ChatLocks`` (one lock per chat, only while used), ``Changed``, ``cancel_and_wait``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # Windows, or uninstalled on purpose
    uvloop = None  # type: ignore[assignment]

T = TypeVar("T")
log = logging.getLogger(__name__)


def policy() -> asyncio.AbstractEventLoopPolicy:
    return uvloop.EventLoopPolicy() if uvloop is not None else asyncio.DefaultEventLoopPolicy()


def run(main: Coroutine[Any, Any, T]) -> T:
    if uvloop is None:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None ones skipped) and wait until each has ended, whatever it raised."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def raise_if_cancelled() -> None:
    """Honour a cancel that was swallowed: on Python 3.11 ``asyncio.wait_for`` returns its
    future's result, dropping the cancel, when the cancel comes as that future completes (fixed
    in 3.12). A loop whose library waits so on every step (aioimaplib) calls this before a long
    wait, or a stop would wait on that wait."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def raise_cancel_under(exc: BaseException) -> None:
    """If ``exc`` was raised while a cancel unwound, raise that cancel instead: asyncpg raises
    its own error over a cancel when the server closes the connection at that instant (a
    restart), and a cancelled turn or loop must end as cancelled, not as failed or retrying."""
    under = exc.__context__
    while under is not None:
        if isinstance(under, asyncio.CancelledError):
            raise under
        under = under.__context__


class Background:
    """The tasks an object runs on its own while it is started (a reader, a clock, a send):
    built with the object, so no handle is None before start; held (asyncio keeps tasks only
    weakly); one that dies of an error says so in one line; cancelled and waited for together."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def run(self, work: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("%s stopped: %r", task.get_name(), error)

    async def stop(self, grace: float = 0.0) -> int:
        """Let the tasks run for up to ``grace`` seconds, then cancel those still running and wait
        until each has ended; how many were cancelled."""
        late = set(self._tasks)
        if late and grace > 0:
            _, late = await asyncio.wait(late, timeout=grace)
        await cancel_and_wait(*late)
        return len(late)


class ChatLocks:
    """One lock per chat, kept only while someone holds or waits for it (months of chats pass
    through a worker; their locks must not pile up)."""

    def __init__(self) -> None:
        self._locks: dict[str | int, asyncio.Lock] = {}
        self._users: dict[str | int, int] = {}

    @asynccontextmanager
    async def hold(self, chat: str | int) -> AsyncIterator[None]:
        lock = self._locks.setdefault(chat, asyncio.Lock())
        self._users[chat] = self._users.get(chat, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[chat] -= 1
            if not self._users[chat]:
                del self._users[chat], self._locks[chat]

    def in_use(self, chat: str | int) -> bool:
        """Whether someone holds or waits for ``chat``'s lock."""
        return chat in self._users


class Changed:
    """A flag that something a status shows has changed (a provider's cooldown, an MCP server's
    state): set by whatever changed, taken by the one reader (the gateway's state file), so
    changes between two looks are one. The parts that change are built with it; nobody
    registers a callback later."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def next(self) -> None:
        """Wait for a change not yet taken, and take it."""
        await self._event.wait()
        self._event.clear()
