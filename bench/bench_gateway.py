"""Gateway figures: dispatch overhead, throughput, a Telegram round trip, start-up and memory.

    python bench/bench_gateway.py

(a) dispatch overhead, inbound message -> turn start, p50 (target < 1 ms);
(b) 1,000 messages over 200 chats with an instant in-process model: none lost, order kept
    in every chat, messages per second;
(c) a Telegram message to its reply through the stand-in Bot API, instant model, p50 over
    20 (target < 100 ms);
(d) ``nanobot gateway`` process, both channels enabled: start to READY=1 (target < 2 s),
    and idle RSS with one Monty worker alive (target < 100 MiB, worker included).
Everything runs on loopback against the stand-ins in tests/fakes; homes are temporary.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.fakes

from nanobot.bus import InboundMessage, OutboundMessage  # noqa: E402
from nanobot.config import Config  # noqa: E402
from nanobot.eventloop import cancel_and_wait  # noqa: E402
from nanobot.gateway import Dispatcher, Gateway  # noqa: E402
from nanobot.gateway.albums import ALBUM_QUIET_S  # noqa: E402
from nanobot.providers.base import ChatRequest, LLMResponse, Provider  # noqa: E402
from nanobot.runtime import Runtime, open_runtime  # noqa: E402
from tests.fakes.discord_api import FakeDiscord  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI, reply  # noqa: E402
from tests.fakes.recorder import Recorder  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402


class InstantModel(Provider):
    """A Provider that answers at once, echoing the user's message."""

    name = "instant"

    def __init__(self) -> None:
        self.called_at: list[float] = []

    async def chat(self, request: ChatRequest) -> LLMResponse:
        self.called_at.append(time.perf_counter())
        return LLMResponse(f"re: {request.messages[-1]['content']}")

    async def close(self) -> None:
        pass


class Clocked:
    """The agent, with the moment each turn starts noted (what the dispatch overhead ends at)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.started_at: list[float] = []

    async def answer(self, *args: Any, **kwargs: Any) -> str:
        self.started_at.append(time.perf_counter())
        return await self.agent.answer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the rest (deps, session) is the agent's own
        return getattr(self.agent, name)


def config_in(root: Path) -> Config:
    config = Config()
    config.agents.defaults.workspace = str(root / "workspace")
    config.agents.defaults.execution_mode = "tools"
    return config


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


async def next_text(sink: Recorder) -> OutboundMessage:
    while (msg := await sink.sent.get()).kind != "text":  # a typing indicator of a slow turn
        pass
    return msg


@asynccontextmanager
async def dispatching(rt: Runtime, agent: Any) -> AsyncIterator[Recorder]:
    """``agent`` behind a dispatcher, its replies recorded and sent by the gateway's Outbound to a channel."""
    gateway, sink = Gateway(rt), Recorder("bench")
    gateway.add_internal_channel(sink)
    await gateway.delivery.migrate()
    dispatcher = Dispatcher(agent, rt.bus, rt.config.gateway, gateway.outbound, album_quiet_s=ALBUM_QUIET_S)
    tasks = [asyncio.create_task(dispatcher.run()), asyncio.create_task(gateway.outbound.route())]
    try:
        yield sink
    finally:
        await dispatcher.shutdown(0)
        await cancel_and_wait(*tasks)
        await gateway.outbound.drain(5)
        await gateway.delivery.close()


async def bench_dispatch(root: Path) -> None:
    model = InstantModel()
    config = config_in(root)
    async with open_runtime(config, provider=model, home=root / "home") as rt:
        agent = Clocked(rt.agent)
        async with dispatching(rt, agent) as sink:
            to_turn, to_model, round_trip = [], [], []
            for i in range(500):
                sent = time.perf_counter()
                await rt.bus.publish_inbound(InboundMessage("bench", "1", "1", f"message {i}"))
                await next_text(sink)
                done = time.perf_counter()
                to_turn.append((agent.started_at[-1] - sent) * 1000)
                to_model.append((model.called_at[-1] - sent) * 1000)
                round_trip.append((done - sent) * 1000)
    print(f"(a) dispatch overhead, inbound -> turn start: p50 {statistics.median(to_turn):.3f} ms, "
          f"p90 {pct(to_turn, 0.9):.3f} ms  (target p50 < 1 ms)")
    print(f"    inbound -> model call: p50 {statistics.median(to_model):.3f} ms; "
          f"inbound -> reply recorded and sent: p50 {statistics.median(round_trip):.3f} ms")


