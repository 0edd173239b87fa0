"""From ``bus.inbound`` to agent turns: one turn at a time per chat, many chats at once.

Each session key gets a worker: a queue and a task that works through it in order. Workers are
cheap and reclaimed after ``gateway.idleWorkerSeconds`` of quiet; ``gateway.maxConcurrentSessions``
caps the number of turns running at once.

``/stop`` never waits in the queue: it cancels the chat's running turn at once (a model call, a
program in the sandbox, a tool), records that in the history, and answers "Stopped.". Messages
queued behind the stopped turn are kept and run next: sent after it, they are probably still wanted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

from nanobot.agent.commands import is_command
from nanobot.agent.loop import TURN_CRASHED, FailedReply, Origin, TurnIO, TurnRequest
from nanobot.agent.streaming import ReplyStream
from nanobot.bus import InboundMessage, MessageBus, OutboundMessage
from nanobot.chat_commands import Offer
from nanobot.gateway.albums import whole_album
from nanobot.gateway.spoken import voice_note, voice_wait, will_speak
from nanobot.eventloop import Background, cancel_and_wait

if TYPE_CHECKING:
    from nanobot.agent.loop import Agent
    from nanobot.gateway.outbound import Outbound
    from nanobot.session import Session
    from nanobot.config import Gateway as GatewaySettings

log = logging.getLogger(__name__)

TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s per call
# A turn that answers sooner shows no indicator: under load they were half of all Bot API calls.
TYPING_DELAY = 0.5
RESTART_NOTICE = "I was restarted before I could answer that. Please ask again in a moment."
RESUME_NOTICE = "I am restarting; I will answer that as soon as I am back."
STOP_WAIT = 10.0  # how long /stop waits for a cancelled turn to unwind before answering
STOPPED_NOTE = "(stopped by the user)"
SHUTDOWN_NOTE = "(interrupted: the assistant was shut down before finishing)"
# A message whose turn began this often, each time ended by the process going (a crash, the
# watchdog, a restart), is given up: one that kills the daemon would otherwise do so for ever,
# a model call each time.
MAX_TURN_STARTS = 3
GAVE_UP_REPLY = ("I stopped working on your last message: I was restarted {starts} times while answering it. "
                 "If it is still wanted, please send it again, perhaps in smaller parts.")


class ChatHolder(Protocol):
    def holds(self, key: str) -> bool:
        """Whether this worker runs the chat's turns now (its lease)."""

    async def release(self, key: str) -> None:
        """The chat went quiet on this worker: any worker may take its next message."""


def is_stop(text: str) -> bool:
    """``/stop``, also ``/stop@botname`` as Telegram sends it in groups (``/stop ID`` is not:
    it stops a background task, a chat command like the others)."""
    words = text.strip().split()
    return len(words) == 1 and words[0].split("@", 1)[0].lower() == "/stop"


