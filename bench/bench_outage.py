"""A Telegram API outage: is any reply lost, and how soon after recovery do replies come?

    python bench/bench_outage.py [--seconds 60]

A real ``nanobot gateway`` process against the stand-in Telegram Bot API, which answers
every call (polls and sends) with 502 for ``--seconds``. One reply comes due during the
outage (its model answer takes 2 s); one message is sent while the API is down, so it is
read only after recovery. Production timings (poll backoff up to 2 s, outbox probes up to 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.telegram_api import FakeTelegram


def model(body: dict) -> object:
    text = body["messages"][-1]["content"]
    return delayed(reply("re: " + text), 2.0 if text == "slow" else 0.0)


async def main(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        async with FakeOpenAI(fallback=model) as llm, FakeTelegram() as tg:
            config = {
                "agents": {"defaults": {"workspace": str(home / "ws"), "model": "m", "executionMode": "tools"}},
                "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
                "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                          "allowFrom": ["*"], "streaming": False}},
                "gateway": {"heartbeat": {"enabled": False}},
            }
            (home / "config.json").write_text(json.dumps(config))
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nanobot", "gateway",
                                                        env={**os.environ, "NANOBOT_HOME": str(home)},
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            try:
                await tg.wait_until(lambda: "getUpdates" in tg.calls, timeout=30)
                tg.push_text(1, 1, "slow")  # its reply comes due in the middle of the outage
                await tg.wait_until(lambda: len(llm.chat_requests) == 1, timeout=10)
                tg.fail_all(seconds=seconds)
                recovered = time.monotonic() + seconds
                tg.push_text(2, 2, "sent during the outage")
                await tg.wait_until(lambda: len(tg.sent) == 2, timeout=seconds + 60)
                late = {m["text"]: m["at"] - recovered for m in tg.sent}
            finally:
                proc.terminate()
                await proc.wait()
    print(f"outage of {seconds:g} s (every Bot API call answered 502; {tg.failed} failed calls):")
    print(f"  the reply that came due during it: delivered {late['re: slow']:.2f} s after recovery")
    print(f"  the message sent during it: answered {late['re: sent during the outage']:.2f} s after recovery")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    asyncio.run(main(parser.parse_args().seconds))
