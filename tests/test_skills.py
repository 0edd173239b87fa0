"""Skills: discovery, the prompt section, read_skill, and the shipped helpers on real Monty."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from nanobot.config import CodeRuntime
from nanobot.runtime import open_runtime
from nanobot.sandbox import Sandbox
from nanobot.skills import builtin_skills_dir, find_skill, list_skills, skill_helpers_code, skills_section
from nanobot.tools.paths import FileScope
from tests.fakes.openai_server import FakeOpenAI, reply, tool_call
from tests.helpers import config_for

SHIPPED = {"weather", "summarize", "cron", "skill-creator"}


def write_skill(root: Path, folder: str, front: str, body: str = "# Body\nDo things.\n",
                helpers: str | None = None) -> Path:
    d = root / folder
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\n{front}\n---\n{body}", encoding="utf-8")
    if helpers is not None:
        (d / "helpers.py").write_text(helpers, encoding="utf-8")
    return d


@pytest.fixture
def builtin(tmp_path: Path) -> Path:
    root = tmp_path / "builtin"
    write_skill(root, "alpha", "name: alpha\ndescription: Built-in alpha.")
    write_skill(root, "shared", "name: shared\ndescription: Built-in version.")
    return root


# ---------------------------------------------------------------------------------- listing


def test_builtin_and_workspace_skills_workspace_wins(builtin: Path, workspace: Path) -> None:
    write_skill(workspace / "skills", "shared", "name: shared\ndescription: My own version.")
    write_skill(workspace / "skills", "mine", "name: mine\ndescription: |\n  Spans\n  two lines.")
    skills = {s.name: s for s in list_skills(workspace, builtin)}
    assert sorted(skills) == ["alpha", "mine", "shared"]
    assert skills["alpha"].builtin and not skills["shared"].builtin
    assert skills["shared"].description == "My own version."
    assert skills["mine"].description == "Spans two lines."
    assert find_skill("shared", workspace, builtin).directory == (workspace / "skills" / "shared").resolve()


@pytest.mark.parametrize("front", [
    "name: [unclosed\ndescription: x",           # YAML syntax error
    "just a string",                            # not a mapping
    "name: bad\n",                              # no description
    "description: no name",                     # no name
    "name: other\ndescription: name differs from the folder",
    "name: bad\ndescription: x\nrequires: [gh]",  # requires not a mapping
    "name: bad\ndescription: x\nrequires: {bins: gh: x}",
    "name: bad\ndescription: x\nrequires: {env: [1, 2]}",
])
def test_malformed_front_matter_is_skipped_with_a_warning(builtin: Path, workspace: Path, front: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    write_skill(workspace / "skills", "bad", front)
    with caplog.at_level(logging.WARNING, logger="nanobot.skills"):
        names = [s.name for s in list_skills(workspace, builtin)]
        section = skills_section(workspace, builtin)
    assert names == ["alpha", "shared"]
    assert "bad" not in section and "- alpha:" in section
    assert "skill 'bad' skipped" in caplog.text


def test_missing_front_matter_and_unreadable_file_are_skipped(builtin: Path, workspace: Path) -> None:
    d = workspace / "skills" / "plain"
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text("# No front matter here\n")
    write_skill(workspace / "skills", "open", "name: open\ndescription: x\n---never closed")
    (workspace / "skills" / "open" / "SKILL.md").write_text("---\nname: open\ndescription: x\n")
    (workspace / "skills" / "binary").mkdir()
    (workspace / "skills" / "binary" / "SKILL.md").write_bytes(b"\xff\xfe\x00bad")
    (workspace / "skills" / "nofile").mkdir()
    assert [s.name for s in list_skills(workspace, builtin)] == ["alpha", "shared"]


def test_requirements_met_and_unmet(builtin: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NB_TEST_TOKEN", "x")
    monkeypatch.delenv("NB_TEST_ABSENT", raising=False)
    ws = workspace / "skills"
    write_skill(ws, "ok", "name: ok\ndescription: Needs sh.\nrequires: {bins: [sh], env: [NB_TEST_TOKEN]}")
    write_skill(ws, "nobin", "name: nobin\ndescription: Needs a tool.\nrequires:\n  bins: [sh, no-such-binary-xyz]")
    write_skill(ws, "noenv", "name: noenv\ndescription: Needs a key.\nrequires: {env: [NB_TEST_ABSENT]}")
    skills = {s.name: s for s in list_skills(workspace, builtin)}
    assert skills["ok"].missing() == []
    assert skills["nobin"].missing() == ["no-such-binary-xyz"]
    assert skills["noenv"].missing() == ["$NB_TEST_ABSENT"]
    section = skills_section(workspace, builtin)
    assert "- ok: Needs sh. [skills/ok/SKILL.md]" in section
    assert "- nobin: Needs a tool. [skills/nobin/SKILL.md; unavailable, missing: no-such-binary-xyz]" in section
    assert "- noenv: Needs a key. [skills/noenv/SKILL.md; unavailable, missing: $NB_TEST_ABSENT]" in section
    monkeypatch.setenv("NB_TEST_ABSENT", "now set")
    assert "- noenv: Needs a key. [skills/noenv/SKILL.md]" in skills_section(workspace, builtin)


def test_prompt_section_is_one_line_per_skill_and_says_how_to_read(builtin: Path, workspace: Path) -> None:
    write_skill(workspace / "skills", "tool", "name: tool\ndescription: " + "long " * 80, helpers="def f():\n    return 1\n")
    section = skills_section(workspace, builtin)
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert [line.split(":")[0] for line in lines] == ["- alpha", "- shared", "- tool"]
    assert lines[0] == "- alpha: Built-in alpha. [built-in]"
    assert lines[2].endswith("… [skills/tool/SKILL.md; helpers]") and len(lines[2]) < 260
    assert "read_skill(name[, file])" in section and "use_skill(name)" in section


def test_empty_section_without_skills(tmp_path: Path, workspace: Path) -> None:
    assert skills_section(workspace, tmp_path / "none") == ""


def test_shipped_skills_parse_and_are_available(workspace: Path) -> None:
    skills = {s.name: s for s in list_skills(workspace)}
    assert SHIPPED <= set(skills)
    for name in SHIPPED:
        skill = skills[name]
        assert skill.builtin and skill.missing() == [] and 20 < len(skill.description) < 200
    assert skills["weather"].has_helpers and skills["summarize"].has_helpers and not skills["cron"].has_helpers
    assert "0 and 7 are Sunday" in (builtin_skills_dir() / "cron" / "SKILL.md").read_text()


def test_workspace_skill_symlinked_outside_is_ignored(builtin: Path, workspace: Path, tmp_path: Path) -> None:
    outside = write_skill(tmp_path / "elsewhere", "sneaky", "name: sneaky\ndescription: outside")
    (workspace / "skills").mkdir()
    (workspace / "skills" / "sneaky").symlink_to(outside)
    assert "sneaky" not in {s.name for s in list_skills(workspace, builtin)}


# ---------------------------------------------------------------------------------- helpers code


def test_skill_helpers_code(workspace: Path, builtin: Path, home: Path) -> None:
    scope = FileScope(workspace, home)
    assert "def weather(" in skill_helpers_code("weather", scope)
    assert "def chunk_text(" in skill_helpers_code("summarize", scope)
    with pytest.raises(ValueError, match="no helpers.py"):
        skill_helpers_code("cron", scope)
    with pytest.raises(ValueError, match="no skill named 'nope'.*weather"):
        skill_helpers_code("nope", scope)
    write_skill(workspace / "skills", "alpha", "name: alpha\ndescription: mine", helpers="X = 1\n")
    assert skill_helpers_code("alpha", scope, builtin) == "X = 1\n"


# ---------------------------------------------------------------------------------- read_skill, end to end


async def test_prompt_lists_skills_and_read_skill_reads_builtin_and_workspace(llm: FakeOpenAI,
                                                                             workspace: Path) -> None:
    write_skill(workspace / "skills", "notes", "name: notes\ndescription: Keep notes tidy.", body="Use notes/.\n")
    llm.script(tool_call("read_skill", {"name": "weather"}), tool_call("read_skill", {"name": "notes"}),
               tool_call("read_skill", {"name": "weather", "file": "helpers.py"}),
               tool_call("read_skill", {"name": "weather", "file": "../cron/SKILL.md"}),
               tool_call("read_skill", {"name": "weather", "file": "nope.md"}),
               tool_call("read_skill", {"name": "missing"}), reply("done"))
    async with open_runtime(config_for(llm.base_url, workspace)) as rt:
        assert await rt.agent.handle("cli:s", "weather?") == "done"
    system = llm.chat_requests[0]["messages"][0]["content"]
    assert "# Skills" in system and "read_skill(name[, file])" in system
    assert "- weather: " in system and "[built-in]" in system  # tools mode: no code-only hints
    assert "use_skill" not in system and "llm_query" not in system and "; helpers]" not in system
    assert "- notes: Keep notes tidy. [skills/notes/SKILL.md]" in system
    assert "read_skill" in {t["function"]["name"] for t in llm.chat_requests[0]["tools"]}
    results = [r["messages"][-1]["content"] for r in llm.chat_requests[1:]]
    assert results[0].startswith("[You act with tool calls") and "\n\n---\nname: weather" in results[0]
    assert "a scheduled job's program goes, as it is, in schedule_cron's `code` argument" in results[0]
    assert "Use notes/." in results[1]
    assert "def parse_wttr(" in results[2]
    assert results[3].startswith("Error: PermissionError") and "outside the skill" in results[3]
    assert results[4].startswith("Error: FileNotFoundError") and "SKILL.md" in results[4]
    assert results[5].startswith("Error: ValueError") and "available skills" in results[5]


# ---------------------------------------------------------------------------------- helpers on real Monty

WTTR_J1 = {
    "current_condition": [{
        "FeelsLikeC": "6", "temp_C": "9", "humidity": "81", "localObsDateTime": "2026-11-22 01:30 PM",
        "weatherDesc": [{"value": "Partly cloudy"}], "windspeedKmph": "19", "winddir16Point": "WSW",
        "precipMM": "0.1"}],
    "nearest_area": [{"areaName": [{"value": "Zürich"}], "country": [{"value": "Switzerland"}]}],
    "request": [{"query": "Zurich", "type": "City"}],
    "weather": [
        {"date": "2026-11-22", "maxtempC": "10", "mintempC": "4", "sunHour": "3.2",
         "hourly": [{"time": "900", "chanceofrain": "10", "weatherDesc": [{"value": "Mist"}]},
                    {"time": "1200", "chanceofrain": "20", "weatherDesc": [{"value": "Cloudy"}]},
                    {"time": "1800", "chanceofrain": "70", "weatherDesc": [{"value": "Light rain"}]}]},
        {"date": "2026-11-23", "maxtempC": "7", "mintempC": "1", "sunHour": "6.0",
         "hourly": [{"time": "1200", "chanceofrain": "0", "weatherDesc": [{"value": "Sunny"}]}]},
    ],
}
GEOCODE = {"results": [{"name": "Lisbon", "country": "Portugal", "latitude": 38.72, "longitude": -9.14}]}
OPEN_METEO = {"latitude": 38.72, "longitude": -9.14,
              "current": {"time": "2026-11-22T13:00", "temperature_2m": 17.4, "apparent_temperature": 16.9,
                          "relative_humidity_2m": 70, "weather_code": 3, "wind_speed_10m": 12.1, "precipitation": 0},
              "daily": {"time": ["2026-11-22", "2026-11-23"], "temperature_2m_max": [18.0, 19.5],
                        "temperature_2m_min": [12.1, 13.0], "precipitation_probability_max": [10, 80],
                        "weather_code": [3, 61]}}


class Host:
    """The functions a program may call, with canned answers and a call log."""

    def __init__(self, **functions: Any) -> None:
        self.functions = functions
        self.calls: list[tuple[str, tuple]] = []

    async def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        self.calls.append((name, args))
        return self.functions[name](*args, **kwargs)


@pytest.fixture
async def sandbox():
    box = Sandbox(max_live_sessions=2, spare_workers=1)
    yield box
    await box.close()


async def run_with_helpers(box: Sandbox, skill: str, host: Host, *programs: str) -> list[Any]:
    """Load the skill's helpers into a session (as use_skill does), then run each program."""
    limits = CodeRuntime(max_execution_ms=5000)
    key = f"test:{skill}"
    names = set(host.functions)
    loaded = await box.run(skill_helpers_code(skill, FileScope(Path("/nonexistent"), Path("/nonexistent-home"))), session_key=key, call=host.call,
                           function_names=names, limits=limits)
    assert loaded.ok, loaded.error
    results = []
    for program in programs:
        result = await box.run(program, session_key=key, call=host.call, function_names=names, limits=limits)
        assert result.ok, result.error
        results.append(result)
    return results


