"""👀 on the message the bot is answering while its turn runs: Slack shows no typing indicator
for a bot, so a long turn looked like nobody heard."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, delayed, reply
from tests.fakes.slack_api import FakeSlack
from tests.helpers import running_gateway
from tests.test_slack import OWNER, slack, slack_config  # noqa: F401 (a fixture)


async def answer_once_marked(slack: FakeSlack, text: str) -> dict[str, Any]:
    """The model's answer, given once the message carries the mark (a turn that lasts)."""
    await slack.wait_until(lambda: any(r[0] == "add" for r in slack.reactions))
    return reply(text)


async def test_a_turn_that_lasts_marks_its_message_until_the_answer(llm: FakeOpenAI, workspace: Path,
                                                                   slack: FakeSlack) -> None:
    llm.script(answer_once_marked(slack, "done thinking"))
    async with running_gateway(slack_config(llm, workspace, slack)):
        asked = await slack.push_message("D1", OWNER, "a long question")
        await slack.wait_shown("done thinking")
        await slack.wait_until(lambda: len(slack.reactions) == 2)
    assert slack.reactions == [("add", "D1", asked["ts"], "eyes"), ("remove", "D1", asked["ts"], "eyes")]


async def test_without_the_scope_it_is_said_once_and_not_tried_again(llm: FakeOpenAI, workspace: Path,
                                                                     slack: FakeSlack,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    slack.reactions_allowed = False
    tried = lambda: slack.calls.count("reactions.add")  # noqa: E731
    async def refused_then(text: str) -> dict[str, Any]:
        await slack.wait_until(lambda: tried() == 1)
        return reply(text)
    llm.script(refused_then("one"), delayed(reply("two"), 0.8))  # long enough for a typing indicator
    async with running_gateway(slack_config(llm, workspace, slack)):
        await slack.push_message("D1", OWNER, "first")
        await slack.wait_shown("one")
        await slack.push_message("D1", OWNER, "second")
        await slack.wait_shown("two")
    assert tried() == 1 and not slack.reactions
    assert caplog.text.count("lacks the reactions:write scope") == 1


async def test_a_message_that_came_during_a_turn_waits_for_its_own(slack: FakeSlack) -> None:
    """The chat's turn for A goes on while B comes in: A keeps the mark until it is answered, and
    only then B's turn marks B (else A's mark was never taken off)."""
    from slack_sdk.web.async_client import AsyncWebClient

    from nanobot_channels.slack_working import WorkingMarks

    marks = WorkingMarks(AsyncWebClient(token=slack.bot_token, base_url=slack.api_base))
    marks.heard("D1", "D1", "1.1")
    await marks.working("D1")
    marks.heard("D1", "D1", "1.2")  # B, while A's turn runs
    await marks.working("D1")  # A's turn still: no mark on B yet
    await marks.answered("D1")
    await marks.working("D1")  # B's turn
    await marks.answered("D1")
    assert [(r[0], r[2]) for r in slack.reactions] == [("add", "1.1"), ("remove", "1.1"), ("add", "1.2"),
                                                      ("remove", "1.2")]