async def bench_throughput(root: Path) -> None:
    config = config_in(root)
    chats, per_chat = 200, 5
    async with open_runtime(config, provider=InstantModel(), home=root / "home2") as rt:
        async with dispatching(rt, rt.agent) as sink:
            started = time.perf_counter()
            for n in range(per_chat):
                for chat in range(chats):
                    await rt.bus.publish_inbound(InboundMessage("bench", str(chat), str(chat), f"{chat}/{n}"))
            replies: dict[str, list[str]] = {}
            async with asyncio.timeout(120):
                for _ in range(chats * per_chat):
                    msg = await next_text(sink)
                    replies.setdefault(msg.chat_id, []).append(msg.content.split("\n")[0])  # not the "(sent …)" note
            elapsed = time.perf_counter() - started
    in_order = all(replies.get(str(c)) == [f"re: {c}/{n}" for n in range(per_chat)] for c in range(chats))
    total = sum(map(len, replies.values()))
    print(f"(b) {chats * per_chat} messages over {chats} chats (maxConcurrentSessions "
          f"{config.gateway.max_concurrent_sessions}): {total} replies, none lost: {total == chats * per_chat}, "
          f"order kept in every chat: {in_order}, {total / elapsed:.0f} messages/s (replies recorded)")


async def bench_telegram(root: Path) -> None:
    config = config_in(root)
    async with FakeTelegram() as tg:
        t = config.channels.telegram
        t.enabled, t.token, t.api_base, t.allow_from = True, tg.token, tg.api_base, ["42"]
        async with open_runtime(config, provider=InstantModel(), home=root / "home3") as rt:
            gateway = Gateway(rt)
            await gateway.start()
            try:
                samples = []
                for i in range(21):
                    sent = time.perf_counter()
                    tg.push_text(42, 42, f"ping {i}")
                    await tg.wait_sent(i + 1)
                    samples.append((time.perf_counter() - sent) * 1000)
            finally:
                await gateway.stop()
    samples = samples[1:]  # the first pays for connection set-up
    print(f"(c) Telegram message -> reply through the stand-in Bot API: p50 {statistics.median(samples):.1f} ms, "
          f"max {max(samples):.1f} ms over {len(samples)}  (target p50 < 100 ms)")


def rss_kib(pid: int) -> int:
    return _field(f"/proc/{pid}/status", "VmRSS:")


def pss_kib(pid: int) -> int:
    """Proportional set size: shared library pages divided among the processes using them."""
    return _field(f"/proc/{pid}/smaps_rollup", "Pss:")


def _field(path: str, name: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            children = (task / "children").read_text().split()
            found += map(int, children)
            frontier += map(int, children)
    return found


async def bench_process(root: Path) -> None:
    home, workspace = root / "home4", root / "workspace4"
    home.mkdir()
    async with FakeOpenAI() as llm, FakeTelegram() as tg, FakeDiscord() as dc:
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(workspace), "model": "fake", "executionMode": "code"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
            "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base, "allowFrom": ["42"]},
                         "discord": {"enabled": True, "token": dc.token, "apiBase": dc.api_base,
                                     "gatewayUrl": dc.gateway_url}}}))
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(f"\0nanobot-bench-{os.getpid()}")
        notify.setblocking(False)
        env = {**os.environ, "NANOBOT_HOME": str(home), "NOTIFY_SOCKET": f"@nanobot-bench-{os.getpid()}"}
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway", env=env,
                                                    stderr=asyncio.subprocess.DEVNULL)
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(30):
                while b"READY=1" not in await loop.sock_recv(notify, 4096):
                    pass
            ready = time.perf_counter() - started
            print(f"(d) nanobot gateway, both channels: start to READY=1 {ready * 1000:.0f} ms  (target < 2 s)")
            await asyncio.sleep(1)
            before = rss_kib(proc.pid)
            llm.script(reply("```python\nprint(6 * 7)\n```"), reply("It is 42."))
            tg.push_text(42, 42, "what is six times seven? use python")
            answer = (await tg.wait_sent(1, timeout=30))[0]["text"]
            await asyncio.sleep(2)  # idle again
            children = descendants(proc.pid)
            main, workers = rss_kib(proc.pid), [rss_kib(p) for p in children]
            total = main + sum(workers)
            pss = pss_kib(proc.pid) + sum(pss_kib(p) for p in children)
            print(f"    idle RSS before any code ran: {before / 1024:.1f} MiB (gateway process)")
            print(f"    after one code-mode turn (reply {answer!r}): gateway {main / 1024:.1f} MiB + "
                  f"{len(workers)} worker(s) {sum(workers) / 1024:.1f} MiB = {total / 1024:.1f} MiB  "
                  f"(target < 100 MiB); PSS {pss / 1024:.1f} MiB")
            stopping = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
            print(f"    SIGTERM to exit: {(time.perf_counter() - stopping) * 1000:.0f} ms, exit code {code}")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            notify.close()


async def main() -> None:
    # The echo model's answers are no use to memory consolidation; its complaints are not figures.
    logging.getLogger("nanobot.agent.memory").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-") as tmp:
        root = Path(tmp)
        os.environ["NANOBOT_HOME"] = str(root / "home")
        await bench_dispatch(root)
        await bench_throughput(root)
        await bench_telegram(root)
        await bench_process(root)


if __name__ == "__main__":
    asyncio.run(main())