class SessionWorker:
    """One chat: its queue, and the task that runs its turns one after another."""

    def __init__(self, key: str, dispatcher: Dispatcher) -> None:
        self.key = key
        self.dispatcher = dispatcher
        self.queue: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.turn: asyncio.Task[str] | None = None  # the running turn, for /stop
        self.stream: ReplyStream | None = None  # the running turn's streamed reply, if the channel streams
        self._stop_requested = False
        self.stop_answered = asyncio.Event()  # cleared while a /stop is being answered
        self.stop_answered.set()
        self.held: InboundMessage | None = None  # the next message, taken off the queue while an album was joined
        self.task = dispatcher.chats.run(self._work(), name=f"session {key}")

    @property
    def serving(self) -> bool:
        """Still the chat's worker: not let go (``Dispatcher.let_go``: another worker's now)."""
        return self.dispatcher.workers.get(self.key) is self

    async def _work(self) -> None:
        d = self.dispatcher
        try:
            while not d.closing and self.serving:
                msg, self.held = self.held, None
                if msg is None:
                    try:
                        async with asyncio.timeout(d.settings.idle_worker_seconds):
                            msg = await self.queue.get()
                    except TimeoutError:
                        if self.queue.empty():
                            d.went_quiet(self.key)
                            return  # idle: the finally below forgets us in the same step, so no message is lost
                        continue
                msg, self.held = await whole_album(msg, self.queue, d.album_quiet_s)
                await self._run(msg)
        finally:
            if d.workers.get(self.key) is self:
                del d.workers[self.key]

    async def _run(self, msg: InboundMessage) -> None:
        self._stop_requested = False
        self.turn = asyncio.create_task(self._turn(msg), name=f"turn {self.key}")
        try:
            await self._settle(msg, self.turn)
        finally:  # only now: a shutdown lets a worker that is sending its reply finish
            self.turn = None

    async def _settle(self, msg: InboundMessage, turn: asyncio.Task[str]) -> None:
        """Wait for the turn, then answer its caller and send its reply."""
        try:
            reply = await turn
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the worker itself is being cancelled (shutdown); the turn went with it
            _answer_caller(msg, STOPPED_NOTE)
            await self.dispatcher.finish(msg, "")  # /stop's handler answers; this message is settled
            await self.stop_answered.wait()  # "Stopped." goes out before the next message's reply
            return
        except Exception:  # a crashing turn must not take the worker (or the daemon) with it
            log.exception("%s: the turn failed", self.key)
            reply = TURN_CRASHED
        _answer_caller(msg, reply)
        stream, self.stream = self.stream, None
        if self._stop_requested:
            await self.dispatcher.finish(msg, "")
        else:  # the final text replaces what was streamed
            await self.dispatcher.finish(msg, reply, stream_id=stream.stream_id if stream and stream.shown else None)

    async def _turn(self, msg: InboundMessage) -> str:
        d = self.dispatcher
        started = False
        try:
            async with d.slots:
                typing = None if is_command(msg.content) else asyncio.create_task(d.keep_typing(msg))
                try:
                    session = await d.agent.deps.sessions.open(self.key)
                    started = True
                    self.stream = d.reply_stream(msg)
                    resumed = mark_started(session, msg)
                    if msg.intake_id is not None and session.meta.intake_starts > MAX_TURN_STARTS:
                        return given_up(session, msg)
                    request = TurnRequest(self.key, msg.content, media=msg.media, mode=msg.mode, origin=origin_of(msg),
                                          durations=msg.durations, resumed=resumed)
                    return await d.agent.answer(request, TurnIO(lambda text: d.send(msg, text), self.stream))
                finally:
                    if typing is not None:
                        await cancel_and_wait(typing)
        except asyncio.CancelledError:
            # Recorded here, inside the turn, so the note is in the history before anyone
            # waiting on this turn (the /stop handler, the next queued message) runs; not for a
            # chat let go (its history is the new holder's). A note that cannot be written must
            # not turn the cancel into an error: the worker would take that for a crash and go
            # on with its queue.
            if started and self.serving:
                try:
                    session.append({"role": "assistant", "content": STOPPED_NOTE if self._stop_requested
                                    else SHUTDOWN_NOTE})
                except Exception:
                    log.exception("%s: could not record that the turn was interrupted", self.key)
            if not self._stop_requested:  # shutdown: the user is not left waiting for nothing
                d.tell_restarting(msg)
            raise

    async def stop_turn(self) -> bool:
        """Cancel the running turn and wait for it to unwind; False if nothing was running."""
        turn = self.turn
        if turn is None or turn.done():
            return False
        self._stop_requested = True
        self.stop_answered.clear()
        turn.cancel()
        await asyncio.wait({turn}, timeout=STOP_WAIT)
        return True


