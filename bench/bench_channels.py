"""Slack and email, measured: message -> reply with an instant model through each (the stand-in
Slack over Socket Mode with the real slack-bolt; a real Dovecot over IMAP IDLE and aiosmtpd over
SMTP), and the memory of a real ``nanobot gateway`` with all five channels on (Telegram,
Discord, Slack, email and the API), idle once READY.

    python bench/bench_channels.py [--slack 100] [--mail 40]

Needs Dovecot (apt-get install dovecot-imapd).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)
from bench_idle import idle_gateway_rss

from nanobot.config import EmailConfig, SlackConfig
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.mail_servers import Dovecot, SmtpReceiver, email_section
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import config_for, running_gateway
from tests.test_email import mail


def percentiles(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return f"p50 {statistics.median(ms):.1f} ms, p95 {ms[int(len(ms) * 0.95) - 1]:.1f} ms (n={len(ms)})"


async def latencies(root: Path, slack_n: int, mail_n: int) -> tuple[list[float], list[float]]:
    async with FakeOpenAI(fallback=lambda body: reply("ok")) as llm, FakeSlack() as slack, Dovecot() as imap, \
            SmtpReceiver() as smtp:
        config = config_for(llm.base_url, root / "workspace", mode="tools")
        config.gateway.heartbeat.enabled = False
        config.channels.slack = SlackConfig.model_validate({**slack.section(), "streaming": False})
        config.channels.email = EmailConfig.model_validate(email_section(imap, smtp))
        slack_times, mail_times = [], []
        async with running_gateway(config):
            for n in range(slack_n):
                started = time.perf_counter()
                await slack.push_message("D1", "U42", f"ping {n}")
                await slack.wait_posted(n + 1)
                slack_times.append(time.perf_counter() - started)
            for n in range(mail_n):
                raw = bytes(mail("bob@example.org", f"ping {n}", "hello"))
                started = time.perf_counter()
                await imap.deliver(raw)
                await smtp.wait_sent(n + 1)
                mail_times.append(time.perf_counter() - started)
    return slack_times, mail_times


async def memory_with_five(root: Path) -> float:
    home = root / "home"
    home.mkdir()
    async with FakeOpenAI() as llm, FakeTelegram() as tg, FakeDiscord() as dc, FakeSlack() as slack, \
            Dovecot() as imap, SmtpReceiver() as smtp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            api_port = s.getsockname()[1]
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(root / "workspace"), "model": "fake"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
            "gateway": {"heartbeat": {"enabled": False}, "api": {"enabled": True, "listen": f"127.0.0.1:{api_port}"}},
            "channels": {
                "telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base, "allowFrom": ["42"]},
                "discord": {"enabled": True, "token": dc.token, "apiBase": dc.api_base, "gatewayUrl": dc.gateway_url,
                            "allowFrom": ["7"]},
                "slack": slack.section(), "email": email_section(imap, smtp)}}))
        return await idle_gateway_rss(home, root / "modules.txt", ready_within=60)


async def main(slack_n: int, mail_n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        slack_times, mail_times = await latencies(Path(tmp), slack_n, mail_n)
    with tempfile.TemporaryDirectory() as tmp:
        rss = await memory_with_five(Path(tmp))
    print(f"Slack (stand-in, Socket Mode) message -> reply: {percentiles(slack_times)}")
    print(f"email (Dovecot IDLE -> aiosmtpd) mail -> reply: {percentiles(mail_times)}")
    print(f"idle gateway with Telegram, Discord, Slack, email and the API on: RSS {rss:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--slack", type=int, default=100)
    parser.add_argument("--mail", type=int, default=40)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.slack, arguments.mail))
