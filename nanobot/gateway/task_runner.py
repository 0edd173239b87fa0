"""Runs background tasks (``nanobot.tasks``) in the gateway: a gateway service.

Every ``POLL_S`` it claims queued tasks (up to ``maxTotal`` running here), runs each as an agent
turn in its own history (``task:<id>:<chat>``, ``chat_names.task_key``) with the chat's mode and model, and carries out
``/stop ID``. At start it puts back what its last run left running; among workers it also puts
back, on every look, what dead workers left (so another worker finishes it within about
``gateway.failoverSeconds``). A task resumed after a crash is told so, and is resumed once.

The result goes to the chat through the durable intake as a message of its own (sender
``task-result:ID``, delivery key ``task-ID``): it queues behind the chat's turns, lands in its
history, and is sent once whatever crashes around it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from nanobot.agent.loop import TASK_RESULT, TASK_SENDER, Origin, TurnRequest
from nanobot.agent.markup import FailedReply
from nanobot.bus import Identity, InboundMessage, split_target
from nanobot.chat_names import task_key
from nanobot.tasks import MAX_ATTEMPTS, Task
from nanobot.eventloop import Background, cancel_and_wait

if TYPE_CHECKING:
    from nanobot.runtime import Runtime
    from nanobot.session import Session

log = logging.getLogger(__name__)

POLL_S = 0.5
RESUMED = "(This task was cut off by a restart; what it did so far is above. Carry on from there.)"
Accept = Callable[[list[InboundMessage]], Awaitable[None]]
OpenChat = Callable[[str], Awaitable["Session"]]


class TaskRunner:
    def __init__(self, runtime: Runtime, accept: Accept, open_chat: OpenChat, worker: str, *,
                 among_workers: bool) -> None:
        self.runtime = runtime
        self.accept = accept  # the durable intake: results go to the chat as recorded messages
        # The chat as it is now (Gateway.open_chat): among workers another may hold it and have
        # changed it since we last read it (its model, its party and so its trust).
        self.open_chat = open_chat
        self.worker = worker
        self.among_workers = among_workers
        self.store = runtime.tasks
        self._running: dict[str, asyncio.Task[None]] = {}
        self._stop_asked: set[str] = set()  # running here, cancelled by /stop (not by a shutdown)
        self._background = Background()  # the look for work, and each task running here

    async def start(self) -> None:
        resumed = await self.store.requeue(self.worker)
        if resumed:
            log.info("resuming %d background task(s) a restart cut off: %s", len(resumed), ", ".join(resumed))
        self._background.run(self._look_forever(), name="background tasks")

    async def stop(self) -> None:
        """Running tasks are handed back, not counted as an attempt: the next start (or another
        worker) resumes them. (After a crash they are still 'running' here; the next start puts
        them back, and that run counts.)"""
        running = list(self._running)
        await self._background.stop()
        if running and self.store is not None:
            try:
                await self.store.hand_back(self.worker, running)
            except Exception as exc:  # the database is away: they resume as after a crash
                log.warning("background tasks not handed back (%s); the next start resumes them", exc)

    async def _look_forever(self) -> None:
        failed = False
        while True:
            try:
                if failed:
                    await self._hand_back_lost_claims()
                await self.look()
                failed = False
            except Exception as exc:  # the database is away: the next look tries again
                log.warning("background tasks: %s", exc)
                failed = True
            await asyncio.sleep(POLL_S)

    async def _hand_back_lost_claims(self) -> None:
        """A claim that committed while its answer was lost (a database restart) left a task
        'running' on this worker that it does not run, and nobody takes a live worker's task."""
        mine = await self.store.running_on(self.worker)
        await self.store.hand_back(self.worker, [task_id for task_id in mine if task_id not in self._running])

    async def look(self) -> None:
        """Take back dead workers' tasks, carry out stops, start what waits."""
        if self.among_workers:
            await self._let_go_moved()
            if await self.store.requeue(self.worker, dead_workers=True):
                log.info("took over background tasks of a worker that died")
        for task in await self.store.stops(self.worker):
            running = self._running.get(task.id)
            if running is not None and task.id not in self._stop_asked:
                self._stop_asked.add(task.id)
                running.cancel()
            elif task.state == "queued":
                await self._end(task, "stopped", "stopped before it began")
        limit = self.runtime.config.agents.defaults.tasks.max_total
        while len(self._running) < limit and (task := await self.store.claim(self.worker)) is not None:
            self._running[task.id] = self._background.run(self._run(task), name=f"task {task.id}")

    async def _let_go_moved(self) -> None:
        """Tasks another worker put back while this one was cut off from the database for longer
        than its heartbeat lasts are that worker's now: they stop here (they ran on in both, and
        what they did, they did twice)."""
        if not self._running:
            return
        for task_id in await self.store.moved(self.worker, list(self._running)):
            log.warning("background task %s: another worker took it over while this one was cut off; "
                        "stopped here", task_id)
            await cancel_and_wait(self._running[task_id])

    async def _run(self, task: Task) -> None:
        try:
            if task.attempts > MAX_ATTEMPTS:
                return await self._end(task, "failed", f"the process running it crashed {MAX_ATTEMPTS} times while "
                                                       "it ran; it is not tried again")
            limits = self.runtime.config.agent_for(task.chat).tasks
            # maxMinutes of wall clock from its first start, across resumptions and workers
            left = limits.max_minutes * 60 - (time.time() - (task.started or time.time()))
            try:
                async with asyncio.timeout(max(left, 0)):
                    reply = await self._turn(task)
            except TimeoutError:
                return await self._end(task, "stopped", f"stopped: it ran past {limits.max_minutes:g} minutes "
                                                         "(agents.defaults.tasks.maxMinutes)")
            except asyncio.CancelledError:
                if task.id not in self._stop_asked:
                    raise  # the gateway stops: the task stays 'running', resumed at the next start
                return await self._end(task, "stopped", "stopped (/stop)")
            await self._end(task, "failed" if isinstance(reply, FailedReply) else "done", reply)
        except Exception as exc:
            log.exception("background task %s failed", task.id)
            await self._end(task, "failed", f"it failed: {type(exc).__name__}")
        finally:
            self._running.pop(task.id, None)
            self._stop_asked.discard(task.id)

    async def _turn(self, task: Task) -> str:
        """The task as a turn of its own, with its chat's mode and model."""
        agent, sessions = self.runtime.agent, self.runtime.sessions
        chat = await self.open_chat(task.chat)
        key = task_key(task.chat, task.id)
        own = await sessions.open(key)
        if own.meta.model != chat.meta.model:
            own.set_meta(model=chat.meta.model)
        content = task.task if task.attempts <= 1 else f"{task.task}\n\n{RESUMED}"
        return await agent.answer(TurnRequest(key, content, mode=agent.mode_name(chat),
                                              origin=Origin(Identity(f"{TASK_SENDER}{task.id}"))))

    async def _end(self, task: Task, state: str, result: str) -> None:
        """Record how it ended, then tell its chat (once: the delivery key is the task's)."""
        await self.store.finish(task.id, state, result)
        headline = {"done": "finished", "failed": "failed", "stopped": "stopped"}[state]
        text = f"Background task {task.name} {headline}:\n{result}" if result else f"Background task {task.name} {headline}."
        channel, chat_id = split_target(task.chat)
        await self.accept([InboundMessage(channel, chat_id, f"{TASK_RESULT}{task.id}", text,
                                          source="task", delivery_key=f"task-{task.id}")])
        log.info("background task %s %s", task.id, state)
