"""The terminal chat on a real pseudo-terminal: line editing, history, Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from tests.fakes.openai_server import FakeOpenAI, delayed, error, reply, tool_calls
from tests.helpers import add_cron_job, config_for, nanobot_process, running_gateway, until
from tests.test_cli import write_config


class Terminal:
    """A pty the chat runs on; ``screen`` is everything it printed."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.screen = ""
        os.set_blocking(self.master, False)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    async def wait_for(self, text: str, timeout: float = 15.0) -> None:
        try:
            await self._wait_for(text, timeout)
        except TimeoutError:
            raise AssertionError(f"{text!r} not on the screen:\n{self.screen!r}") from None

    async def _wait_for(self, text: str, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while text not in self.screen:
                try:
                    self.screen += os.read(self.master, 65536).decode(errors="replace")
                except BlockingIOError:
                    await asyncio.sleep(0.02)
                except OSError:  # the child closed the terminal
                    await asyncio.sleep(0.02)


@asynccontextmanager
async def chat_on(term: Terminal, home: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``nanobot agent`` on the pty; killed on the way out if it is still running."""
    try:
        async with nanobot_process("agent", home=home, env={"PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"},
                                   stdin=term.slave, stdout=term.slave, stderr=term.slave) as proc:
            yield proc
    finally:
        os.close(term.slave)


async def stop_a_slow_turn_then_leave(term: Terminal, llm: FakeOpenAI, proc: asyncio.subprocess.Process) -> None:
    """Ask something slow (the model's second answer), Ctrl-C it, then Ctrl-C at the idle prompt."""
    term.type("slow one\r")
    async with asyncio.timeout(10):
        while len(llm.chat_requests) < 2:
            await asyncio.sleep(0.02)
    term.type("\x03")  # Ctrl-C during a turn: cancel it, stay in the chat
    await term.wait_for("Stopped.")
    assert proc.returncode is None
    term.type("\x03")  # Ctrl-C at an idle prompt: leave
    assert await asyncio.wait_for(proc.wait(), 15) == 0


async def leave(term: Terminal, proc: asyncio.subprocess.Process) -> None:
    term.type("\x03")  # Ctrl-C at an idle prompt: leave
    await asyncio.wait_for(proc.wait(), 15)


@asynccontextmanager
async def gateway_on(home: Path, workspace: Path, llm: FakeOpenAI) -> AsyncIterator[Any]:
    """A gateway of the home (``nanobot agent`` reaches it through its socket), no heartbeat."""
    write_config(home, workspace, llm.base_url)
    config = config_for(llm.base_url, workspace)
    config.gateway.heartbeat.enabled = False
    async with running_gateway(config, with_services=True) as gateway:
        yield gateway


async def run_job(gateway: Any, kind: str, payload: str, status: str = "ok") -> None:
    """A job of the terminal's chat (``nanobot cron add`` without ``--to``), run now."""
    job = await add_cron_job(gateway.cron_jobs.service, owner_session="cli:default", schedule_kind="every",
                             expression="3600", payload_kind=kind, payload=payload)
    assert (await gateway.runtime.cron_runs.run(job.id, 15)).status == status


@asynccontextmanager
async def terminal_socket(home: Path) -> AsyncIterator[Any]:
    """The gateway's terminal socket, as ``nanobot agent`` asks it, in the terminal's chat."""
    import aiohttp

    from nanobot.terminal_client import SOCKET

    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(home / SOCKET)),
                                     headers={"X-Nanobot-Session": "cli:default"}) as http:
        yield http


async def waiting(http: Any, after: int = -1) -> dict:
    async with http.post("http://gateway/v1/nanobot/waiting", params={"after": str(after)}) as response:
        return await response.json()


async def test_arrows_edit_the_line_and_ctrl_c_cancels_then_leaves(home: Path, workspace: Path) -> None:
    term = Terminal()
    async with FakeOpenAI() as llm:
        write_config(home, workspace, llm.base_url)
        llm.script(reply("hi there"), delayed(reply("too slow"), 30))
        async with chat_on(term, home) as proc:
            await term.wait_for("you>")
            term.type("helo\x1b[Dl\r")  # left arrow, then the missing "l": "hello"
            await term.wait_for("hi there")
            assert llm.chat_requests[0]["messages"][-1]["content"] == "hello"
            await stop_a_slow_turn_then_leave(term, llm, proc)
    assert "\x1b[D" not in llm.chat_requests[0]["messages"][-1]["content"]
    assert "hello" in (home / "cli_history").read_text()
    assert "Traceback" not in term.screen


async def test_a_reply_is_shown_as_markdown_on_a_terminal(home: Path, workspace: Path) -> None:
    term = Terminal()
    async with FakeOpenAI() as llm:
        write_config(home, workspace, llm.base_url)
        llm.script(reply("Some **bold** words.\n\n- first item\n- second item\n\n"
                         "Log in at [https://bank.example](https://evil.example/steal)."))
        async with chat_on(term, home) as proc:
            await term.wait_for("you>")
            term.type("markdown please\r")
            await term.wait_for("Log in at")
            term.type("\x04")  # Ctrl-D: leave
            assert await asyncio.wait_for(proc.wait(), 15) == 0
    assert "**bold**" not in term.screen and "\x1b[1mbold" in term.screen and "- first item" not in term.screen
    # A link shows where it goes, not only the words a steered reply put on it (no hidden OSC 8 target).
    assert "evil.example/steal" in term.screen and "\x1b]8;" not in term.screen


async def test_a_slash_lists_the_chat_commands_and_tab_completes_one(home: Path, workspace: Path) -> None:
    term = Terminal()
    async with FakeOpenAI() as llm:
        write_config(home, workspace, llm.base_url)
        async with chat_on(term, home) as proc:
            await term.wait_for("you>")
            term.type("/mo")
            await term.wait_for("show or set how I act in this chat")  # the menu, with what each does
            term.type("\t")  # the first of /mode and /model
            await term.wait_for("/mode")
            term.type(" code\r")
            await term.wait_for("Mode set to code for this chat.")
            term.type("/new\r")  # Enter with the menu open sends the line
            await term.wait_for("Started a new conversation.")
            await leave(term, proc)
    assert not llm.chat_requests  # a chat command: no model call


async def test_the_chat_goes_through_a_running_gateway(home: Path, workspace: Path) -> None:
    """With a gateway on the home, the terminal chat is its front end: the gateway runs the
    turns and writes the history (one writer), Ctrl-C still stops a turn and then leaves."""
    term = Terminal()
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway:
        llm.script(reply("hi there"), delayed(reply("too slow"), 30))
        async with chat_on(term, home) as proc:
            await term.wait_for("through the running gateway")
            await term.wait_for("you>")
            term.type("hello\r")
            await term.wait_for("hi there")
            await stop_a_slow_turn_then_leave(term, llm, proc)
        said = [m["content"] for m in (await gateway.runtime.sessions.open("cli:default")).messages]
    assert said[:2] == ["hello", "hi there"] and "slow one" in said
    assert "Traceback" not in term.screen


async def test_the_chat_through_a_running_gateway_has_the_garbage_collector_on(home: Path, workspace: Path) -> None:
    """The start turns the collector off (nanobot/collector.py): a chat of hours through the
    gateway, which opens no runtime of its own, must turn it back on."""
    probe = ("import atexit, gc, sys; atexit.register(lambda: print('on:', gc.isenabled())); "
             "sys.argv = ['nanobot', 'agent']; from nanobot.entry import main; main()")
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm):
        llm.script(reply("hi there"))
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", probe, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    env={**os.environ, "NANOBOT_HOME": str(home)})
        out = (await asyncio.wait_for(proc.communicate(b"hello\n"), 60))[0].decode()
    assert "through the running gateway" in out and "hi there" in out and out.endswith("on: True\n"), out


