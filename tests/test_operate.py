"""Installing and operating nanobot as a new user would: a wheel in a fresh venv, one gateway per
home, channel states and logs, homes that cannot be used, SIGHUP, config errors from env vars."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanobot.cli import app
from nanobot.gateway_lock import running_gateway_pid
from tests import cli_zygote
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.test_cli import nanobot

REPO = Path(__file__).resolve().parent.parent
ALICE = 42


def test_a_wheel_installed_in_a_fresh_venv_ships_the_template_and_skills(tmp_path: Path) -> None:
    wheels, venv, home = tmp_path / "wheels", tmp_path / "venv", tmp_path / "home"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, timeout=300)
    import zipfile

    names = zipfile.ZipFile(next(wheels.glob("nanobot-*.whl"))).namelist()
    assert "nanobot_channels/telegram.py" in names and not any(n.startswith("channels/") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)  # MIT, shipped with the wheel
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages")]  # the dependencies, not our package
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    "-q", str(next(wheels.glob("nanobot-*.whl")))], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "NANOBOT_HOME": str(home)}
    done = subprocess.run([str(venv / "bin" / "nanobot"), "onboard"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (home / "workspace" / "AGENTS.md").read_text().strip() and (home / "workspace" / "memory").is_dir()
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import nanobot, nanobot.skills as s; print(nanobot.__file__); "
                            "print(sorted(k.name for k in s.list_skills(__import__('pathlib').Path('.'))))"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    installed_at, skills = probe.stdout.splitlines()
    assert installed_at.startswith(str(venv)) and not installed_at.startswith(str(REPO))
    assert "weather" in skills and "cron" in skills


def gateway_config(home: Path, workspace: Path, llm: FakeOpenAI, tg: FakeTelegram) -> None:
    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(workspace), "model": "m", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "sk-canary-provider-key", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base,
                                  "allowFrom": [str(ALICE)]},
                     "discord": {"enabled": True, "token": "canary-discord-token-999",
                                 "apiBase": "http://127.0.0.1:9/api/v10", "gatewayUrl": "ws://127.0.0.1:9"}},
        "tools": {"mcpServers": {"notes": {"command": sys.executable, "args": ["-m", "tests.fakes.mcp_notes"],
                                           "cwd": str(REPO)}}},
        "gateway": {"heartbeat": {"enabled": False}, "shutdownGraceSeconds": 1}}))


async def test_one_gateway_per_home_with_states_logs_and_sighup(home: Path, workspace: Path) -> None:
    async with FakeOpenAI() as llm, FakeTelegram() as tg:
        gateway_config(home, workspace, llm, tg)
        proc = await cli_zygote.start(["gateway"], {**os.environ, "NANOBOT_HOME": str(home)},
                                      stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(30):
                while "getUpdates" not in tg.calls:
                    await asyncio.sleep(0.05)
            assert running_gateway_pid(home) == proc.pid
            llm.script(reply("pong"))
            tg.push_text(ALICE, ALICE, "ping")
            assert (await tg.wait_sent(1, timeout=15))[0]["text"] == "pong"

            code, _, err = await nanobot("gateway", home=home)  # a second one on the same home
            assert code == 1 and f"another gateway is already running on {home} (PID {proc.pid})" in err
            code, out, _ = await nanobot("status", home=home)
            assert f"Gateway:   running (PID {proc.pid})" in out
            assert "Channels:  telegram: running\n           discord: retrying in" in out  # the daemon stays up
            assert "MCP:       notes: running, 10 tools" in out

            proc.send_signal(signal.SIGHUP)  # a closed terminal: a clean stop, not a kill
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stderr = (await proc.stderr.read()).decode()
    log = (home / "logs" / "nanobot.log").read_text()
    assert "SIGHUP received: stopping cleanly" in log and "gateway stopped" in log
    assert re.search(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO nanobot.agent.loop: turn telegram:{ALICE} "
                     r"mode=tools model_calls=1 ms=\d+ outcome=ok$", log, re.M), log
    for secret in (tg.token, "sk-canary-provider-key", "canary-discord-token-999"):
        assert secret not in log and secret not in stderr
    assert "Traceback" not in stderr
    code, out, _ = await nanobot("status", home=home)
    assert "Gateway:   not running" in out and "telegram: gateway not running" in out


UNUSABLE = [["status"], ["cron", "list"], ["pairing", "list"], ["agent", "-m", "hi"], ["gateway"]]


@pytest.mark.parametrize("args", UNUSABLE)
async def test_an_unwritable_home_is_one_line_and_exit_1(args: list[str], home: Path) -> None:
    code, out, err = await nanobot(*args, home=Path("/sys/nanobot-home"),
                                   env={"NANOBOT_PROVIDERS__OPENAI__API_KEY": "k"})
    assert code == 1, (out, err)
    assert err.strip().splitlines() == [err.strip()] and "/sys/nanobot-home" in err and "Traceback" not in err


@pytest.mark.parametrize("args", UNUSABLE[:3])
async def test_a_broken_database_is_one_line_and_never_hangs(args: list[str], home: Path) -> None:
    (home / "nanobot.db").write_text("this is not a database\n" * 100)
    code, out, err = await nanobot(*args, home=home)  # nanobot() gives up after 60 s
    assert code == 1 and "nanobot.db" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


async def test_an_invalid_timezone_is_refused_at_load_naming_its_source(home: Path) -> None:
    (home / "config.json").write_text(json.dumps({"agents": {"defaults": {"timezone": "Europe/Berln"}}}))
    code, _, err = await nanobot("gateway", home=home)
    assert code == 2 and f"{home / 'config.json'}: invalid value for 'agents.defaults.timezone'" in err
    assert "Europe/Berln" in err and "Traceback" not in err
    (home / "config.json").write_text("{}")
    code, _, err = await nanobot("status", home=home, env={"NANOBOT_AGENTS__DEFAULTS__TIMEZONE": "Mars/Base"})
    assert code == 2 and err.startswith("nanobot: environment variable NANOBOT_AGENTS__DEFAULTS__TIMEZONE:")


async def test_version_and_onboard_force_keeps_secrets(home: Path) -> None:
    code, out, _ = await nanobot("--version", home=home)
    assert code == 0 and re.fullmatch(r"nanobot \d+\.\d+\.\d+\n", out)
    (home / "config.json").write_text(json.dumps({"providers": {"openai": {"apiKey": "sk-keep-me"}},
                                                  "channels": {"telegram": {"token": "123:keep"}},
                                                  "agents": {"defaults": {"model": "old-model"}}}))
    code, out, err = await nanobot("onboard", "--force", home=home)
    assert code == 0, err
    assert "Next: nanobot agent" in out and "set providers.openai.apiKey" not in out  # the key was kept
    config = json.loads((home / "config.json").read_text())
    assert config["providers"]["openai"]["apiKey"] == "sk-keep-me"
    assert config["channels"]["telegram"]["token"] == "123:keep"
    assert config["agents"]["defaults"]["model"] == "gpt-4.1-mini"
    assert "old-model" in (home / "config.json.bak").read_text()


async def test_a_relative_workspace_is_under_the_home_and_created_when_missing(home: Path, tmp_path: Path) -> None:
    async with FakeOpenAI() as llm:
        (home / "config.json").write_text(json.dumps({
            "agents": {"defaults": {"workspace": "my-space", "executionMode": "tools"}},
            "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}}}))
        llm.script(reply("hi"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nanobot", "agent", "-m", "hi", cwd=tmp_path,
            env={**os.environ, "NANOBOT_HOME": str(home)}, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    assert (home / "my-space" / "AGENTS.md").exists() and not (tmp_path / "my-space").exists()
    assert "AGENTS.md" in llm.chat_requests[0]["messages"][0]["content"]


async def test_two_connections_migrating_a_fresh_database_at_once(tmp_path: Path) -> None:
    from nanobot.cron.store import MIGRATIONS
    from nanobot.sqlite_file import migrate, open_db

    first, second = await open_db(tmp_path / "x.db"), await open_db(tmp_path / "x.db")
    try:  # both would read version 0, and the second fail on "table cron_jobs already exists"
        await asyncio.gather(migrate(first, "cron", MIGRATIONS["sqlite"]), migrate(second, "cron", MIGRATIONS["sqlite"]))
    finally:
        await first.close()
        await second.close()


async def test_opening_a_fresh_database_another_process_has_locked_waits_for_it(tmp_path: Path) -> None:
    """The switch to WAL mode ignores SQLite's busy timeout: a process opening the fresh file
    while another read it failed at once ("database is locked"; six ``cron add`` at once)."""
    from nanobot.sqlite_file import open_db

    path = tmp_path / "x.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a write lock, as another opener's writing its first table
    opening = asyncio.ensure_future(open_db(path))
    with pytest.raises(asyncio.TimeoutError):  # still waiting: the lock is held
        await asyncio.wait_for(asyncio.shield(opening), 0.5)
    other.execute("COMMIT")
    other.close()
    conn = await opening
    try:
        assert (await (await conn.execute("PRAGMA journal_mode")).fetchone())[0] == "wal"
    finally:
        await conn.close()


async def test_a_migration_step_is_all_or_nothing(tmp_path: Path) -> None:
    """A step that fails (or a process killed) half-way leaves nothing behind: the next start
    must not find half its tables ("table cron_jobs already exists")."""
    from nanobot.sqlite_file import migrate, open_db

    broken = ["CREATE TABLE kept (x);", "CREATE TABLE half (x); CREATE TABLE half (y);"]
    conn = await open_db(tmp_path / "x.db")
    try:
        with pytest.raises(sqlite3.OperationalError, match="already exists"):
            await migrate(conn, "demo", broken)
        async with conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'") as cur:
            tables = {row[0] for row in await cur.fetchall()}
        async with conn.execute("SELECT version FROM schema_versions WHERE component = 'demo'") as cur:
            version = (await cur.fetchone())[0]
        assert "kept" in tables and "half" not in tables and version == 1
        await migrate(conn, "demo", ["CREATE TABLE kept (x);", "CREATE TABLE half (x);"])  # the fixed step runs
    finally:
        await conn.close()


async def test_parallel_cron_adds_on_a_fresh_database_all_succeed(home: Path, tmp_path: Path) -> None:
    (home / "config.json").write_text(json.dumps({"channels": {"telegram": {
        "enabled": True, "token": "1:x", "allowFrom": ["42"]}}}))
    runs = [nanobot("cron", "add", "--every", "1h", "--message", f"job {i}", home=home) for i in range(6)]
    results = await asyncio.gather(*runs)  # each gives up after 60 s: a hang fails the test
    assert all(code == 0 for code, _, _ in results), results
    code, out, _ = await nanobot("cron", "list", home=home)
    assert code == 0 and sum(f"job {i}" in out for i in range(6)) == 6


async def test_a_members_job_name_reaches_the_owners_terminal_shown_never_obeyed(home: Path) -> None:
    """A member names their job; the name may carry commands to a terminal (retitle the window,
    clear the screen, set the clipboard). ``cron list`` and the log show them as text."""
    import logging

    from nanobot.config import load_config
    from nanobot.logs import FORMAT, RedactingFormatter
    from nanobot.runtime import open_runtime

    (home / "config.json").write_text(json.dumps({"providers": {"openai": {"apiKey": "k"}}, "channels": {
        "telegram": {"enabled": True, "token": "1:x", "allowFrom": ["42"]}}}))
    name = "\x1b]0;owned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07stretch"
    async with open_runtime(load_config()[0]) as rt:
        await rt.cron.add(name=name, owner_session="telegram:-100", schedule_kind="every", expression="3600",
                          timezone="UTC", payload_kind="prompt", payload="stretch")
    code, out, _ = await nanobot("cron", "list", home=home)
    assert code == 0 and "\\x1b]0;owned\\x07\\x1b[2J\\x1b]52;c;cm0gLXJmIH4=\\x07stretch" in out and "\x1b" not in out
    record = logging.LogRecord("nanobot.notices", logging.WARNING, __file__, 1, "announced to the owner: %s",
                               (f"New scheduled job j1 made by telegram:-100: {name}",), None)
    line = RedactingFormatter(FORMAT).format(record)
    assert "\\x1b]52;c;cm0gLXJmIH4=" in line and "\x1b" not in line
    forged = "stretch\n2026-11-28 14:00:00,000 WARNING nanobot.access: pairing: telegram user 7 asked to talk"
    record.args = (f"New scheduled job j2 made by telegram:-100: {forged}",)
    lines = RedactingFormatter(FORMAT).format(record).splitlines()  # a line that starts with a time is a record's
    assert len(lines) == 2 and lines[1].startswith("    2026-11-28 14:00:00,000 WARNING")


async def test_history_export_shows_what_others_wrote_never_obeyed(home: Path) -> None:
    """JSON escapes the C0 controls but not DEL and the C1 ones (0x9b is CSI to some terminals):
    the export writes those as JSON escapes too, and reads back the same."""
    from nanobot.chat_names import history_file

    (home / "config.json").write_text(json.dumps({"providers": {"openai": {"apiKey": "k"}}}))
    said = "look \x9b2J\x9d0;owned\x07 \x7f done"
    (home / "sessions").mkdir(parents=True)
    (home / "sessions" / history_file("telegram:5")).write_text(
        json.dumps({"_meta": {"key": "telegram:5"}}) + "\n" + json.dumps({"role": "user", "content": said}) + "\n")
    code, out, err = await nanobot("history", "export", "telegram:5", home=home)
    assert code == 0, err
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out) and "\\u009b2J" in out
    assert json.loads(out.splitlines()[-1])["content"] == said
    listed = [await asyncio.to_thread(CliRunner().invoke, app, ["history", "list", *prefix])
              for prefix in ([], ["slack:"])]  # which chats there are, to export one
    assert [r.stdout for r in listed] == ["telegram:5\n", "No chat has a history whose key starts with 'slack:'.\n"]


async def test_what_nanobot_creates_is_private_even_outside_the_home(home: Path, tmp_path: Path) -> None:
    """umask 077 for every command: a workspace elsewhere, its files, MCP logs, the terminal history."""
    workspace = tmp_path / "shared" / "workspace"
    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(workspace)}},
        "tools": {"mcpServers": {"dying": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}}}}))
    code, _, err = await nanobot("onboard", home=home)
    assert code == 0, err
    await nanobot("mcp", "list", home=home)
    made = [workspace, workspace / "AGENTS.md", workspace / "memory", home / "logs" / "mcp-dying.log"]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in made} == {
        "workspace": "0o700", "AGENTS.md": "0o600", "memory": "0o700", "mcp-dying.log": "0o600"}
