"""The channels, measured: message -> reply with an instant model through each (the stand-in
Slack over Socket Mode with the real slack-bolt; a real Dovecot over IMAP IDLE and aiosmtpd over
SMTP; the stand-ins of the WhatsApp Cloud API and of signal-cli's HTTP daemon; a real Synapse
for Matrix), and the memory of a real ``nanobot gateway`` with all eight on (Telegram, Discord,
Slack, email, Matrix, WhatsApp, Signal and the API), idle once READY.

    python bench/bench_channels.py [--slack 100] [--mail 40] [--others 100]

Needs Dovecot (apt-get install dovecot-imapd) and Synapse (tests/fakes/synapse.py installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)
from bench_idle import idle_gateway_rss

from nanobot.config import Config, EmailConfig, MatrixConfig, SignalConfig, SlackConfig, WhatsAppConfig
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.mail_servers import Dovecot, SmtpReceiver, email_section
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import config_for, running_gateway
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.synapse import Homeserver, homeserver
from tests.fakes.whatsapp_api import FakeWhatsApp
from tests.test_api import free_port
from tests.test_email import mail
from tests.test_matrix import Person, bot_in


def percentiles(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return f"p50 {statistics.median(ms):.1f} ms, p95 {ms[int(len(ms) * 0.95) - 1]:.1f} ms (n={len(ms)})"


def in_own_home(config: Config, root: Path) -> Config:
    """The gateway's state in ``root``, not in ~/.nanobot: a second run there took its messages
    for repeats of the first's (the stand-ins number them from 1 again)."""
    (root / "home").mkdir(exist_ok=True)
    config.use_home(root / "home")
    return config


async def latencies(root: Path, slack_n: int, mail_n: int) -> tuple[list[float], list[float]]:
    async with FakeOpenAI(fallback=lambda body: reply("ok")) as llm, FakeSlack() as slack, Dovecot() as imap, \
            SmtpReceiver() as smtp:
        config = in_own_home(config_for(llm.base_url, root / "workspace", mode="tools"), root)
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


async def new_channel_latencies(root: Path, n: int) -> dict[str, list[float]]:
    """WhatsApp (a signed webhook post to the reply's Graph API call), Signal (an SSE event to the
    JSON-RPC send) and Matrix (a message sent to the reply seen by the sender's sync)."""
    times: dict[str, list[float]] = {"whatsapp": [], "signal": [], "matrix": []}
    async with FakeOpenAI(fallback=lambda body: reply("ok")) as llm, FakeWhatsApp() as wa, \
            FakeSignalCli("+15550001111", root) as sig:
        config = in_own_home(config_for(llm.base_url, root / "workspace", mode="tools"), root)
        config.gateway.heartbeat.enabled = False
        config.channels.whatsapp = WhatsAppConfig.model_validate(wa.section(free_port(), allowFrom=["1555"]))
        config.channels.signal = SignalConfig.model_validate({"enabled": True, "account": sig.account,
                                                              "rpcUrl": sig.url, "allowFrom": ["+1555"]})
        with homeserver(root / "synapse") as hs:
            bot, token = await hs.register("bot")
            owner = Person(hs, *await hs.register("owner"))
            config.channels.matrix = MatrixConfig.model_validate({
                "enabled": True, "homeserver": hs.url, "userId": bot, "accessToken": token,
                "allowFrom": [owner.user_id], "streaming": False})
            async with running_gateway(config):
                room = await owner.room(bot)
                await bot_in(owner, room, bot)
                for i in range(n):
                    started = time.perf_counter()
                    await wa.deliver("1555", f"ping {i}")
                    await wa.wait_sent(i + 1)
                    times["whatsapp"].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    sig.push("+1555", f"ping {i}")
                    await sig.wait_sent(i + 1)
                    times["signal"].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    await owner.say(room, f"ping {i}")
                    await owner.read_until(lambda seen: len(seen) >= i + 1)
                    times["matrix"].append(time.perf_counter() - started)
            await owner.client.close()
    return times


async def memory_with_eight(root: Path, hs: Homeserver) -> float:
    home = root / "home"
    home.mkdir()
    async with FakeOpenAI() as llm, FakeTelegram() as tg, FakeDiscord() as dc, FakeSlack() as slack, \
            Dovecot() as imap, SmtpReceiver() as smtp, FakeWhatsApp() as wa, FakeSignalCli("+1555", root) as sig:
        bot, token = await hs.register("bot")
        api_port = free_port()
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": str(root / "workspace"), "model": "fake"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
            "gateway": {"heartbeat": {"enabled": False}, "api": {"enabled": True, "listen": f"127.0.0.1:{api_port}"}},
            "channels": {
                "telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base, "allowFrom": ["42"]},
                "discord": {"enabled": True, "token": dc.token, "apiBase": dc.api_base, "gatewayUrl": dc.gateway_url,
                            "allowFrom": ["7"]},
                "slack": slack.section(), "email": email_section(imap, smtp),
                "whatsapp": wa.section(free_port()), "signal": {"enabled": True, "account": "+1555", "rpcUrl": sig.url},
                "matrix": {"enabled": True, "homeserver": hs.url, "userId": bot, "accessToken": token}}}))
        return await idle_gateway_rss(home, root / "modules.txt", ready_within=60)


async def main(slack_n: int, mail_n: int, others_n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        slack_times, mail_times = await latencies(Path(tmp), slack_n, mail_n)
    with tempfile.TemporaryDirectory() as tmp:
        others = await new_channel_latencies(Path(tmp), others_n)
    with tempfile.TemporaryDirectory() as tmp, homeserver(Path(tmp) / "synapse") as hs:
        rss = await memory_with_eight(Path(tmp), hs)
    print(f"Slack (stand-in, Socket Mode) message -> reply: {percentiles(slack_times)}")
    print(f"email (Dovecot IDLE -> aiosmtpd) mail -> reply: {percentiles(mail_times)}")
    print(f"WhatsApp (stand-in Cloud API, signed webhook) message -> reply: {percentiles(others['whatsapp'])}")
    print(f"Signal (stand-in signal-cli, SSE) message -> reply: {percentiles(others['signal'])}")
    print(f"Matrix (real Synapse, sync) message -> reply seen: {percentiles(others['matrix'])}")
    print(f"idle gateway with all eight channels on (Telegram, Discord, Slack, email, Matrix, WhatsApp, "
          f"Signal, the API): RSS {rss:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--slack", type=int, default=100)
    parser.add_argument("--mail", type=int, default=40)
    parser.add_argument("--others", type=int, default=100)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.slack, arguments.mail, arguments.others))