async def test_what_a_terminal_job_sent_is_shown_at_the_next_start(home: Path, workspace: Path) -> None:
    """The terminal chat is a chat like any other: a job made there delivers there, kept in its
    history while nobody is at the terminal, and shown when the chat starts again, once."""
    term, second = Terminal(), Terminal()
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway:
        await run_job(gateway, "code", "print('the backup finished: 41 s')")
        kept = await gateway.runtime.sessions.open("cli:default")
        await until(lambda: len(kept.meta.waiting) == 1)  # kept as the chat gets to it (a message of its own)
        async with chat_on(term, home) as proc:
            await term.wait_for("While you were away (1):")
            await term.wait_for("the backup finished: 41 s")
            await term.wait_for("you>")
            await leave(term, proc)
        await until(lambda: not kept.meta.waiting)  # marked seen by the chat's turn, a moment after
        async with chat_on(second, home) as again:
            await second.wait_for("you>")
            await leave(second, again)
        assert not (await gateway.runtime.sessions.open("cli:default")).meta.waiting
    assert "While you were away" not in second.screen  # shown once


async def test_what_a_prompt_jobs_turn_sends_is_kept_for_the_terminal(home: Path, workspace: Path) -> None:
    """A message job's turn in the terminal's chat that sends (send_message and send_file here; a
    <say> note takes the same way) had nobody asking: the terminal's channel dropped it, and the
    reader saw only the answer ("Sent."). A file is kept in the chat's sent/, and a line says where."""
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway:
        (workspace / "chart.csv").write_text("day,temp\nmon,14\n")
        llm.script(tool_calls(("send_message", {"content": "It is 14 degrees and dry."}),
                              ("send_file", {"path": "chart.csv", "caption": "the week"})), reply("Sent."))
        await run_job(gateway, "prompt", "tell me the weather")
        kept = await gateway.runtime.sessions.open("cli:default")
        await until(lambda: len(kept.meta.waiting) == 3)
        said, answer, sent = sorted(kept.waiting_messages())
    assert (said, answer) == ("It is 14 degrees and dry.", "Sent.")
    assert re.fullmatch(r"📎 sent/[0-9a-f]{8}_chart.csv: the week", sent), sent  # where the file is kept
    assert (workspace / sent[2:].split(":")[0]).read_text() == "day,temp\nmon,14\n"


