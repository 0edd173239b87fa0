"""Slack's slash commands through a running gateway: Slack sends every message that starts with
"/" to a command, so /new, /model and the rest reach the bot only as the app's own commands
(``/nanobot new``), over Socket Mode and over signed HTTP requests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from nanobot.chat_commands import as_chat_message, picked, shown
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.slack_api import FakeSlack
from tests.helpers import running_gateway
from tests.test_slack import OWNER, SECRET, STRANGER, said, slack, slack_config  # noqa: F401 (a fixture)


async def test_a_command_typed_in_the_dm_is_that_chat_command(llm: FakeOpenAI, workspace: Path,
                                                             slack: FakeSlack) -> None:
    llm.script(reply("first answer"))
    dm = slack.dm_of(OWNER)
    async with running_gateway(slack_config(llm, workspace, slack)) as gateway:
        await slack.push_message(dm, OWNER, "remember the tea")
        await slack.wait_shown("first answer")
        envelope = await slack.push_command("/nanobot", "new")
        await slack.wait_shown("Started a new conversation.")
        await slack.wait_until(lambda: envelope in slack.acks)
        history = await gateway.runtime.sessions.records(f"slack:{dm}")
    assert slack.ack_payloads[envelope] == {"response_type": "in_channel", "text": ""}  # the command stays shown
    assert [m["channel"] for m in slack.posted] == [dm, dm]
    assert len(llm.chat_requests) == 1  # a chat command: no model call
    assert any("_reset" in record for record in history)


async def test_a_question_typed_anywhere_is_answered_in_the_users_dm(llm: FakeOpenAI, workspace: Path,
                                                                     slack: FakeSlack) -> None:
    llm.script(reply("Tea at four."))
    async with running_gateway(slack_config(llm, workspace, slack)) as gateway:
        envelope = await slack.push_command("/nanobot", "what is on today?", channel="C1")
        shown = await slack.wait_shown("Tea at four.")
        await slack.wait_until(lambda: envelope in slack.acks)
        assert gateway.runtime.trust(f"slack:{slack.dm_of(OWNER)}") == "owner"
        await slack.push_command("/model", "")  # a chat command the app registered under its own name
        await slack.wait_until(lambda: any(m["text"].startswith("Model:") for m in slack.shown()))
    assert said(llm) == "what is on today?"
    assert shown["channel"] == slack.dm_of(OWNER)  # not the channel it was typed in
    assert slack.ack_payloads[envelope] == {"text": "I answer in our direct messages."}  # to the user alone
    assert len(llm.chat_requests) == 1


async def test_help_on_slack_says_how_to_type_the_commands(llm: FakeOpenAI, workspace: Path,
                                                          slack: FakeSlack) -> None:
    """"/new" as Slack's own command fails there: /help says to type them after the app's."""
    async with running_gateway(slack_config(llm, workspace, slack)):
        await slack.push_command("/nanobot", "help")
        await slack.wait_until(lambda: any("after the app's command (/nanobot new)" in m["text"]
                                           for m in slack.shown()))
    assert "/model" in slack.shown()[0]["text"] and not llm.chat_requests


async def test_a_strangers_command_reaches_no_model(llm: FakeOpenAI, workspace: Path, slack: FakeSlack) -> None:
    llm.fallback = lambda body: reply("should not happen")
    async with running_gateway(slack_config(llm, workspace, slack)):
        envelope = await slack.push_command("/nanobot", "read me the owner's notes", user=STRANGER, channel="C1")
        await slack.wait_until(lambda: envelope in slack.acks)
    assert not llm.chat_requests
    assert all(m["channel"] == slack.dm_of(STRANGER) for m in slack.posted)  # a pairing code at most


async def test_a_signed_command_over_http(llm: FakeOpenAI, workspace: Path, slack: FakeSlack) -> None:
    llm.fallback = lambda body: reply("over http")
    config = slack_config(llm, workspace, slack, events=True)
    url = f"http://{config.channels.slack.events.listen}/slack/events"  # type: ignore[union-attr]
    async with running_gateway(config), aiohttp.ClientSession() as http:
        body, headers = slack.command_form("/nanobot", "hello there", SECRET)
        async with http.post(url, data=body, headers=headers) as resp:
            assert (resp.status, await resp.json()) == (200, {"response_type": "in_channel", "text": ""})
        forged, forged_headers = slack.command_form("/nanobot", "forged", "not-the-secret")
        async with http.post(url, data=forged, headers=forged_headers) as resp:
            assert resp.status == 401
        await slack.wait_shown("over http")
        body, headers = slack.command_form("/nanobot", "mode", SECRET)  # its answer has buttons...
        async with http.post(url, data=body, headers=headers) as resp:
            assert resp.status == 200
        shown = (await slack.wait_posted(2))[1]
        for secret, status in (("not-the-secret", 401), (SECRET, 200)):  # ...pressed, posted to the same URL
            body, headers = slack.action_form(shown, OWNER, "/mode code", secret)
            async with http.post(url, data=body, headers=headers) as resp:
                assert resp.status == status
        assert (await slack.wait_posted(3))[2]["text"] == "Mode set to code for this chat."
    assert [said(llm, i) for i in range(len(llm.chat_requests))] == ["hello there"]


def test_a_commands_words_make_a_chat_command_or_a_message() -> None:
    assert as_chat_message("/nanobot", "new") == "/new"
    assert as_chat_message("/nanobot", "") == "/help"
    assert as_chat_message("/nanobot", "model gpt-5") == "/model gpt-5"
    assert as_chat_message("/nanobot", "stop 3") == "/stop 3"  # a background task
    assert as_chat_message("/model", "gpt-5") == "/model gpt-5"  # registered under its own name
    assert as_chat_message("/nanobot", "new ideas for dinner?") == "new ideas for dinner?"  # not /new
    assert as_chat_message("/nanobot", "model of my car?") == "model of my car?"  # /model takes one word
    assert as_chat_message("/ask", "what is up") == "what is up"


def test_picks_are_shown_within_a_platforms_limits_and_read_back_as_commands_only() -> None:
    picks = ["/model fast", f"/model {'x' * 30}", "/model default"]
    assert shown(picks, most=3, label_chars=10, sends_bytes=20) == [("fast", "/model fast"), ("default", "/model default")]
    assert shown(picks, most=3, label_chars=10, sends_bytes=64)[1] == ("x" * 9 + "…", f"/model {'x' * 30}")
    assert shown(picks, most=2, label_chars=10, sends_bytes=64) == []  # too many: named in the answer, to type
    assert shown(["/model two words"], most=3, label_chars=10, sends_bytes=64) == []  # a pick could not read it back
    assert picked("/model fast") == "/model fast" and picked("/voice whenVoice") == "/voice whenVoice"
    assert picked("/new") == picked("/new x") == picked("hello there") == picked("/model") == ""  # never offered


# The scope each Web API method the adapter calls needs (api.slack.com/methods), bot token.
METHOD_SCOPES = {"auth_test": None, "apps_connections_open": None,  # the app-level token's connections:write
                 "chat_postMessage": "chat:write", "chat_update": "chat:write", "files_upload_v2": "files:write",
                 "conversations_history": "im:history", "conversations_replies": "im:history",
                 "conversations_open": "im:write", "reactions_add": "reactions:write",
                 "reactions_remove": "reactions:write"}


def test_the_app_manifest_grants_what_the_adapter_calls() -> None:
    """docs/slack-app-manifest.json, which a new Slack app is made from: every method the adapter
    calls has its scope there, the slash command is there, and people may write to the app."""
    root = Path(__file__).parent.parent
    called = set(re.findall(r'client\.(\w+)\(|_call\("(\w+)"|"(reactions_\w+)"', "".join(
        path.read_text() for path in (root / "channels").glob("slack*.py"))))
    methods = {name for found in called for name in found if name} - {"is_connected"}  # the WebSocket's own
    manifest = json.loads((root / "docs" / "slack-app-manifest.json").read_text())
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert methods <= set(METHOD_SCOPES), f"a method this test does not know: {methods - set(METHOD_SCOPES)}"
    assert {METHOD_SCOPES[m] for m in methods} - {None} <= scopes
    assert {"app_mentions:read", "files:read", "commands"} <= scopes  # events, downloads, the command
    assert {"app_mention", "message.im"} <= set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/nanobot"]
    assert manifest["features"]["app_home"]["messages_tab_read_only_enabled"] is False  # else no DM can be sent
    assert manifest["settings"]["interactivity"]["is_enabled"] is True  # a button pressed (/mode's) reaches us


async def test_mode_offers_its_words_as_buttons_and_a_press_is_that_command(llm: FakeOpenAI, workspace: Path,
                                                                           slack: FakeSlack) -> None:
    """/nanobot mode: the words as Block Kit buttons under the answer (/nanobot model: the
    configured models); a press is that command from whoever pressed it (Slack vouches for the
    user id), and only what was offered."""
    from nanobot.config import ModelChoice

    dm = slack.dm_of(OWNER)
    config = slack_config(llm, workspace, slack)
    config.agents.models = {"fast": ModelChoice(provider="openai", model="fast-model")}
    async with running_gateway(config):
        await slack.push_command("/nanobot", "mode")
        [shown] = await slack.wait_posted(1)
        assert shown["text"].startswith("Mode: tools") and shown["blocks"][0]["text"]["text"] == shown["text"]
        assert [b["value"] for b in shown["blocks"][1]["elements"]] == [
            "/mode tools", "/mode code", "/mode hybrid", "/mode default"]
        pressed = await slack.push_action(shown, OWNER, "/mode code")
        await slack.wait_until(lambda: pressed in slack.acks)
        assert (await slack.wait_posted(2))[1]["text"] == "Mode set to code for this chat."
        await slack.push_action(shown, OWNER, "/new")  # never offered: taken for nothing
        await slack.push_message(dm, OWNER, " /mode")  # typed in the DM, with a space first
        answer = (await slack.wait_posted(3))[2]
        assert answer["text"].startswith("Mode: code") and answer["channel"] == dm and "blocks" in answer
        await slack.push_command("/nanobot", "model")
        models = (await slack.wait_posted(4))[3]
        assert [b["value"] for b in models["blocks"][1]["elements"]] == ["/model fast", "/model default"]
        await slack.push_action(models, OWNER, "/model fast")
        assert (await slack.wait_posted(5))[4]["text"] == "Model set to openai/fast-model for this chat."
    assert not llm.chat_requests