def fetched(url: str, body: Any) -> str:
    return f"URL: {url}\n\n{json.dumps(body, indent=2)}"  # what web_fetch returns


async def test_weather_helpers_parse_wttr_in_monty(sandbox: Sandbox) -> None:
    host = Host(web_fetch=lambda url: fetched(url, WTTR_J1))
    url, parsed, text = await run_with_helpers(
        sandbox, "weather", host,
        'weather_url("Zürich Hbf")',
        'import json\nprint(json.dumps(weather("Zürich")))',
        'print(weather_text("Zürich"))')
    assert url.value == "'https://wttr.in/Z%C3%BCrich+Hbf?format=j1'"
    assert json.loads(parsed.output) == {
        "location": "Zürich, Switzerland", "observed": "2026-11-22 01:30 PM",
        "current": {"temp_c": 9.0, "feels_c": 6.0, "desc": "Partly cloudy", "humidity": 81.0, "wind_kmh": 19.0,
                    "wind_dir": "WSW", "precip_mm": 0.1},
        "days": [{"date": "2026-11-22", "min_c": 4.0, "max_c": 10.0, "desc": "Cloudy", "rain_chance": 70.0,
                  "sun_hours": 3.2},
                 {"date": "2026-11-23", "min_c": 1.0, "max_c": 7.0, "desc": "Sunny", "rain_chance": 0.0,
                  "sun_hours": 6.0}]}
    assert text.output.splitlines() == [
        "Zürich, Switzerland: Partly cloudy, 9°C (feels 6°C), wind 19 km/h",
        "2026-11-22: 4°C to 10°C, Cloudy, rain 70%",
        "2026-11-23: 1°C to 7°C, Sunny, rain 0%",
    ]
    assert all(name == "web_fetch" and "wttr.in/Z%C3%BCrich?format=j1" in args[0] for name, args in host.calls)