async def test_a_spoken_reply_shows_its_words_then_where_its_voice_is(home: Path, workspace: Path) -> None:
    """Through the gateway, a reply's voice note (tools.speech) was shown above its words: the
    words are shown a block at a time, and the note's line had come meanwhile."""
    term = Terminal()
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway:
        gateway.runtime.config.tools.speech.provider, gateway.runtime.config.tools.speech.reply = "openai", "always"
        llm.script(reply("Spoken words."))
        async with chat_on(term, home) as proc:
            await term.wait_for("you>")
            term.type("speak\r")
            await term.wait_for("_reply.ogg in the chat's folder]")
            await leave(term, proc)
    assert term.screen.index("Spoken words.") < term.screen.index("_reply.ogg")


async def test_what_reaches_an_open_terminal_chat_is_shown_there_at_once_and_not_again(
        home: Path, workspace: Path) -> None:
    """A job's output (or a task's result) for the terminal's chat while ``nanobot agent`` is
    open appears above its prompt; it was kept for the next start only, so whoever waited at the
    terminal for it never saw it there."""
    term, second = Terminal(), Terminal()
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway:
        async with chat_on(term, home) as proc:
            await term.wait_for("you>")
            await run_job(gateway, "code", "print('the backup finished')")
            await term.wait_for("the backup finished", timeout=45)  # asked every 2, 4, 8... at most 30 s
            kept = await gateway.runtime.sessions.open("cli:default")
            await until(lambda: not kept.meta.waiting)  # marked seen
            await leave(term, proc)
        async with chat_on(second, home) as again:
            await second.wait_for("you>")
            await leave(second, again)
    assert "While you were away" not in term.screen + second.screen and term.screen.count("the backup finished") == 1


