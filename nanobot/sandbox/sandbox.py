"""Python sessions per chat, like a REPL that survives between the model's programs.

Each session key keeps a live Monty checkout, so variables and functions persist from one
program to the next. A live checkout pins a worker process, so only ``max_live_sessions``
stay live: the least recently used idle one is *parked* (dumped to bytes, worker returned)
to make room, and loaded back transparently when its chat runs code again. Dumps also let
the agent keep a chat's state in SQLite across a daemon restart (``run(save_state=True)``
to save, ``restore`` to seed a fresh process).

One program runs at a time per key; different keys run concurrently on separate workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any, Collection

from pydantic_monty import AsyncMontySession, MontyError, MontySyntaxError, MontyTypingError

from nanobot.eventloop import ChatLocks
from nanobot.config import CodeRuntime
from nanobot.sandbox.limits import resource_limits
from nanobot.sandbox.pool import MontyPool
from nanobot.sandbox.result import ExecutionResult
from nanobot.sandbox.runner import HostCall, execute

log = logging.getLogger(__name__)

DEFAULT_MAX_STATE_BYTES = 4 * 1024 * 1024


class Sandbox:
    """Runs programs for sessions; owns the pool unless one is passed in. ``close()`` at exit."""

    def __init__(self, pool: MontyPool | None = None, *, max_live_sessions: int = 8, spare_workers: int = 4,
                 max_state_bytes: int = DEFAULT_MAX_STATE_BYTES, max_parked_sessions: int = 256,
                 request_timeout: float | None = None) -> None:
        """``spare_workers`` serve stateless runs and checks beside the live sessions.

        ``request_timeout``: the pool's backstop per request; leave None for the default
        (30 s programs + a margin) or pass ``request_timeout_for(*all_code_runtimes)``.
        """
        self._owns_pool = pool is None
        self.pool = pool or MontyPool(max_processes=max_live_sessions + spare_workers,
                                      request_timeout=request_timeout)
        self.max_live_sessions = max_live_sessions
        self.max_state_bytes = max_state_bytes
        self.max_parked_sessions = max_parked_sessions
        self._live: OrderedDict[str, AsyncMontySession] = OrderedDict()  # least recently used first
        self._parked: OrderedDict[str, bytes] = OrderedDict()
        self._notices: dict[str, list[str]] = {}  # for the key's next result
        self._locks = ChatLocks()  # one per key while a run or a park uses it
        self._room = asyncio.Event()  # set whenever a live session may have become idle or gone
        self._opening = 0

    # -- running code ----------------------------------------------------------------------

    async def run(self, code: str, *, session_key: str, call: HostCall, function_names: Collection[str],
                  limits: CodeRuntime, stubs: str | None = None, inputs: dict[str, Any] | None = None,
                  save_state: bool = False, timezone: str | None = None) -> ExecutionResult:
        """Run a program in the session's Python state (a fresh one if ``persist_state`` is off).

        ``call(name, args, kwargs)`` runs each function the program calls among
        ``function_names``. ``stubs`` (see ``render_stubs``) are type-checked against when
        ``limits.type_check`` is on; runs with ``inputs`` skip the check (the checker cannot
        see their names). ``save_state`` puts the session's dump in ``result.state`` (None,
        with a notice, above ``max_state_bytes``). ``timezone`` is the sandbox's local zone.
        Checkout settings (limits, stubs, zone) apply when a session starts; a restored
        dump keeps the limits it was made with.
        """
        checkout = _checkout_args(limits, stubs, timezone)
        run_args = dict(call=call, function_names=function_names, limits=limits, inputs=inputs,
                        skip_type_check=bool(inputs))
        if not limits.persist_state:
            async with self.pool.session(**checkout) as session:
                return await execute(session, code, **run_args)
        async with self._locks.hold(session_key):
            notices = self._notices.pop(session_key, [])
            session = await self._session(session_key, checkout, notices)
            try:
                result = await execute(session, code, **run_args)
                if result.state_reset:
                    await self._discard(session_key)
                elif save_state:
                    result.state = await self._dump_capped(session_key, session, notices)
            except BaseException:  # cancelled (e.g. /stop): Monty has discarded the worker
                await self._discard(session_key)
                raise
            finally:
                self._room.set()
        result.notices[:0] = notices
        return result

    async def check_code(self, code: str, *, stubs: str | None = None, type_check: bool = False) -> str | None:
        """Why ``code`` would not start (syntax, or types with ``type_check`` and ``stubs``), or None.

        Nothing runs: cron uses this to refuse broken code when a job is scheduled.
        A zero execution-time limit stops the program at its first instruction, after Monty
        has parsed and type-checked it; a host call reached before that is never answered.
        """
        checkout = dict(limits={"max_feed_duration_secs": 0.0}, type_check=type_check and stubs is not None,
                        type_check_stubs=stubs, type_check_format="concise")
        async with self.pool.session(**checkout) as session:
            try:
                await session.feed_start(code, print_callback=lambda stream, text: None)
            except MontySyntaxError as exc:
                return exc.display()
            except MontyTypingError as exc:
                return f"Type check failed:\n{exc.display()}"
            except MontyError:
                pass  # the zero time limit, as intended
        return None

    # -- state across runs -----------------------------------------------------------------

    def restore(self, session_key: str, state: bytes) -> bool:
        """Seed a key's Python state from a saved dump (loaded on its next run).

        Returns False, ignoring the dump, if the key already has state in this process.
        """
        if session_key in self._live or session_key in self._parked:
            return False
        self._park_blob(session_key, state)
        return True

    def has_state(self, session_key: str) -> bool:
        return session_key in self._live or session_key in self._parked

    async def reset(self, session_key: str) -> None:
        """Forget the key's Python state (``/new``); its next run starts fresh."""
        async with self._locks.hold(session_key):
            await self._discard(session_key)
            self._notices.pop(session_key, None)
        self._room.set()

    async def release(self, session_key: str) -> None:
        """Give the key's worker back to the pool, keeping its state parked in memory."""
        async with self._locks.hold(session_key):
            await self._park(session_key)
        self._room.set()

    @property
    def live_sessions(self) -> list[str]:
        """Keys holding a worker, least recently used first."""
        return list(self._live)

    def worker_pid(self, session_key: str) -> int | None:
        """The OS pid of the key's worker, for diagnostics."""
        session = self._live.get(session_key)
        return session.worker_pid if session is not None else None

    async def close(self) -> None:
        """Return every worker (live state is dropped: persist it before) and stop an owned pool."""
        for key in list(self._live):
            await self.pool.release(self._live.pop(key))
        if self._owns_pool:
            await self.pool.close()

    # -- internals -------------------------------------------------------------------------

    async def _session(self, key: str, checkout: dict[str, Any], notices: list[str]) -> AsyncMontySession:
        """The key's live session: the one it has, or a new one, loaded from its parked dump."""
        session = self._live.get(key)
        if session is not None:
            self._live.move_to_end(key)
            return session
        await self._reserve_room()
        try:
            session = await self.pool.open(**checkout)
            state = self._parked.pop(key, None)
            if state is not None:
                try:
                    await session.load_session(state)
                except (MontyError, RuntimeError) as exc:
                    log.warning("could not restore Python state of %s: %s", key, exc)
                    notices.append(f"The saved Python state could not be restored ({exc}); starting fresh.")
                    await self.pool.release(session)
                    session = await self.pool.open(**checkout)
            self._live[key] = session
        finally:
            self._opening -= 1
            self._room.set()
        return session

    async def _reserve_room(self) -> None:
        """Wait until a new live session fits, parking idle ones (LRU first) to make room.

        No lock is held while waiting, so a run that finishes can always signal ``_room``.
        """
        while len(self._live) + self._opening >= self.max_live_sessions:
            victim = next((k for k in self._live if not self._locks.in_use(k)), None)
            if victim is None:  # every live session is running; wait for one to finish
                self._room.clear()
                await self._room.wait()
                continue
            async with self._locks.hold(victim):
                await self._park(victim)  # a no-op if it was discarded meanwhile
        self._opening += 1  # no await since the check: the slot is ours

    async def _park(self, key: str) -> None:
        """Dump the live session to memory and return its worker. Caller holds the key's lock."""
        session = self._live.pop(key, None)
        if session is None:
            return
        try:
            state = await self._dump(key, session)
            if state is not None and len(state) > self.max_state_bytes:
                self._notices.setdefault(key, []).append(
                    f"The Python state of this chat ({len(state) / 1e6:.1f} MB) was too large to keep "
                    f"while idle and was dropped. Keep big data in files, not in variables.")
            elif state is not None:
                self._park_blob(key, state)
        finally:
            await self.pool.release(session)

    def _park_blob(self, key: str, state: bytes) -> None:
        self._parked[key] = state
        self._parked.move_to_end(key)
        while len(self._parked) > self.max_parked_sessions:
            dropped, _ = self._parked.popitem(last=False)
            self._notices.setdefault(dropped, []).append(
                "The Python state of this chat was dropped after a long idle time; start over.")

    async def _discard(self, key: str) -> None:
        """Drop the key's state, live and parked. Caller holds the key's lock."""
        self._parked.pop(key, None)
        session = self._live.pop(key, None)
        if session is not None:
            await self.pool.release(session)

    async def _dump(self, key: str, session: AsyncMontySession) -> bytes | None:
        try:
            return await session.dump()
        except (MontyError, RuntimeError) as exc:
            log.warning("could not dump Python state of %s: %s", key, exc)
            return None

    async def _dump_capped(self, key: str, session: AsyncMontySession, notices: list[str]) -> bytes | None:
        """A dump to persist; over the size cap, None and a notice for the model.

        A dump that fails (a state too large for the worker's memory) finishes the checkout:
        the session is discarded then, with a notice, so the chat's next program starts fresh
        instead of failing on a dead session.
        """
        try:
            state = await session.dump()
        except (MontyError, RuntimeError) as exc:
            log.warning("could not dump Python state of %s: %s; discarding it", key, exc)
            await self._discard(key)
            notices.append(f"The Python state of this chat could not be saved ({exc}) and was discarded: "
                           "variables from earlier programs are gone. Keep big data in files, not in variables.")
            return None
        if len(state) > self.max_state_bytes:
            notices.append(f"The Python state is {len(state) / 1e6:.1f} MB, over the "
                           f"{self.max_state_bytes / 1e6:.1f} MB that can be saved, so a restart "
                           f"will lose it. Keep big data in files, not in variables.")
            return None
        return state


def _checkout_args(limits: CodeRuntime, stubs: str | None, timezone: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {"limits": resource_limits(limits), "type_check_format": "concise"}
    if limits.type_check and stubs is not None:
        args.update(type_check=True, type_check_stubs=stubs)
    if timezone:
        args["os_policy"] = {"timezone": timezone}
    return args
