"""Which worker runs a chat's turns, and how its messages reach it.

Every message is recorded first (any worker may receive it: the Telegram poller, a webhook
behind a load balancer, the API). The insert notifies ``nanobot_work`` with the chat; every
worker hears it. The chat's holder reads the chat's unanswered messages past the last one it
queued and hands them to its dispatcher, in id order, so a chat keeps its order whoever
received what. A chat nobody holds is claimed by whichever worker asks first (a busier one
waits a moment, so chats spread); the new holder first sends what a dead holder left unsent,
then runs what it left unanswered (resumed mid-turn as after a restart).

A waiting caller (an API request, a cron prompt job) waits where it arrived: its message is
claimed there when possible, so the reply streams to it; if another worker holds the chat, the
caller gets the reply when that worker settles the message (``nanobot_done``), as does a caller
whose chat this worker lets go while it runs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from nanobot.agent.markup import FailedReply
from nanobot.bus import InboundMessage, MessageBus, OutboundMessage
from nanobot import metrics
from nanobot.cluster.leases import ChatLeases
from nanobot.delivery.intake import mark_if_resumed
from nanobot.eventloop import Background, ChatLocks

if TYPE_CHECKING:
    from nanobot.delivery.store import DeliveryStore
    from nanobot.session import Histories

log = logging.getLogger(__name__)

CLAIM_DELAY_PER_CHAT_S = 0.001  # a worker busy with n chats waits n ms (at most MAX) before claiming
MAX_CLAIM_DELAY_S = 0.02
MAX_ELSEWHERE = 100_000  # chats remembered as held elsewhere (forgotten wholesale past this)
# A chat taken while its last holder still sends what it answered there (a rate limit's wait, marks
# held up by a database restart): looked at this often, for at most this long, before our turns run.
HANDOVER_POLL_S, HANDOVER_WAIT_S = 0.05, 60.0


@dataclass(frozen=True)
class GatewayHooks:
    """What the router asks of the gateway it serves."""

    resend: Callable[[list[OutboundMessage]], None]  # recorded replies to the channels, in order (Outbound.resend)
    let_go: Callable[[list[str]], None]  # chats no longer ours: stop their turns (Dispatcher.let_go)


class ChatRouter:
    def __init__(self, leases: ChatLeases, delivery: DeliveryStore, bus: MessageBus, sessions: Histories,
                 hooks: GatewayHooks, joined: asyncio.Event) -> None:
        self.leases, self.delivery, self.bus, self.sessions = leases, delivery, bus, sessions
        # Set while this worker is a member (its line up, registered): only then may it claim or
        # take over. With its line down the others take it for dead; a claim made then (through
        # the pool, which a database restart reconnects sooner) would serve chats twice.
        self.joined = joined
        self.resend = hooks.resend
        self.on_lost = hooks.let_go
        self.held: set[str] = set()
        self.epoch = 0  # counts the times the line broke (forget_all): a claim begun before is stale
        self.queued: dict[str, int] = {}  # per held chat: the last intake id handed to the dispatcher
        self._local: dict[tuple[str, str], InboundMessage] = {}  # received here, not yet queued
        self._awaiting: dict[int, asyncio.Future[str]] = {}  # intake id -> a caller here, the chat elsewhere
        self._locks = ChatLocks()
        # Chats a claim found held by another worker: not tried again on each of their messages,
        # until that worker frees the chat (``nanobot_free``) or leaves or dies (the sweep).
        self._elsewhere: set[str] = set()
        self._workers: list[str] = []  # the live workers at the last sweep
        self._wakeups = Background()  # pulls and answers a notification asked for

    # ---- messages received here -------------------------------------------------------
    async def expect(self, messages: list[InboundMessage]) -> None:
        """Before they are recorded: a waiting caller is best served where it waits, so its
        chat is claimed here first if nobody holds it (the others then find it taken)."""
        for msg in messages:
            self._local[_key(msg)] = msg
        for chat in {msg.session_key for msg in messages if msg.reply_future is not None} - self.held:
            async with self._locks.hold(chat):
                epoch = self.epoch
                if chat not in self.held and self.joined.is_set() and await self.leases.claim(chat) \
                        and await self._still_ours([chat], epoch):
                    await self._taken(chat)

    async def arrived(self, messages: list[InboundMessage]) -> None:
        for chat in {msg.session_key for msg in messages if msg.intake_id is not None} & self.held:
            await self.pull(chat, claim=False)
        for msg in messages:  # the rest run wherever their chat is held
            if self._local.pop(_key(msg), None) is not None and msg.reply_future is not None \
                    and msg.intake_id is not None:
                self._awaiting[msg.intake_id] = msg.reply_future

    # ---- wake-ups ----------------------------------------------------------------------
    def notified(self, channel: str, payload: str) -> None:
        """A hint to look (any role that may connect can NOTIFY): what is done is decided by rows."""
        if channel == "nanobot_work":
            intake_id, _, chat = payload.partition(" ")
            if not intake_id.isdigit() or not chat:
                log.debug("ignored a malformed nanobot_work notification: %.80r", payload)
            elif chat in self.held:
                if int(intake_id) > self.queued.get(chat, 0):  # else queued already (received here)
                    self._wakeups.run(self.pull(chat, claim=False), name=f"pull {chat}")
            elif chat not in self._elsewhere:
                self._wakeups.run(self.pull(chat, claim=True, polite=True), name=f"pull {chat}")
        elif channel == "nanobot_free":
            if payload == "*":  # a worker left: its chats are anyone's
                self._elsewhere.clear()
            self._elsewhere.discard(payload)
        elif channel == "nanobot_done" and payload.isdigit() and int(payload) in self._awaiting:
            if self._awaiting[int(payload)].done():  # answered here, by the turn itself
                del self._awaiting[int(payload)]
            else:
                self._wakeups.run(self._answer(int(payload)), name="answer a worker")

    async def _answer(self, intake_id: int) -> None:
        """Answer a caller waiting here, once its message is settled in the database."""
        settled = await self.delivery.settled_reply(intake_id)
        if settled is None:
            return  # not settled: the notification was not the holder's (the sweep looks again)
        reply, failed = settled
        done = self._awaiting.pop(intake_id, None)
        if done is not None and not done.done():
            done.set_result(FailedReply(reply) if failed else reply)

    async def pull(self, chat: str, *, claim: bool, polite: bool = False) -> None:
        """Queue the chat's unanswered messages we have not queued yet, claiming the chat first
        if ``claim`` and nobody alive holds it. ``polite``: a wake-up, which anyone may send:
        then a busier worker waits a moment, and the chat is claimed only if it has work."""
        if polite and chat not in self.held:
            await asyncio.sleep(min(MAX_CLAIM_DELAY_S, CLAIM_DELAY_PER_CHAT_S * len(self.held)))
        async with self._locks.hold(chat):
            await self._pull(chat, claim, only_with_work=polite)

    async def _pull(self, chat: str, claim: bool, *, only_with_work: bool = False) -> None:
        if chat not in self.held:
            if not claim or not self.joined.is_set():
                return
            epoch = self.epoch
            if not await self.leases.claim(chat, only_with_work=only_with_work):
                if len(self._elsewhere) > MAX_ELSEWHERE:
                    self._elsewhere.clear()
                self._elsewhere.add(chat)
                return
            if not await self._still_ours([chat], epoch):
                return
            await self._taken(chat)
        for msg in await self.delivery.unfinished_in(chat, self.queued.get(chat, 0)):
            if _key(msg) not in self._local and self.queued.get(chat) == 0:  # left by the previous holder
                await mark_if_resumed(msg, self.sessions)
            if chat not in self.held:  # checked after the last wait, right before handing it on
                return  # the line broke meanwhile (forget_all): the chat's new holder runs these
            original = self._local.pop(_key(msg), None)
            if original is not None:
                original.intake_id = msg.intake_id
                msg = original
                if msg.reply_future is not None:  # answered here, or, if the chat is let go, by its next holder
                    self._awaiting[msg.intake_id] = msg.reply_future
            self.queued[chat] = msg.intake_id
            await self.bus.publish_inbound(msg)

    async def _taken(self, chat: str) -> None:
        """Ours now: read its history afresh (another worker wrote it since), and send what a
        dead holder recorded but did not get out, before anything new; what a live one did not
        get out yet, it sends, and our turns there wait for it (the chat keeps its order)."""
        self.held.add(chat)
        self._elsewhere.discard(chat)
        self.queued[chat] = 0
        self.sessions.close(chat)
        self.resend(await self.leases.adopt_replies(chat, self.delivery))
        if await self._sent_elsewhere(chat):
            self.resend(await self.leases.adopt_replies(chat, self.delivery))  # their sender may have died

    async def _sent_elsewhere(self, chat: str) -> bool:
        """Wait while another live worker has replies in ``chat`` to send; whether there were any."""
        loop = asyncio.get_running_loop()
        deadline, waited = loop.time() + HANDOVER_WAIT_S, False
        while chat in self.held and await self.leases.unsent_elsewhere(chat):  # (not if the line broke)
            if loop.time() > deadline:
                log.warning("%s: another worker has not sent its replies there in %.0f s; answering on",
                            chat, HANDOVER_WAIT_S)
                break
            waited = True
            await asyncio.sleep(HANDOVER_POLL_S)
        return waited

    # ---- the sweep ---------------------------------------------------------------------
    async def sweep(self) -> None:
        """Take over what dead workers left, and what no wake-up reached (about once a second)."""
        if not self.joined.is_set():
            return  # cut off: the others take over from us, not we from them
        if await self.leases.fence():
            log.warning("cut off a worker whose heartbeat lapsed while it stayed connected")
        workers = await self.leases.live_workers()
        if workers != self._workers:  # one died (or joined): the chats it held are anyone's
            self._workers = workers
            self._elsewhere.clear()
        orphaned = await self.leases.orphaned()
        mine = [chat for chat in orphaned if chat in self.held]
        for chat in mine:  # a dead worker's replies into a chat we hold
            async with self._locks.hold(chat):
                self.resend(await self.leases.adopt_replies(chat, self.delivery))
        for intake_id in [i for i, caller in self._awaiting.items() if caller.done()]:
            del self._awaiting[intake_id]  # answered here, by the turn itself
        for intake_id in await self.delivery.settled(list(self._awaiting)):  # a lost nanobot_done
            await self._answer(intake_id)
        others = [chat for chat in orphaned if chat not in self.held]
        if others:
            epoch = self.epoch
            taken = await self.leases.take_over(others)
            if taken and epoch == self.epoch:
                log.info("took over %d chat(s) nobody alive held", len(taken))
                metrics.current.failover(len(taken))
            for chat in taken:
                await self._pull_taken(chat, epoch)

    async def _still_ours(self, chats: list[str], epoch: int) -> bool:
        """Chats a claim or takeover just got: ours only if the line did not break while it ran
        (with the pool back before the line, after a database restart, it can succeed then).
        Else they are given back at once: our memory must hold exactly what our leases say."""
        if epoch == self.epoch and self.joined.is_set():
            return True
        for chat in chats:
            if chat not in self.held:  # else claimed afresh since: that lease is the one we hold it by
                await self.leases.release(chat)
        return False

    async def _pull_taken(self, chat: str, epoch: int) -> None:
        """One chat of a takeover, checked again under its lock: the chats taken before it wait
        for their replies to be adopted, and the line may break meanwhile (then it is not ours).
        A wake-up may have claimed it here meanwhile (the claim finds the lease ours): then it is
        taken already, and taking it again would queue its messages a second time."""
        async with self._locks.hold(chat):
            if chat not in self.held:
                if not await self._still_ours([chat], epoch):
                    return
                await self._taken(chat)
        await self.pull(chat, claim=False)

    # ---- giving chats back -------------------------------------------------------------
    async def release(self, chat: str) -> None:
        """The chat went quiet here: let any worker take its next message."""
        async with self._locks.hold(chat):
            if chat not in self.held:
                return
            if await self.delivery.unfinished_in(chat):
                return  # a message on its way here, or handed on as its worker went quiet: keep it
            session = await self.sessions.open(chat)
            await session.sync_soon()  # its history is in the database before anyone else reads it
            self.held.discard(chat)
            self.queued.pop(chat, None)
            self.sessions.close(chat)
            await self.leases.release(chat)

    def holds(self, chat: str) -> bool:
        return chat in self.held

    def fresh(self, chat: str) -> None:
        """Before reading a chat we do not hold: drop our copy of it (its holder may have
        written it since we loaded it)."""
        if chat not in self.held:
            self.sessions.close(chat)

    def forget_all(self) -> None:
        """We were taken for dead (the line broke): our chats are someone else's now, so their
        turns here stop (``on_lost``: the dispatcher's) and the new holders run them again."""
        if self.held:
            log.warning("gave up %d chat(s): this worker lost its database connection", len(self.held))
        chats = list(self.held)
        self.epoch += 1
        self.held.clear()
        self.queued.clear()
        self.on_lost(chats)
        for chat in chats:  # what their stopped turns left unwritten is not written now
            self.sessions.discard(chat)

    async def close(self) -> None:
        await self._wakeups.stop()  # one that failed was logged; the sweep retries it
        for done in self._awaiting.values():
            if not done.done():
                done.cancel()


def _key(msg: InboundMessage) -> tuple[str, str]:
    return msg.channel, str(msg.delivery_key)