async def test_weather_falls_back_to_open_meteo(sandbox: Sandbox) -> None:
    def web_fetch(url: str) -> str:
        if "wttr.in" in url:
            return "URL: x\n\n{\"current_condition\": [{\"temp_C\": \"9\"\n\n[truncated: 9 more characters not shown]"
        return fetched(url, GEOCODE if "geocoding" in url else OPEN_METEO)

    host = Host(web_fetch=web_fetch)
    [result] = await run_with_helpers(sandbox, "weather", host, 'w = weather("Lisbon")\nprint(format_weather(w))\nw')
    assert result.output.splitlines()[1:] == [
        "Lisbon, Portugal: overcast, 17°C (feels 17°C), wind 12 km/h",
        "2026-11-22: 12°C to 18°C, overcast, rain 10%",
        "2026-11-23: 13°C to 20°C, light rain, rain 80%",
    ]
    assert result.output.startswith("wttr.in failed")
    urls = [args[0] for _, args in host.calls]
    assert "name=Lisbon" in urls[1] and "latitude=38.72&longitude=-9.14" in urls[2]


async def test_summarize_helpers_chunk_and_map_reduce_in_monty(sandbox: Sandbox) -> None:
    prompts: list[str] = []

    def llm_query(prompt: str) -> str:
        prompts.append(prompt)
        return f"summary {len(prompts)}"

    paragraph = "This sentence is about a topic. " * 20 + "\n\n"
    host = Host(llm_query=llm_query)
    chunks, short, long = await run_with_helpers(
        sandbox, "summarize", host,
        f'text = {paragraph!r} * 30\nparts = chunk_text(text, 2000, 100)\n'
        '[len(parts), max([len(p) for p in parts]), "".join(parts).count("topic") > text.count("topic"), '
        'all([p.endswith((" ", "\\n")) for p in parts[:-1]]), parts[0][-100:] in parts[1]]',
        'summarize_text("A short note.", "one line")',
        'summarize_text(text, "three bullets", 8000)')
    count, longest, overlaps, clean_ends, carried = json.loads(chunks.value.replace("True", "true")
                                                                .replace("False", "false"))
    assert count > 10 and longest <= 2000 and overlaps and clean_ends and carried
    assert short.value == "'summary 1'" and "A short note." in prompts[0] and "one line" in prompts[0]
    assert long.value == f"'summary {len(prompts)}'" and len(prompts) == 1 + 3 + 1  # short + 3 chunks + reduce
    assert "part 1 of 3" in prompts[1] and "three bullets" in prompts[-1] and "summary 2" in prompts[-1]