class Dispatcher:
    """Reads ``bus.inbound`` and hands each message to its chat's worker."""

    def __init__(self, agent: Agent, bus: MessageBus, settings: GatewaySettings, outbound: Outbound, *,
                 holder: ChatHolder | None = None, typing_interval: float = TYPING_INTERVAL, album_quiet_s: float,
                 stream_pace: Callable[[str], float | None] = lambda channel: None) -> None:
        self.agent, self.bus, self.settings, self.typing_interval = agent, bus, settings, typing_interval
        self.outbound = outbound  # records and sends replies
        self.album_quiet_s = album_quiet_s  # an album's parts are joined once none came for this long
        self.stream_pace = stream_pace  # how often a channel shows a reply as it is written (None: not)
        self.slots = asyncio.Semaphore(settings.max_concurrent_sessions)
        self.workers: dict[str, SessionWorker] = {}
        self.closing = False
        self.chats = Background()  # each worker's task
        self._side = Background()  # /stop handlers, spoken replies, chats given back: in flight
        self._told: set[str] = set()  # chats told about the restart
        # Among workers: only the chats it holds run here; one that goes quiet is given back to
        # it, and at shutdown the others answer what is queued (its chats are told nothing).
        self._holder = holder

    def let_go(self, keys: list[str]) -> None:
        """Among workers: these chats are another worker's now (this one was cut off and taken for
        dead). Their turns stop here, their queued messages are dropped: the new holder runs them."""
        for key in keys:
            worker = self.workers.pop(key, None)
            if worker is not None:
                worker.task.cancel()

    def went_quiet(self, key: str) -> None:
        if self._holder is not None:
            self._side.run(self._holder.release(key), name=f"give back {key}")

    async def run(self) -> None:
        """Take messages off the bus until cancelled."""
        while True:
            self.submit(await self.bus.inbound.get())

    async def accept(self, messages: list[InboundMessage]) -> None:
        """Straight to the chats' workers, unrecorded: the terminal chat's lines (``nanobot
        agent``), whose history the home's gateway, not this process, may resume."""
        for msg in messages:
            self.submit(msg)

    def submit(self, msg: InboundMessage) -> None:
        if self.closing:
            self.tell_restarting(msg)
            return
        if self._holder is not None and msg.intake_id is not None and not self._holder.holds(msg.session_key):
            return  # handed on just before its chat was let go (a broken line): its new holder runs it
        if is_stop(msg.content):
            self._side.run(self._stop(msg), name=f"stop {msg.session_key}")
            return
        worker = self.workers.get(msg.session_key)
        if worker is None:
            worker = self.workers[msg.session_key] = SessionWorker(msg.session_key, self)
        worker.queue.put_nowait(msg)

    async def ask(self, msg: InboundMessage, *,
                  through: Callable[[list[InboundMessage]], Awaitable[None]] | None = None) -> str:
        """Queue ``msg`` like any chat message and wait for the turn's reply (cron prompt jobs).

        The reply is also sent to the chat, as for a message the user typed. ``through``: the
        way in instead of this dispatcher (among workers, the intake: the chat's holder runs it,
        maybe another worker, and the reply comes back to this future all the same).
        """
        if self.closing:
            raise RuntimeError("the gateway is shutting down")
        msg.reply_future = done = asyncio.get_running_loop().create_future()
        if through is None:
            self.submit(msg)
        else:
            await through([msg])
        return await done

    async def _stop(self, msg: InboundMessage) -> None:
        worker = self.workers.get(msg.session_key)
        try:
            stopped = worker is not None and await worker.stop_turn()
            if stopped:
                self.agent.session(msg.session_key).sync()
                log.info("%s: turn stopped by the user", msg.session_key)
            answer = "Stopped." if stopped else "Nothing is running."
            try:
                await self.finish(msg, answer)
            finally:  # after: a caller that leaves once answered (nanobot agent -m /stop) sees it sent
                _answer_caller(msg, answer)
        finally:
            if worker is not None:
                worker.stop_answered.set()

    async def send(self, msg: InboundMessage, text: str) -> None:
        """A message to the chat ``msg`` came from (a progress note)."""
        if text:
            await self.bus.publish_outbound(OutboundMessage(msg.channel, msg.chat_id, text,
                                                            reply_context=msg.reply_context))

    async def finish(self, msg: InboundMessage, text: str, *, stream_id: int | None = None) -> None:
        """``msg``'s reply (none if ``text`` is empty). With an outbox it is recorded before
        this returns, and ``msg`` is settled in the same commit: a crash from now on cannot
        make it run again."""
        voice, failed = will_speak(self.agent, msg, text), isinstance(text, FailedReply)
        reply = OutboundMessage(msg.channel, msg.chat_id, text, stream_id=stream_id, turn_reply=True, failed=failed,
                                reply_context=msg.reply_context, offer=text.picks if isinstance(text, Offer) else (),
                                voice_follows=voice_wait(self.agent) if voice else None)
        await self._put(msg, reply, settles=True)
        if voice:  # after the text, never holding it up
            self._side.run(self._speak(msg, text), name=f"speak {msg.session_key}")

    async def _speak(self, msg: InboundMessage, text: str) -> None:
        await self._put(msg, await voice_note(self.agent, msg, text))

    async def _put(self, msg: InboundMessage, reply: OutboundMessage, settles: bool = False) -> None:
        """Recorded in the outbox, then sent; when the store fails, just sent. ``settles``: it is
        ``msg``'s reply, and ``msg`` is settled with it."""
        if reply.durable:
            try:
                if settles:
                    return await self.outbound.put(reply, finishes=msg.intake_id, joined=msg.joined)
                return await self.outbound.put(reply)
            except Exception:  # the store failed: send it anyway; the message runs again after a restart
                log.exception("%s: could not record the reply; sending it unrecorded", msg.session_key)
        if reply.content or reply.file or not reply.durable:
            await self.bus.publish_outbound(reply)

    def reply_stream(self, msg: InboundMessage) -> ReplyStream | None:
        """A stream for this message's reply, when its channel shows replies as they are written
        (``channels.<name>.streaming``); cron jobs' turns are not streamed."""
        pace = self.stream_pace(msg.channel)
        if msg.source == "cron" or pace is None:
            return None
        stream: ReplyStream

        async def publish(text: str) -> None:
            await self.bus.publish_outbound(OutboundMessage(msg.channel, msg.chat_id, text, kind="stream",
                                                            stream_id=stream.stream_id, reply_context=msg.reply_context))

        # A chat platform's preview is one message, edited (pace > 0); the API's and terminal's
        # streams only append, and cannot take back a working note.
        stream = ReplyStream(publish, pace, takes_back=pace > 0)
        return stream

    async def keep_typing(self, msg: InboundMessage) -> None:
        await asyncio.sleep(min(TYPING_DELAY, self.typing_interval))
        while True:
            await self.bus.publish_outbound(OutboundMessage(msg.channel, msg.chat_id, kind="typing"))
            await asyncio.sleep(self.typing_interval)

    async def shutdown(self, grace: float) -> None:
        """Take no new messages; give running turns (and the voice notes of replies being spoken)
        ``grace`` seconds, then cancel the rest.

        The caller stops ``run()`` first. A worker with a running turn finishes it, sends the
        reply and exits; idle workers exit at once. Queued messages are dropped (logged).
        """
        self.closing = True
        workers = list(self.workers.values())
        for w in workers:
            if w.turn is None:
                w.task.cancel()
        deadline = asyncio.get_running_loop().time() + grace
        if late := await self.chats.stop(grace):
            log.warning("shutdown: cancelled %d turn(s) still running after %g s", late, grace)
        await self._side.stop(deadline - asyncio.get_running_loop().time())
        dropped = [w.held for w in workers if w.held] + [w.queue.get_nowait() for w in workers
                                                         for _ in range(w.queue.qsize())]
        dropped += [self.bus.inbound.get_nowait() for _ in range(self.bus.inbound.qsize())]
        for msg in dropped:
            self.tell_restarting(msg)
        if dropped:
            log.warning("shutdown: %d queued message(s) were not answered; their chats were told", len(dropped))

    def tell_restarting(self, msg: InboundMessage) -> None:
        """Sent before the channels close (they drain the outbound queue at shutdown), not kept in
        the outbox: stale after the restart. A recorded message is answered then; an unrecorded one is lost."""
        if self._holder is not None and msg.intake_id is not None:
            return  # recorded: another worker answers it in a moment
        if msg.source != "cron" and not is_stop(msg.content) and msg.session_key not in self._told:
            self._told.add(msg.session_key)  # once per chat
            notice = RESUME_NOTICE if msg.intake_id is not None else RESTART_NOTICE
            self.bus.outbound.put_nowait(OutboundMessage(msg.channel, msg.chat_id, notice, durable=False))


