"""Running it like a service: a real Prometheus scrapes a gateway's /metrics (the stand-in
Telegram and model), /readyz follows the database, and /healthz needs no key."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import aiohttp
import pytest

from tests import cli_zygote
from tests.fakes.openai_server import FakeOpenAI, reply
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import running_gateway, telegram_gateway_config
from tests.test_api import free_port
from tests.test_postgres import _outage

PROMETHEUS = shutil.which("prometheus")
ALICE = 42


@pytest.fixture
def config(llm: FakeOpenAI, tg: FakeTelegram, workspace: Path, monkeypatch: pytest.MonkeyPatch):
    cfg = telegram_gateway_config(llm.base_url, workspace, tg, ALICE)
    cfg.channels.telegram.streaming = False
    cfg.gateway.metrics.enabled = True
    cfg.gateway.metrics.listen = f"127.0.0.1:{free_port()}"
    cfg.gateway.worker_id = "w-test"
    return cfg


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            return resp.status, await resp.text()


@pytest.mark.skipif(PROMETHEUS is None, reason="the metrics test needs a real Prometheus: apt-get install prometheus")
async def test_prometheus_scrapes_the_gateway(config, llm: FakeOpenAI, tg: FakeTelegram, tmp_path: Path) -> None:
    llm.fallback = lambda body: reply("ok")
    metrics_url = f"http://{config.gateway.metrics.listen}"
    async with running_gateway(config, with_services=True):
        for n in range(3):
            tg.push_text(ALICE, ALICE, f"message {n}")
        await tg.wait_sent(3, timeout=10)
        status, text = await get(metrics_url + "/metrics")
        assert status == 200 and 'nanobot_replies_sent_total{channel="telegram",worker="w-test"} 3.0' in text
        assert 'nanobot_turn_seconds_count{mode="tools",worker="w-test"} 3.0' in text
        assert 'nanobot_model_calls_total{model="fake-model",outcome="ok",provider="openai",worker="w-test"} 3.0' in text
        assert 'nanobot_channel_up{channel="telegram",worker="w-test"} 1.0' in text
        assert "42" not in "".join(line.split(" ")[0] for line in text.splitlines() if line.startswith("nanobot_"))
        assert "message 0" not in text
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "nanobot", "static_configs": [{"targets": [config.gateway.metrics.listen]}]}]}))
        server = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tempfile.mkdtemp(dir=tmp_path)}",
                                   f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            value = None
            for _ in range(150):
                try:
                    _, answer = await get(f"http://127.0.0.1:{port}/api/v1/query?query=nanobot_replies_sent_total")
                    result = json.loads(answer)["data"]["result"]
                    if result:
                        value = result[0]
                        break
                except (aiohttp.ClientError, KeyError, ValueError):
                    pass
                await asyncio.sleep(0.2)
        finally:
            server.terminate()
            server.wait(10)
    assert value is not None, "Prometheus never scraped the gateway"
    assert value["metric"]["channel"] == "telegram" and value["metric"]["worker"] == "w-test"
    assert value["value"][1] == "3"


async def test_readyz_follows_the_database(config, pg_server: str, pg_url: str) -> None:
    config.database.url = pg_url
    base = f"http://{config.gateway.metrics.listen}"
    async with running_gateway(config, with_services=True):
        assert (await get(base + "/healthz"))[0] == 200
        assert (await get(base + "/readyz"))[0] == 200
        await _outage(pg_server, pg_url, away=True)
        try:
            status, body = await get(base + "/readyz")
            assert status == 503 and json.loads(body)["reasons"][0].startswith("store: "), body
            assert (await get(base + "/healthz"))[0] == 200  # the process still answers
        finally:
            await _outage(pg_server, pg_url, away=False)
        for _ in range(100):
            status, body = await get(base + "/readyz")
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200, body


async def test_the_api_listener_answers_probes_without_a_key(config) -> None:
    config.gateway.metrics.enabled = False
    config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    async with running_gateway(config, with_services=True):
        status, body = await get(f"http://{config.gateway.api.listen}/readyz")
        assert status == 200 and json.loads(body) == {"status": "ready", "reasons": []}
        assert (await get(f"http://{config.gateway.api.listen}/healthz"))[0] == 200


async def test_the_start_log_names_the_page_and_the_metrics_listener(config, caplog) -> None:
    config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
    caplog.set_level("INFO")
    async with running_gateway(config, with_services=True):
        said = [r.getMessage() for r in caplog.records]
    api, metrics = config.gateway.api.listen, config.gateway.metrics.listen
    assert f"API on http://{api}/v1, the web page on http://{api}/" in said
    assert f"metrics on http://{metrics}/metrics, health probes on /healthz and /readyz" in said


async def test_a_code_mode_turn_is_one_trace(llm: FakeOpenAI, workspace: Path) -> None:
    """turn > model calls and a sandbox run > the tool the program called; log lines carry the trace id."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nanobot import logs, tracing
    from nanobot.runtime import open_runtime
    from tests.helpers import config_for

    (workspace / "a.txt").write_text("hello")
    exporter = InMemorySpanExporter()
    assert tracing.setup(exporter)
    try:
        llm.script(reply("```python\nprint(read_file('a.txt'))\n```"), reply("It says hello."))
        async with open_runtime(config_for(llm.base_url, workspace, mode="code")) as rt:
            with tracing.span("outside"):
                seen_trace = logs.current_trace()
            assert await rt.agent.handle("cli:t", "what does a.txt say?") == "It says hello."
    finally:
        tracing.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans() if s.name != "outside"}
    turn, sandbox, tool = spans["nanobot.turn"], spans["nanobot.sandbox"], spans["nanobot.tool"]
    calls = [s for s in exporter.get_finished_spans() if s.name == "nanobot.model_call"]
    assert len(calls) == 2 and all(c.parent.span_id == turn.context.span_id for c in calls)
    assert calls[0].attributes["model"] == "fake-model" and calls[0].attributes["prompt_tokens"] == 10
    assert sandbox.parent.span_id == turn.context.span_id and tool.parent.span_id == sandbox.context.span_id
    assert tool.attributes["tool"] == "read_file" and turn.parent is None
    assert seen_trace and len(seen_trace) == 32


