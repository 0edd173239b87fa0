"""What real model servers do to the agent: strict message formats, errors, cut replies, long
chats, loops. Through the real openai SDK against the scripted server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanobot.agent.loop import FailedReply
from nanobot.agent.streaming import ReplyStream
from nanobot.providers.openai_provider import request_json
from nanobot.runtime import open_runtime
from tests.fakes.openai_server import HANG_UP, FakeOpenAI, Raw, delayed, error, reply, tool_call, truncated
from tests.helpers import config_for
from tests.test_cli import nanobot, write_config


async def ask(llm: FakeOpenAI, workspace: Path, text: str, session: str = "cli:t", retries: int = 2, **kw) -> str:
    config = config_for(llm.base_url, workspace, **kw)
    config.providers["openai"].max_retries = retries
    async with open_runtime(config) as rt:
        rt.provider.provider("openai").backoff_s = 0.01
        return await rt.agent.handle(session, text)


async def test_tool_call_turns_send_empty_content_and_tool_choice_auto(llm: FakeOpenAI, workspace: Path) -> None:
    # llama-cpp-python's server rejects content: null (HTTP 500) and makes native calls only with tool_choice
    llm.script(tool_call("list_dir", {}), reply("done"))
    assert await ask(llm, workspace, "list") == "done"
    first, second = llm.chat_requests
    assert first["tool_choice"] == "auto" and second["tool_choice"] == "auto"
    assistant = [m for m in second["messages"] if m["role"] == "assistant"]
    assert assistant[0]["content"] == "" and assistant[0]["tool_calls"]
    assert all(m["content"] is not None for r in llm.chat_requests for m in r["messages"])


async def test_code_mode_sends_no_tool_choice(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(reply("hello"))
    await ask(llm, workspace, "hi", mode="code")
    assert "tool_choice" not in llm.chat_requests[0] and "tools" not in llm.chat_requests[0]


@pytest.mark.parametrize("status", [500, 400, 401, 404])
async def test_errors_that_will_fail_again_are_not_retried(llm: FakeOpenAI, workspace: Path, status: int) -> None:
    llm.script(error(status, message="7 validation errors"), reply("never"))
    answer = await ask(llm, workspace, "hi")
    assert isinstance(answer, FailedReply) and f"HTTP {status}" in answer
    assert len(llm.chat_requests) == 1
    assert ("(the key is providers.openai.apiKey)" in answer) == (status == 401)  # which key, of several


@pytest.mark.parametrize("status", [429, 502, 503])
async def test_busy_servers_are_retried(llm: FakeOpenAI, workspace: Path, status: int) -> None:
    llm.script(error(status, retry_after=0.01), reply("after retry"))
    assert await ask(llm, workspace, "hi") == "after retry"
    assert len(llm.chat_requests) == 2


def like_gpt5(body: dict) -> object:
    """OpenAI's reasoning models (gpt-5, o3): max_completion_tokens only, and no temperature but 1."""
    if "max_tokens" in body:
        return error(400, message="Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                     "'max_completion_tokens' instead.", code="unsupported_parameter", param="max_tokens")
    if body.get("temperature", 1) != 1:
        return error(400, message=f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                     "model. Only the default (1) value is supported.", code="unsupported_value", param="temperature")
    return reply(f"at most {body['max_completion_tokens']} tokens")


async def test_a_providers_extra_fields_go_with_every_request_a_model_takes(llm: FakeOpenAI, workspace: Path) -> None:
    """providers.<name>.extraBody (reasoning_effort, DeepSeek's thinking switch, vLLM's
    chat_template_kwargs) goes with every request; a model that refuses one of its fields is
    asked again without it, and from then on."""
    def answer(body: dict) -> object:
        if "reasoning_effort" in body and body["model"] == "gpt-4.1":
            return error(400, message="Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                         code="unsupported_parameter", param="reasoning_effort")
        return reply(f"{body['model']}: {body.get('reasoning_effort')}, {body['chat_template_kwargs']}")
    llm.fallback = answer
    config = config_for(llm.base_url, workspace, model="gpt-5-mini")
    config.providers["openai"].extra_body = {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}
    config.providers["openai"].max_retries = 0
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:t", "hi") == "gpt-5-mini: low, {'enable_thinking': False}"
        config.agents.defaults.model = "gpt-4.1"
        assert await rt.agent.handle("cli:t", "hi") == "gpt-4.1: None, {'enable_thinking': False}"
        assert await rt.agent.handle("cli:t", "hi") == "gpt-4.1: None, {'enable_thinking': False}"
    assert len(llm.chat_requests) == 1 + 2 + 1


async def test_a_reasoning_model_gets_the_fields_it_takes(llm: FakeOpenAI, workspace: Path) -> None:
    """gpt-5 refused every request (max_tokens and temperature 0.2, as every other server takes
    them): its server's 400 names the field, the request goes again at once without it, and the
    model's later requests go so from the start; a server that takes them still gets them."""
    llm.fallback = like_gpt5
    config = config_for(llm.base_url, workspace, max_tokens=900)
    config.providers["openai"].max_retries = 0  # learning a field is not a retry
    async with open_runtime(config) as rt:
        assert await rt.agent.handle("cli:t", "hi") == "at most 900 tokens"
        assert len(llm.chat_requests) == 3
        assert await rt.agent.handle("cli:t", "again") == "at most 900 tokens"
        assert len(llm.chat_requests) == 4
    llm.fallback = lambda body: reply(f"{body['max_tokens']} at {body['temperature']}")
    assert await ask(llm, workspace, "hi", max_tokens=900) == "900 at 0.2"


def like_deepseek(body: dict) -> object:
    """DeepSeek's thinking mode: each answer comes with its reasoning, and a request whose
    assistant message with tool calls lacks the reasoning it came with is refused."""
    for message in body["messages"]:
        if message["role"] == "assistant" and message.get("tool_calls") and \
                message.get("reasoning_content") != "The folder first.":
            return error(400, message="The reasoning_content in the thinking mode must be passed back to the API.",
                         code="invalid_request_error")
    last = body["messages"][-1]
    item = tool_call("list_dir", {}) if last["role"] == "user" else reply(f"{len(body['messages'])} messages")
    item["message"]["reasoning_content"] = "The folder first." if last["role"] == "user" else "Done."
    return item


def like_gemini3(body: dict) -> object:
    """Gemini 3: a tool call comes with a thought signature, and a request whose tool call lacks
    the one it came with is refused."""
    signature = {"google": {"thought_signature": "c2lnbmVk"}}
    calls = [c for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    if any(c.get("extra_content") != signature for c in calls):
        return error(400, message="Function call is missing a thought_signature in functionCall parts.")
    if body["messages"][-1]["role"] == "tool":
        return reply(f"{len(body['messages'])} messages")
    item = tool_call("list_dir", {})
    item["message"]["tool_calls"][0]["extra_content"] = signature
    return item


THOUGHTS = [{"type": "reasoning.text", "text": "The folder first, then the answer.", "format": "unknown", "index": 0},
            {"type": "reasoning.encrypted", "data": "b3BhcXVl", "format": "google-gemini-v1", "index": 1}]


def like_openrouter(body: dict) -> object:
    """OpenRouter with Gemini 3 or Claude: an answer's thinking comes as ``reasoning_details``
    parts, and a request whose assistant message with tool calls lacks them is refused."""
    for message in body["messages"]:
        if message["role"] == "assistant" and message.get("tool_calls") and message.get("reasoning_details") != THOUGHTS:
            return error(400, message="Gemini models require OpenRouter reasoning details to be preserved in each request.")
    last = body["messages"][-1]
    item = tool_call("list_dir", {}) if last["role"] == "user" else reply(f"{len(body['messages'])} messages")
    item["message"]["reasoning_details"] = THOUGHTS
    return item


def refusing(field: str):  # type: ignore[no-untyped-def]
    """A server that never heard of ``field`` (after a fallback or /model)."""
    return lambda body: error(400, message=f"Unknown parameter: 'messages[2].{field}'.", code="unknown_parameter",
                              param=f"messages[2].{field}") if field in json.dumps(body) else reply("plain")


@pytest.mark.parametrize("server, field", [(like_deepseek, "reasoning_content"), (like_openrouter, "reasoning_details"),
                                           (like_gemini3, "extra_content")])
@pytest.mark.parametrize("streaming", [False, True])
async def test_what_a_thinking_model_gave_with_a_tool_call_goes_back_with_it(
        llm: FakeOpenAI, workspace: Path, streaming: bool, server, field: str) -> None:
    """DeepSeek (thinking by default), Gemini 3 or Claude through OpenRouter, and Gemini 3 on its
    own API refused the second call of every turn that used a tool: what the model gave with a
    tool call (its reasoning, a thought signature on the call) must go back with it, in this turn
    and every later one. A server that refuses the field gets the chat without it."""
    llm.fallback = server

    async def shown(text: str) -> None:
        pass
    async with open_runtime(config_for(llm.base_url, workspace, mode="tools")) as rt:
        async def ask(text: str) -> str:
            return await rt.agent.handle("cli:t", text, stream=ReplyStream(shown) if streaming else None)
        assert [await ask("what is here?"), await ask("and now?")] == ["4 messages", "8 messages"]
        llm.fallback = refusing(field)
        assert await ask("hi") == "plain"
    assert len(llm.chat_requests) == 2 + 2 + 2 and {bool(r.get("stream")) for r in llm.chat_requests} == {streaming}


async def test_a_dropped_connection_is_retried_and_is_not_called_a_timeout(llm: FakeOpenAI, workspace: Path) -> None:
    """The SDK's aiohttp adapter calls every connection error a connect timeout; ours says what it was."""
    llm.script(HANG_UP, reply("after the hang-up"))
    assert await ask(llm, workspace, "hi") == "after the hang-up"
    llm.script(*[HANG_UP] * 3)  # ask() sets maxRetries 2: three hang-ups give up
    answer = await ask(llm, workspace, "hi")
    assert isinstance(answer, FailedReply) and "in time" not in answer and "could not reach" in answer
    assert len(llm.chat_requests) == 2 + 3


async def test_a_timeout_is_not_sent_again_behind_itself(llm: FakeOpenAI, workspace: Path) -> None:
    # one-request-at-a-time servers would queue the copy behind the slow original
    llm.script(delayed(reply("too late"), 1.0), reply("copy"))
    config = config_for(llm.base_url, workspace)
    config.providers["openai"].timeout = 0.3
    async with open_runtime(config) as rt:
        answer = await rt.agent.handle("cli:t", "hi")
        totals = await rt.usage.totals()
    assert isinstance(answer, FailedReply) and "did not answer in time" in answer
    assert len(llm.chat_requests) == 1
    assert totals["tools"].model_calls == 1 and totals["tools"].failed_calls == 1  # failed calls are recorded


async def test_an_html_page_is_a_clear_failure(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(Raw("<html><body>Welcome to nginx!</body></html>"))
    answer = await ask(llm, workspace, "hi")
    assert isinstance(answer, FailedReply) and "not JSON" in answer


def test_request_json_keeps_each_schema_encoding_and_says_the_same() -> None:
    schema = {"type": "function", "function": {"name": "f", "description": "Grüße ✓", "parameters": {}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "naïve"}], "tools": [schema, schema]}
    for _ in range(2):  # the second time from the kept encoding
        sent = request_json(body)
        assert json.loads(sent) == body and "Grüße ✓".encode() in sent and sent.startswith(b'{"model":"m",')
    with pytest.raises(ValueError):
        request_json({"temperature": float("nan")})


def completion(**fields) -> Raw:
    return Raw(json.dumps({"id": "x", "object": "chat.completion", **fields}), content_type="application/json")


@pytest.mark.parametrize("body, expected", [
    # What servers leave out or send as null counts as empty, as the SDK's own models read it.
    ({"choices": [{"message": {"content": "plain"}}]}, "plain"),
    ({"choices": [{"message": {"content": "hi", "tool_calls": None}, "finish_reason": None}], "usage": None,
      "model": None}, "hi"),
    ({"choices": [{"message": {"content": "ok", "tool_calls": [{"id": "c", "function": None}]}}]}, "ok"),
    # No usable answer is a clear failure, never a traceback.
    ({"choices": []}, "no choices"), ({"choices": "many"}, "no choices"), ({"choices": [None]}, "no choices"),
    ({}, "no choices"),
])
async def test_odd_completions_are_read_leniently_or_fail_clearly(llm: FakeOpenAI, workspace: Path, body,
                                                                  expected: str) -> None:
    llm.script(completion(**body))
    answer = await ask(llm, workspace, "hi")
    assert expected in answer and (expected != "no choices" or isinstance(answer, FailedReply))


async def test_a_failed_turn_takes_its_message_back(llm: FakeOpenAI, workspace: Path, home: Path) -> None:
    llm.script(error(500), reply("answer to the second"))
    await ask(llm, workspace, "first question")
    assert await ask(llm, workspace, "second question") == "answer to the second"
    users = [m["content"] for m in llm.chat_requests[1]["messages"] if m["role"] == "user"]
    assert users == ["second question"]  # the failed one is not asked again
    lines = (home / "sessions" / "cli_t.jsonl").read_text()
    assert "first question" in lines  # the file keeps everything


async def test_a_failure_after_work_keeps_the_work_and_says_so(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(tool_call("write_file", {"path": "a.txt", "content": "x"}), error(500), reply("ok"))
    await ask(llm, workspace, "write a")
    await ask(llm, workspace, "next")
    history = llm.chat_requests[-1]["messages"]
    assert [m["role"] for m in history[1:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert "HTTP 500" in history[4]["content"]


async def test_a_cut_reply_is_shown_as_cut_and_never_run(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(truncated(reply("```python\nwrite_file('cut.txt', 'x')\nfor i in range(")))
    answer = await ask(llm, workspace, "go", mode="code", max_tokens=100)
    assert "cut off at the output limit" in answer and "maxTokens = 100" in answer
    assert not (workspace / "cut.txt").exists() and len(llm.chat_requests) == 1


async def test_a_cut_tool_call_is_not_run(llm: FakeOpenAI, workspace: Path) -> None:
    llm.script(truncated(tool_call("write_file", {"path": "cut.txt", "content": "x"})))
    answer = await ask(llm, workspace, "go")
    assert "cut off" in answer and not (workspace / "cut.txt").exists()


async def test_max_tokens_must_stay_below_the_context(home: Path, workspace: Path) -> None:
    (home / "config.json").write_text(json.dumps({"agents": {"defaults": {"maxTokens": 8192, "contextTokens": 4096}}}))
    code, _, err = await nanobot("status", home=home)
    assert code == 2 and "contextTokens" in err and "maxTokens" in err


async def test_history_is_trimmed_to_the_context(llm: FakeOpenAI, workspace: Path) -> None:
    for i in range(6):
        llm.script(reply(f"answer {i}"))
        await ask(llm, workspace, f"question {i} " + "x" * 3000, context_tokens=5000, max_tokens=1000)
    last = llm.chat_requests[-1]["messages"]
    chars = sum(len(m["content"]) for m in last)
    assert chars // 3 < 4000  # under the budget by the same estimate
    assert last[1]["role"] == "user" and last[-1]["content"].startswith("question 5")
    assert len(last) < 1 + 2 * 6  # the oldest turns were left out


async def test_a_turn_that_outgrows_the_context_stops_clearly(llm: FakeOpenAI, workspace: Path) -> None:
    (workspace / "big.txt").write_text("y" * 20000)
    llm.script(tool_call("read_file", {"path": "big.txt"}), reply("never"))
    answer = await ask(llm, workspace, "read it", context_tokens=5000, max_tokens=1000)
    assert "outgrew the model's context" in answer and len(llm.chat_requests) == 1


async def test_a_model_repeating_the_same_call_is_stopped(llm: FakeOpenAI, workspace: Path) -> None:
    llm.fallback = tool_call("read_file", {"path": "missing.txt"})
    answer = await ask(llm, workspace, "read it", max_iterations=40)
    assert "repeating read_file" in answer and len(llm.chat_requests) == 3


async def test_a_model_repeating_the_same_program_is_stopped(llm: FakeOpenAI, workspace: Path) -> None:
    llm.fallback = reply("```python\nprint(read_file('missing.txt'))\n```")
    answer = await ask(llm, workspace, "read it", mode="code", max_iterations=40)
    assert "repeating the same program" in answer and len(llm.chat_requests) == 3


@pytest.mark.parametrize("item", [error(500), error(401), error(404), Raw("<html>proxy</html>"),
                                  {"message": None, "usage": {}}])
async def test_agent_message_exits_1_when_the_model_fails(home: Path, workspace: Path, item) -> None:
    async with FakeOpenAI() as llm:
        write_config(home, workspace, llm.base_url)
        if isinstance(item, dict):  # a 200 with no choices
            llm.script(lambda body: Raw(json.dumps({"id": "x", "object": "chat.completion", "choices": []}),
                                        content_type="application/json"))
        else:
            llm.script(item)
        code, out, err = await nanobot("agent", "-m", "hi", home=home)
    assert code == 1, (out, err)
    assert "Sorry, I could not get an answer from the model" in out and "Traceback" not in out + err


async def test_a_model_server_over_https_is_trusted_by_its_certificate_only(home: Path, workspace: Path) -> None:
    """A server whose certificate no trusted CA signed is refused at once, saying so and how to
    trust it (it was retried three times, 7 s, as "could not reach"; `onboard` said "Connection
    error."); with its CA in SSL_CERT_FILE it answers; a SSL_CERT_FILE that is not there is
    one line naming it (it was "nanobot: No such file or directory")."""
    import ssl

    import trustme

    ca, served = trustme.CA(), ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    ca.cert_pem.write_to_path(str(home / "ca.pem"))
    async with FakeOpenAI(tls=served) as llm:
        write_config(home, workspace, llm.base_url)
        llm.script(reply("over TLS"))
        code, out, err = await nanobot("agent", "-m", "hi", home=home, env={"SSL_CERT_FILE": ""})
        assert code == 1 and "certificate was refused (unable to get local issuer certificate)" in out, (out, err)
        assert "SSL_CERT_FILE" in out and "retry" not in err and not llm.chat_requests
        code, out, err = await nanobot("onboard", "--non-interactive", "--api-base", llm.base_url, "--api-key", "k",
                                       home=home / "new", env={"SSL_CERT_FILE": ""})  # its check says the same
        assert code == 0 and "certificate was refused (unable to get local issuer certificate)" in out, (out, err)
        code, out, err = await nanobot("agent", "-m", "hi", home=home, env={"SSL_CERT_FILE": str(home / "ca.pem")})
        assert code == 0 and "over TLS" in out, (out, err)
        code, out, err = await nanobot("agent", "-m", "hi", home=home, env={"SSL_CERT_FILE": str(home / "gone.pem")})
    assert code == 2 and err == (f"nanobot: SSL_CERT_FILE={home / 'gone.pem'} (environment): no CA certificate could "
                                 "be read there (No such file or directory)\n"), err  # one line, no traceback


async def test_no_key_for_openai_says_so_before_any_network(home: Path, workspace: Path) -> None:
    (home / "config.json").write_text(json.dumps({"agents": {"defaults": {"workspace": str(workspace)}}}))
    code, out, err = await nanobot("agent", "-m", "hi", home=home)
    assert code == 2 and "providers.openai.apiKey is not set" in err and "Traceback" not in err
    assert "nanobot onboard writes one" in err  # a first run has no config file to set it in


async def test_a_bad_character_does_not_poison_the_chat(llm: FakeOpenAI, workspace: Path, home: Path) -> None:
    llm.script(reply("odd text"), reply("fine"))
    assert await ask(llm, workspace, "bad \udcff byte and \ud83d half", mode="code") == "odd text"
    assert await ask(llm, workspace, "next", mode="code") == "fine"
    sent = json.dumps(llm.chat_requests[-1]["messages"])
    assert "bad \\ufffd byte and \\ufffd half" in sent, sent
    lines = (home / "sessions" / "cli_t.jsonl").read_text(encoding="utf-8").splitlines()
    assert all(json.loads(line) for line in lines) and len(lines) == 1 + 2 + 2