async def test_chunk_text_edge_cases_in_monty(sandbox: Sandbox) -> None:
    [result] = await run_with_helpers(
        sandbox, "summarize", Host(),
        'out = [chunk_text(""), chunk_text("abc"), chunk_text("x" * 25, 10, 0)]\n'
        'try:\n    chunk_text("abc", 10, 8)\nexcept ValueError:\n    out.append("refused")\nout')
    assert result.value == "[[], ['abc'], ['xxxxxxxxxx', 'xxxxxxxxxx', 'xxxxx'], 'refused']"


async def test_cron_skill_example_jobs_run_in_monty(sandbox: Sandbox) -> None:
    text = (builtin_skills_dir() / "cron" / "SKILL.md").read_text()
    jobs = re.findall(r"job = '''\n(.*?)'''", text, re.S)
    assert len(jobs) == 2
    files: dict[str, str] = {}

    def read_file(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    def write_file(path: str, content: str) -> str:
        files[path] = content
        return f"Wrote {len(content)} bytes to {path}"

    forecast = {"daily": {"precipitation_probability_max": [80]}}
    host = Host(web_fetch=lambda url: fetched(url, forecast) if "open-meteo" in url else "URL: x\n\nnews v1",
                read_file=read_file, write_file=write_file)
    limits = CodeRuntime(max_execution_ms=5000, persist_state=False)
    outputs = []
    for job in [jobs[0], jobs[1], jobs[1]]:
        result = await sandbox.run(job, session_key="cron", call=host.call, function_names=set(host.functions),
                                   limits=limits)
        assert result.ok, result.error
        outputs.append(result.to_model_text())
    assert outputs[0] == "Take an umbrella: 80% chance of rain in Berlin today."
    assert outputs[1] == outputs[2] == "(no output)"  # first run records state; unchanged page: quiet
    host.functions["web_fetch"] = lambda url: "URL: x\n\nnews v2"
    result = await sandbox.run(jobs[1], session_key="cron", call=host.call, function_names=set(host.functions),
                               limits=limits)
    assert result.to_model_text() == "The page changed: https://example.org/news"