def mark_started(session: Session, msg: InboundMessage) -> bool:
    """Note in the chat's history that ``msg``'s turn begins, where its message will go (a crash
    from now on resumes it) and how often it has begun (``MAX_TURN_STARTS``); whether this run
    resumes a turn whose message is recorded already (it is then not written again: the model
    sees it once, then a note)."""
    intake_id, meta = msg.intake_id, session.meta
    if intake_id is None:
        return False
    at = meta.intake_started_at
    resumed = msg.resumed and at is not None and (session.message(at) or {}).get("role") == "user"
    starts = meta.intake_starts + 1 if meta.intake_started == intake_id else 1
    session.set_meta(intake_started=intake_id, intake_started_at=at if resumed else session.count,
                     intake_starts=starts)
    return resumed


def given_up(session: Session, msg: InboundMessage) -> str:
    """The reply to a message whose turn the process died in ``MAX_TURN_STARTS`` times: it is not
    run again (its history says so, for the next turn's model)."""
    starts = session.meta.intake_starts - 1
    log.error("%s: gave up on message %s: the process stopped %d times during its turn", msg.session_key,
              msg.intake_id, starts)
    reply = GAVE_UP_REPLY.format(starts=starts)
    session.append({"role": "assistant", "content": reply})
    return reply


def origin_of(msg: InboundMessage) -> Origin:
    """Who sent ``msg`` (a cron job's message is not private, so it never decides a chat's trust)."""
    return Origin(msg.sender, msg.is_private, msg.untrusted, msg.source)


def _answer_caller(msg: InboundMessage, reply: str) -> None:
    """Hand the reply to whoever is waiting on this message (``Dispatcher.ask``, the API)."""
    if (done := msg.reply_future) is not None and not done.done():
        done.set_result(reply)