def test_without_an_endpoint_nothing_of_opentelemetry_is_imported(home: Path, workspace: Path) -> None:
    import os
    import sys

    probe = ("import sys, asyncio\nfrom nanobot import tracing\nassert not tracing.setup()\n"
             "import nanobot.gateway.app, nanobot.agent.loop\n"
             "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


async def test_json_logs_name_the_worker_and_the_chat(home: Path, workspace: Path, llm: FakeOpenAI,
                                                      tg: FakeTelegram) -> None:
    import os

    (home / "config.json").write_text(json.dumps({
        "agents": {"defaults": {"workspace": str(workspace), "model": "m", "executionMode": "tools"}},
        "providers": {"openai": {"apiKey": "k", "apiBase": llm.base_url}},
        "channels": {"telegram": {"enabled": True, "token": tg.token, "apiBase": tg.api_base, "allowFrom": ["42"],
                                  "streaming": False}},
        "gateway": {"heartbeat": {"enabled": False}, "logFormat": "json", "workerId": "w-json"}}))
    llm.fallback = lambda body: reply("ok")
    proc = await cli_zygote.start(["-v", "gateway"], {**os.environ, "NANOBOT_HOME": str(home)},
                                  stderr=asyncio.subprocess.PIPE)
    try:
        tg.push_text(666, 666, "let me in", username="mal\u202elory\x9b2J")  # a name the log shows
        tg.push_text(ALICE, ALICE, "hi")
        await tg.wait_until(lambda: any(m["text"] == "ok" for m in tg.sent), 30)
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert "mal\\u202elory\\u009b2J" in err.decode() and not {"\u202e", "\x9b"} & set(err.decode())  # not obeyed
    entries = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    turn = next(e for e in entries if e["message"].startswith("turn telegram:42"))
    assert turn["chat"] == "telegram:42" and turn["worker"] == "w-json" and turn["level"] == "INFO"
    assert all({"time", "level", "logger", "message", "worker"} <= set(e) for e in entries)
    assert tg.token not in err.decode()


async def test_a_backup_taken_under_load_restores_with_equal_counts(config, llm: FakeOpenAI, tg: FakeTelegram,
                                                                    home: Path, workspace: Path,
                                                                    tmp_path: Path) -> None:
    """Taken while the gateway answers a stream of messages: everything answered before it began
    is in the restored home, and the restored counts equal the backup's manifest."""
    from tests.test_cli import nanobot

    config.gateway.metrics.enabled = False
    (home / "config.json").write_text(json.dumps({"agents": {"defaults": {"workspace": "workspace"}}}))
    (home / "workspace").mkdir()
    (home / "workspace" / "notes.md").write_text("kept")  # the workspace the home's config names
    llm.fallback = lambda body: reply("re: " + body["messages"][-1]["content"])
    archive = tmp_path / "nanobot-backup.tar.gz"
    async with running_gateway(config, with_services=True) as gateway:
        for n in range(20):
            tg.push_text(ALICE, ALICE, f"before {n}")
        await tg.wait_sent(20, timeout=20)
        answered_before = [m["text"] for m in tg.sent]
        for n in range(20):  # the load goes on while the backup runs
            tg.push_text(ALICE, ALICE, f"during {n}")
        code, out, err = await nanobot("backup", str(archive), "--with-workspace", home=home)
        await tg.wait_sent(40, timeout=20)
        await gateway.runtime.sessions.flush()
    assert code == 0 and "history records in 1 chat, and the workspace" in out, err
    assert archive.stat().st_mode & 0o777 == 0o600
    fresh = tmp_path / "fresh-home"
    code, out, err = await nanobot("restore", str(archive), home=fresh)
    assert code == 0 and "counts checked" in out, err
    history = (fresh / "sessions" / "telegram_42.jsonl").read_text()
    assert all(text in history for text in answered_before)
    assert (fresh / "workspace" / "notes.md").read_text() == "kept"
    code, _, err = await nanobot("restore", str(archive), home=fresh)  # not over a home in use
    assert code == 1 and "holds a nanobot already" in err


async def test_on_postgresql_backup_points_to_pg_dump(home: Path, pg_url: str) -> None:
    from tests.test_cli import nanobot

    (home / "config.json").write_text(json.dumps({"database": {"url": pg_url}}))
    code, _, err = await nanobot("backup", str(home / "x.tar.gz"), home=home)
    assert code == 2 and "pg_dump" in err and "x.tar.gz" not in [p.name for p in home.iterdir()]
