"""A third-party channel: an installed distribution with a ``nanobot.channels`` entry point and
its own config section, found and run by the gateway without any change to nanobot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nanobot.config import ConfigError, load_config
from nanobot.gateway import Gateway
from nanobot.gateway.app import Pace
from nanobot.runtime import open_runtime
from nanobot.trust import MEMBER, OWNER, chat_trust
from nanobot.bus import Identity
from tests.fakes.openai_server import FakeOpenAI, reply

PLUGIN = '''
import asyncio
from nanobot.channel_plugin import BaseChannel, Identity
from nanobot.config import PluginChannelConfig


class EchoConfig(PluginChannelConfig):
    greeting: str = ""


class EchoChannel(BaseChannel):
    """Lives in memory: tests hand it messages and read what it sends."""
    name = "echo"
    max_message_len = 1000
    config_model = EchoConfig
    running = []

    async def start(self):
        self.outbox = asyncio.Queue()
        if self.config.greeting == "hang":  # a library that never gives up connecting
            await asyncio.Event().wait()
        EchoChannel.running.append(self)

    async def stop(self):
        if self in EchoChannel.running:
            EchoChannel.running.remove(self)

    async def send(self, msg):
        self.outbox.put_nowait(f"{self.config.greeting} {msg.content}")

    async def send_stream(self, msg):
        pass  # shows only the final text

    async def send_typing(self, chat_id):
        pass

    async def receive(self, user, text):
        return await self._handle_message(sender=Identity(user), chat_id=user, content=text)
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install the plugin the way pip would: a module plus a .dist-info with entry_points.txt."""
    site = tmp_path / "site"
    dist = site / "nanobot_echo-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nanobot-echo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nanobot.channels]\necho = nanobot_echo:EchoChannel\n")
    (site / "nanobot_echo.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    yield
    import sys
    sys.modules.pop("nanobot_echo", None)


def write_config(home: Path, data: dict) -> None:
    (home / "config.json").write_text(json.dumps(data))


async def test_an_installed_channel_is_configured_started_and_served(
        plugin, llm: FakeOpenAI, home: Path, workspace: Path) -> None:
    write_config(home, {
        "agents": {"defaults": {"workspace": str(workspace), "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"echo": {"enabled": True, "allowFrom": ["alice"], "greeting": "[echo]"}},
    })
    config, _ = load_config()
    llm.script(reply("hello alice"))
    async with open_runtime(config) as rt:
        gateway = Gateway(rt)
        await gateway.start()
        try:
            [channel] = gateway.channels.channels.values()
            assert channel.config.allow_from == ["alice"]
            assert not await channel.receive("mallory", "hi")  # access rules apply to plugins too
            assert "nanobot pairing approve" in await asyncio.wait_for(channel.outbox.get(), 5)
            assert await channel.receive("alice", "hi")
            assert await asyncio.wait_for(channel.outbox.get(), 5) == "[echo] hello alice"
            # Where its stream stands, kept by the gateway; also by the name adapters used before.
            await channel.ctx.positions.keep_position("echo", "42")
            assert await channel.ctx.store.position("echo") == "42"
        finally:
            await gateway.stop()
    assert len(llm.chat_requests) == 1


async def test_a_channel_whose_start_hangs_holds_neither_start_nor_stop(
        plugin, llm: FakeOpenAI, home: Path, workspace: Path) -> None:
    write_config(home, {
        "agents": {"defaults": {"workspace": str(workspace), "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"echo": {"enabled": True, "allowFrom": ["alice"], "greeting": "hang"}},
    })
    config, _ = load_config()
    async with open_runtime(config) as rt:
        gateway = Gateway(rt, pace=Pace(channel_start_s=0.2))
        async with asyncio.timeout(10):
            await gateway.start()
            assert gateway.channels.state["echo"].startswith("retrying in ") and \
                "did not start within 0.2 s" in gateway.channels.state["echo"]
            await gateway.stop()


async def test_a_stop_signal_during_a_hanging_start_ends_the_gateway(
        plugin, llm: FakeOpenAI, home: Path, workspace: Path) -> None:
    """SIGTERM (here: the same stop event) while a channel's start still hangs: the gateway
    stops at once, exit code 0, instead of waiting for the start's deadline."""
    from nanobot.gateway.app import run_gateway

    write_config(home, {
        "agents": {"defaults": {"workspace": str(workspace), "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"echo": {"enabled": True, "allowFrom": ["alice"], "greeting": "hang"}},
    })
    config, _ = load_config()
    stop = asyncio.Event()
    stop.set()
    async with asyncio.timeout(10):  # the start's deadline is 60 s
        assert await run_gateway(config, stop=stop) == 0


def test_a_section_no_installed_channel_claims_is_rejected(home: Path) -> None:
    write_config(home, {"channels": {"telgram": {"enabled": True}}})
    with pytest.raises(ConfigError, match="unknown key 'channels.telgram'"):
        load_config()


def test_a_plugin_section_is_typed_at_load_and_trust_reads_it(plugin, home: Path) -> None:
    """A third-party section has the shared fields typed like the built-in ones: a bad value is
    one line naming the key, and owners work without a dict-or-model branch anywhere."""
    write_config(home, {"channels": {"echo": {"enabled": "maybe"}}})
    with pytest.raises(ConfigError, match="'channels.echo.enabled'"):
        load_config()
    write_config(home, {"channels": {"echo": {"enabled": True, "owners": [7], "greeting": "hi"}}})
    config, _ = load_config()
    section = config.channels.section("echo")
    assert section is not None and section.owners == ["7"] and section.model_extra == {"greeting": "hi"}
    assert config.channels.enabled_names() == ["echo"] and config.channels.stream_pace("echo") is None
    assert chat_trust(config, "echo:7", Identity("7")) == OWNER and chat_trust(config, "echo:8", Identity("8")) == MEMBER
    assert chat_trust(config, "echo:7") == MEMBER  # before anyone wrote: an id names a person, not a chat
    assert config.channels.section("nowhere") is None
