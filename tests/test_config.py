"""Config loading: camelCase file, env overrides, one clear line for every mistake, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanobot.config import ConfigError, load_config


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_defaults_work_without_a_file(home: Path) -> None:
    config, path = load_config()
    assert path == home / "config.json"
    assert config.agents.defaults.execution_mode == "code"
    assert config.channels.telegram.allow_from == []


def test_camel_case_file_is_read(tmp_path: Path) -> None:
    path = write(tmp_path / "c.json", {"agents": {"defaults": {"maxTokens": 77, "codeRuntime": {"maxToolCalls": 3},
                                                               "provider": "local"},
                                                  "overrides": {"telegram:1": {"executionMode": "tools"}}},
                                       "providers": {"local": {"apiBase": "http://127.0.0.1:1/v1"}}})
    config, _ = load_config(path)
    assert config.agents.defaults.max_tokens == 77
    assert config.agents.defaults.code_runtime.max_tool_calls == 3
    assert config.agent_for("telegram:1").execution_mode == "tools"
    assert config.agent_for("telegram:2").execution_mode == "code"
    assert config.providers["local"].api_base == "http://127.0.0.1:1/v1"


def test_env_beats_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "c.json", {"agents": {"defaults": {"model": "from-file", "maxTokens": 5}},
                                       "providers": {"openai": {"apiKey": "file-key", "apiBase": "http://x/v1"}}})
    monkeypatch.setenv("NANOBOT_AGENTS__DEFAULTS__MODEL", "from-env")
    monkeypatch.setenv("NANOBOT_PROVIDERS__OPENAI__API_KEY", "env-key")
    config, _ = load_config(path)
    assert config.agents.defaults.model == "from-env"
    assert config.providers["openai"].api_key == "env-key"
    # untouched keys of the same sections still come from the file
    assert config.agents.defaults.max_tokens == 5
    assert config.providers["openai"].api_base == "http://x/v1"


def test_config_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "env.json", {"agents": {"defaults": {"model": "m1"}}})
    monkeypatch.setenv("NANOBOT_CONFIG", str(path))
    assert load_config()[0].agents.defaults.model == "m1"
    assert load_config(write(tmp_path / "flag.json", {"agents": {"defaults": {"model": "m2"}}}))[0].agents.defaults.model == "m2"


@pytest.mark.parametrize("data, expected", [
    ({"agents": {"defaults": {"modle": "x"}}}, "unknown key 'agents.defaults.modle'"),
    ({"agents": {"defaults": {"maxTokens": "lots"}}}, "invalid value for 'agents.defaults.maxTokens'"),
    ({"agents": {"defaults": {"executionMode": "magic"}}}, "invalid value for 'agents.defaults.executionMode'"),
    ({"channels": {"telegram": {"enabled": "maybe"}}}, "invalid value for 'channels.telegram.enabled'"),
    ({"channels": {"telegram": {"enabled": "yes"}}}, "invalid value for 'channels.telegram.enabled'"),
    ({"agents": {"defaults": {"temperature": True}}}, "invalid value for 'agents.defaults.temperature'"),
    ({"providers": {"openai": {"apiBase": "localhost:11434/v1"}}},
     "invalid value for 'providers.openai.apiBase': 'localhost:11434/v1' is not a URL: it starts with https:// or "
     "http:// (http://localhost:11434/v1?)"),
    ({"providers": {"openai": {"extraBody": {"reasoning_effort": "low", "max_tokens": 9}}}},
     "invalid value for 'providers.openai.extraBody': max_tokens: set by nanobot itself"),
    ({"channels": {"telegram": {"allowFrom": ["1"], "allow_from": ["2"]}}},
     "unknown key 'channels.telegram.allow_from' (keys are camelCase: allowFrom)"),
    ({"agents": {"defaults": {"provider": "nope"}}},
     "invalid value for 'agents.defaults.provider': names provider 'nope', which is not in providers (openai)"),
    ({"agents": {"defaults": {"fallbacks": [{"provider": "x", "model": "m"}]}}},
     "invalid value for 'agents.defaults.fallbacks.0.provider': names provider 'x'"),
    ({"channels": {"telegram": {"enabled": True, "token": ""}}},
     "invalid value for 'channels.telegram.token': is empty while channels.telegram.enabled is true"),
    ({"channels": {"slack": {"enabled": True, "appToken": "xapp-1"}}},
     "invalid value for 'channels.slack.botToken': is empty while channels.slack.enabled is true"),
    ({"channels": {"slack": {"enabled": True, "botToken": "xoxb-1"}}},
     "invalid value for 'channels.slack.appToken': is empty and there is no events section"),
    ({"channels": {"slack": {"enabled": True, "botToken": "xoxb-1", "events": {"listen": "127.0.0.1:3000"}}}},
     "invalid value for 'channels.slack.signingSecret': is empty while events is set"),
    ({"channels": {"slack": {"groupPolicy": "everyone"}}}, "invalid value for 'channels.slack.groupPolicy'"),
    ({"channels": {"email": {"enabled": True, "address": "bot@example.org", "imap": {"host": "imap.example.org"}}}},
     "invalid value for 'channels.email.imap.username': is empty while channels.email.enabled is true"),
    ({"channels": {"email": {"imap": {"port": 0}}}}, "invalid value for 'channels.email.imap.port'"),
    ({"channels": {"telegram": {"proxy": "socks5://127.0.0.1:1080"}}}, "not an http:// or https:// proxy URL"),
    ({"channels": {"telegram": {"webhook": {"url": "https://bot.example.org/tg", "secretToken": "short"}}}},
     "invalid value for 'channels.telegram.webhook.secretToken'"),
    ({"channels": {"telegram": {"webhook": {"url": "bot.example.org/tg", "secretToken": "x" * 16}}}},
     "invalid value for 'channels.telegram.webhook.url'"),
    ({"channels": {"telegram": {"webhook": {"url": "https://b.example.org/tg", "secretToken": "x" * 16,
                                            "listen": "8443"}}}}, "invalid value for 'channels.telegram.webhook.listen'"),
    ({"gateway": {"failoverSeconds": 1}}, "invalid value for 'gateway.failoverSeconds'"),
    ({"agents": {"overrides": {"telegram:5": {"mcpServers": ["notse"]}}}},
     "invalid value for 'agents.overrides.telegram:5.mcpServers': names MCP server 'notse', which is not in "
     "tools.mcpServers (none)"),
    ({"gateway": {"heartbeat": {"to": "telegram:42"}}},
     "invalid value for 'gateway.heartbeat.to': names channel 'telegram', which is not enabled (enabled: cli, api)"),
    ({"agents": {"overrides": {"telegram_123": {"trust": "member"}}}},
     "invalid value for 'agents.overrides': 'telegram_123' names no chat: a key is CHANNEL:CHAT_ID"),
    # never matching a sender, silently: an id the platform never names
    ({"channels": {"whatsapp": {"allowFrom": ["bob"]}}},
     "invalid value for 'channels.whatsapp.allowFrom': 'bob' is not a phone number"),
    ({"channels": {"signal": {"owners": ["15550002222"]}}},
     "invalid value for 'channels.signal.owners': '15550002222' is not a phone number with its country code"),
    ({"channels": {"signal": {"account": "15550001111"}}},
     "invalid value for 'channels.signal.account': '15550001111' is not a phone number with its country code"),
    ({"channels": {"signal": {"account": "+1 555 000 1111", "owners": ["+15550001111"]}}},  # linked to the owner's own
     "invalid value for 'channels.signal.account': +15550001111 is also in allowFrom or owners: the bot never reads"),
    ({"channels": {"email": {"address": "Ada@example.org", "allowFrom": ["ada@example.org"]}}},  # the owner's mailbox
     "invalid value for 'channels.email.address': ada@example.org is also in allowFrom or owners"),
    ({"channels": {"matrix": {"userId": "@ada:example.org", "owners": ["@ada:example.org"]}}},  # the owner's account
     "invalid value for 'channels.matrix.userId': @ada:example.org is also in allowFrom or owners"),
    ({"channels": {"slack": {"allowFrom": ["@ada"]}}}, "invalid value for 'channels.slack.allowFrom': '@ada' is not a Slack user id"),
    ({"channels": {"slack": {"groupAllowFrom": ["#general"]}}},
     "invalid value for 'channels.slack.groupAllowFrom': '#general' is not a Slack channel id"),
    ({"channels": {"telegram": {"owners": ["+15550002222"]}}}, "'channels.telegram.owners': '+15550002222' is not a user id"),
    ({"channels": {"discord": {"allowFrom": ["ada#1234"]}}}, "'channels.discord.allowFrom': 'ada#1234' is not a user id"),
    ({"channels": {"matrix": {"owners": ["ada"]}}}, "invalid value for 'channels.matrix.owners': 'ada' is not a Matrix user id"),
    # a key, a token or the chats never cross the network in plain text
    ({"channels": {"matrix": {"homeserver": "http://matrix.example.org:8008"}}},
     "'channels.matrix.homeserver': 'http://matrix.example.org:8008' is plain http: keys and messages sent there"),
    ({"providers": {"openai": {"apiBase": "http://8.8.8.8:8000/v1"}}}, "'providers.openai.apiBase': "),
    ({"channels": {"signal": {"rpcUrl": "http://signal.example.org:8080"}}}, "'channels.signal.rpcUrl': "),
    ({"channels": {"whatsapp": {"apiBase": "http://graph.facebook.com/v21.0"}}}, "'channels.whatsapp.apiBase': "),
    ({"channels": {"discord": {"gatewayUrl": "ws://gateway.discord.gg"}}}, "'channels.discord.gatewayUrl': "),
    ({"tools": {"mcpServers": {"notes": {"url": "http://mcp.example.com/mcp"}}}}, "'tools.mcpServers.notes.url': "),
    ({"channels": {"email": {"imap": {"host": "imap.example.org", "tls": False}}}},
     "'channels.email.imap.tls': false: the password and every mail would cross the network to imap.example.org"),
    ({"channels": {"email": {"smtp": {"host": "smtp.example.org", "starttls": False}}}}, "'channels.email.smtp.starttls': "),
    ({"database": {"url": "postgresql://nb:CANARY@db.example.com:5432/nb"}},
     "'database.url': db.example.com is not on this machine or a private network, and without ?sslmode=verify-full"),
    ('{"agents": {', "invalid JSON: expecting property name enclosed in double quotes at line 1, column 13"),
    ('{"agents": "x', "invalid JSON: unterminated string starting at line 1, column 12"),
    # What hand editing most often leaves, said: a comma after the last item, a comment.
    ('{\n  "agents": {"defaults": {"model": "x",}},\n}', "line 2, column 40 (JSON allows no comma after the last item)"),
    ('{"tools": {"x": [1, 2, ]}}', "line 1, column 24 (JSON allows no comma after the last item)"),
    ('{\n  // the model\n  "agents": {}}', "line 2, column 3 (JSON has no comments)"),
    ("[1, 2]", "top level must be a JSON object"),
])
def test_bad_config_is_one_clear_error(tmp_path: Path, data, expected: str) -> None:
    path = write(tmp_path / "bad.json", data)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_ids_are_read_as_the_platforms_name_senders(tmp_path: Path) -> None:
    """Written as people write them, compared as the platform gives them: "Ada@Example.org" and
    "+1 555-000-2222" never matched a sender before."""
    config = load_config(write(tmp_path / "c.json", {"channels": {
        "email": {"allowFrom": ["Ada@Example.org"], "owners": ["Ada@Example.org"]}, "telegram": {"owners": [" 42 "]},
        "whatsapp": {"allowFrom": ["+1 555-000-2222", 15550003333, "*", " US.13491208655302741918"]},
        "signal": {"account": "+1 555 000 1111", "allowFrom": ["+1 (555) 000 2222", "A1B2C3D4-0000-1111-2222-333344445555"]}}}))[0]
    channels = config.channels
    assert channels.email.allow_from == channels.email.owners == ["ada@example.org"]
    assert channels.telegram.owners == ["42"]
    assert channels.whatsapp.allow_from == ["15550002222", "15550003333", "*", "US.13491208655302741918"]
    assert channels.signal.allow_from == ["+15550002222", "a1b2c3d4-0000-1111-2222-333344445555"]
    assert channels.signal.account == "+15550001111"


@pytest.mark.parametrize("server", ["http://127.0.0.1:8008", "http://localhost:11434/v1", "http://synapse:8008",
                                    "http://192.168.1.5:8008", "http://[fd00::5]:80", "http://100.101.102.103:8000",
                                    "http://gpu.tail1234.ts.net:8000", "http://nas.home.arpa", "https://matrix.example.org",
                                    "http://synapse.matrix.svc:8008", "http://host.docker.internal:11434/v1"])
def test_plain_http_may_go_to_this_machine_or_a_private_network(tmp_path: Path, server: str) -> None:
    config = load_config(write(tmp_path / "c.json", {
        "providers": {"openai": {"apiBase": server}}, "channels": {"matrix": {"homeserver": server},
                                                                  "email": {"imap": {"host": "127.0.0.1", "tls": False}}},
        "database": {"url": "postgresql://nb:pw@db.example.com/nb?sslmode=verify-full" if server.startswith("https")
                     else server.replace("http", "postgresql", 1)}}))[0]
    assert config.channels.matrix.homeserver == config.providers["openai"].api_base == server


def test_named_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.json")


def test_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.json", {"tools": {"restrictToWorkspac": False}})
    result = subprocess.run([sys.executable, "-m", "nanobot", "--config", str(path), "status"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tools.restrictToWorkspac" in lines[0] and str(path) in lines[0]


def _key_paths(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "overrides":
                continue
            yield from _key_paths(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def test_example_config_loads_and_shows_every_key() -> None:
    from nanobot.config import Config

    example = Path(__file__).resolve().parent.parent / "config.example.json"
    config, _ = load_config(example)
    documented = set(_key_paths(json.loads(example.read_text())))
    assert set(_key_paths(json.loads(Config().to_json()))) <= documented
    assert config.agents.overrides


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    """Notepad and other Windows editors may start a UTF-8 file with a byte-order mark."""
    path = tmp_path / "c.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"agents": {"defaults": {"model": "bom-model"}}}).encode())
    assert load_config(path)[0].agents.defaults.model == "bom-model"


def test_ids_written_as_numbers_are_ids(tmp_path: Path) -> None:
    path = write(tmp_path / "c.json", {"channels": {"telegram": {"allowFrom": [111, "bob"], "owners": [111]}}})
    config, _ = load_config(path)
    assert config.channels.telegram.allow_from == ["111", "bob"] and config.channels.telegram.owners == ["111"]


@pytest.mark.parametrize("name, value, expected", [
    ("NANOBOT_AGENTS__DEFAULTS__FALLBACKS", "x", "environment variable NANOBOT_AGENTS__DEFAULTS__FALLBACKS: invalid JSON"),
    ("NANOBOT_TOOLS__MCP_SERVERS", "{bad", "environment variable NANOBOT_TOOLS__MCP_SERVERS: invalid JSON"),
    ("NANOBOT_AGENTS__DEFAULTS__PROVIDER", "nope",
     "environment variable NANOBOT_AGENTS__DEFAULTS__PROVIDER: invalid value for 'agents.defaults.provider'"),
    # a section the file has not, turned on from the environment: named the file, which says nothing of it
    ("NANOBOT_CHANNELS__MATRIX__ENABLED", "true", "environment variable NANOBOT_CHANNELS__MATRIX__ENABLED: invalid "
     "value for 'channels.matrix.homeserver': is empty while channels.matrix.enabled is true"),
    ("NANOBOT_CHANNELS__EMAIL__ENABLED", "true", "environment variable NANOBOT_CHANNELS__EMAIL__ENABLED: invalid "
     "value for 'channels.email.address': is empty while channels.email.enabled is true"),
])
def test_a_bad_environment_variable_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         name: str, value: str, expected: str) -> None:
    path = write(tmp_path / "c.json", {"agents": {"defaults": {"model": "m"}}})
    monkeypatch.setenv("NANOBOT_AGENTS__DEFAULTS__MODEL", "plain-text-is-fine")
    monkeypatch.setenv("NANOBOT_CHANNELS__EMAIL__ALLOW_FROM", '["a@example.org"]')  # sorts before ENABLED
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value) and str(path) not in str(err.value)


def test_environment_values_are_converted_and_lists_are_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOBOT_AGENTS__DEFAULTS__TEMPERATURE", "0.5")
    monkeypatch.setenv("NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM", '["111", 222]')
    config, _ = load_config(write(tmp_path / "c.json", {}))
    assert config.agents.defaults.temperature == 0.5 and config.channels.telegram.allow_from == ["111", "222"]


def test_a_providers_extra_fields_are_kept_as_written(tmp_path: Path) -> None:
    """extraBody holds another API's names (snake_case, however deep): never renamed or refused."""
    body = {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}
    config, _ = load_config(write(tmp_path / "c.json", {"providers": {"openai": {"extraBody": body}}}))
    assert config.providers["openai"].extra_body == body


def test_a_pasted_key_loses_its_line_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key read with its line end (``cat key.txt``, an env file) failed every request as a
    "potential header injection attack"; keys and tokens have no white space of their own."""
    path = write(tmp_path / "c.json", {"providers": {"openai": {"apiKey": "sk-abc\n",
                                                                "apiBase": "https://x.example/v1\n"}},
                                       "channels": {"telegram": {"token": " 123:ABC\r\n"}}})
    config, _ = load_config(path)
    assert config.providers["openai"].api_key == "sk-abc" and config.channels.telegram.token == "123:ABC"
    assert config.providers["openai"].api_base == "https://x.example/v1"
    monkeypatch.setenv("NANOBOT_CHANNELS__SLACK__BOT_TOKEN", "xoxb-1\n")
    assert load_config(path)[0].channels.slack.bot_token == "xoxb-1"