async def test_what_came_while_the_terminal_was_open_is_shown_at_the_next_start_not_a_reply(
        home: Path, workspace: Path) -> None:
    """A code job's output kept while the terminal was open (it is not shown there), a line typed
    and answered, then a prompt job's reply: the next start shows the output and the job's reply,
    once. It showed the typed line's answer instead of the output (the last N assistant messages
    were taken), and never a prompt job's reply (``nanobot cron add --message``'s default chat)."""
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway, terminal_socket(home) as http:
        llm.script(reply("hi there"), reply("3 new mails"))
        assert (await waiting(http))["messages"] == []
        await run_job(gateway, "code", "print('the backup finished')")
        chat = await gateway.runtime.sessions.open("cli:default")
        await until(lambda: len(chat.meta.waiting) == 1)
        async with http.post("http://gateway/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "hello"}]}) as response:
            assert (await response.json())["choices"][0]["message"]["content"] == "hi there"
        await run_job(gateway, "prompt", "how many new mails?")
        assert (await waiting(http))["messages"] == ["the backup finished", "3 new mails"]
        await until(lambda: not chat.meta.waiting)
        assert (await waiting(http))["messages"] == []
        llm.script(error(400, message="model gone"))  # a job whose turn fails before doing anything
        await run_job(gateway, "prompt", "and now?", status="error")
        await until(lambda: len(chat.meta.waiting) == 2)  # the job's notice comes behind
        failed, notice = (await waiting(http))["messages"]
        assert failed.startswith("Sorry, I could not get an answer from the model") and "model gone" in failed
        assert notice.startswith("⏰ Cron job") and "failed (1/3)" in notice


async def test_an_open_terminal_asking_again_before_the_mark_is_made_is_not_shown_it_twice(
        home: Path, workspace: Path) -> None:
    """The mark is a message of the chat: behind a turn still running there, it waits. An open
    terminal asks every few seconds meanwhile; it names what it showed (``after``), so the same
    message does not come again."""
    async with FakeOpenAI() as llm, gateway_on(home, workspace, llm) as gateway, terminal_socket(home) as http:
        llm.script(delayed(reply("late"), 60))
        await run_job(gateway, "code", "print('the backup finished')")
        chat = await gateway.runtime.sessions.open("cli:default")
        await until(lambda: len(chat.meta.waiting) == 1)
        slow = asyncio.ensure_future(http.post("http://gateway/v1/chat/completions",
                                               json={"messages": [{"role": "user", "content": "slow one"}]}))
        await asyncio.wait_for(llm.request_event.wait(), 15)  # the chat is busy: the mark will wait
        first = await waiting(http)
        assert first["messages"] == ["the backup finished"]
        again = await waiting(http, first["upto"])
        assert again["messages"] == [] and chat.meta.waiting  # not marked yet, not shown twice
        async with http.post("http://gateway/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "/stop"}]}) as response:
            assert response.status == 200
        (await slow).release()
        await until(lambda: not chat.meta.waiting)  # marked once the turn was stopped


async def test_a_stop_typed_at_once_waits_until_the_gateway_has_the_line(tmp_path: Path) -> None:
    """Ctrl-C right after Enter: the /stop must reach the gateway after the line it stops. A
    stand-in gateway holds the line's answer until a /stop arrives (or a second passes)."""
    import aiohttp
    from aiohttp import web

    from nanobot.bus import InboundMessage
    from nanobot.cli.remote_chat import RemoteChat

    seen: list[str] = []
    stop_came = asyncio.Event()

    async def completions(request: web.Request) -> web.StreamResponse:
        text = (await request.json())["messages"][0]["content"]
        seen.append(text)
        if text == "/stop":
            stop_came.set()
            return web.json_response({})
        try:
            await asyncio.wait_for(stop_came.wait(), 1.0)
        except TimeoutError:
            seen.append("answered")
        return web.Response(text="data: [DONE]\n\n", content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(tmp_path / "api.sock")).start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(tmp_path / "api.sock"))) as http:
            chat = RemoteChat(http, {}, "cli:default", tmp_path)
            chat.background.run(chat._asker())
            await chat.accept([InboundMessage("cli", "default", "user", "slow"),
                               InboundMessage("cli", "default", "user", "/stop")])
            await asyncio.wait_for(stop_came.wait(), 5)
            await chat.background.stop()
    finally:
        await runner.cleanup()
    assert seen == ["slow", "answered", "/stop"]
