"""The web page in a real browser: Playwright driving Debian's chromium (Playwright's own
browser download is not used). Without chromium these tests skip, saying how to get it.

Parts are found by their accessible names (the ones shared/DESIGN.md lists), as a screen
reader would; axe-core checks every view for serious or critical accessibility violations."""

from __future__ import annotations

import asyncio
import re
import shutil
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Awaitable, Callable

import pytest

from nanobot.media.duration import recording_seconds
from tests.fakes.openai_server import FakeOpenAI, delayed, error, reply, tool_call, tool_calls
from tests.test_api import api, config  # noqa: F401  (fixtures: a gateway with the API and two keys)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="the web page tests need a browser: apt-get install chromium")
XSS = ("Links: [click](javascript:alert(1)) and <script>window.pwned = 1</script> "
       "<img src=x onerror=\"window.pwned = 2\"> [site](https://example.org)")


@asynccontextmanager
async def browser_page(*, width: int = 1280, height: int = 800, dark: bool = False):  # type: ignore[no-untyped-def]
    """A page in a real chromium, closed with its browser at the end."""
    from playwright.async_api import async_playwright

    playwright = await async_playwright().start()
    # A microphone that plays a tone, allowed without asking (the page records voice messages)
    # nanobot.test is the loopback under another name: a page there is no secure context
    browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
        "--host-resolver-rules=MAP nanobot.test 127.0.0.1"])
    try:
        # Under the page's own Content-Security-Policy, as users get it (it drops inline styles,
        # and forbids eval: waits are written as functions, which Playwright calls without it).
        context = await browser.new_context(viewport={"width": width, "height": height},
                                            color_scheme="dark" if dark else "light", permissions=["microphone"])
        yield await context.new_page()
    finally:
        await browser.close()
        await playwright.stop()


async def shows(page, selector: str, text: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until the element shows ``text`` (the page fills in as answers arrive)."""
    await page.wait_for_function("([s, t]) => document.querySelector(s)?.textContent.includes(t)", arg=[selector, text])


async def sign_in(page, root: str, key: str) -> None:  # type: ignore[no-untyped-def]
    await page.goto(root)
    await page.fill("#key", key)
    await page.press("#key", "Enter")
    await page.get_by_role("navigation", name="Conversations").wait_for()


async def no_serious_violations(page) -> None:  # type: ignore[no-untyped-def]
    from axe_playwright_python.async_playwright import Axe

    results = await Axe().run(page)
    bad = [(v["id"], v["impact"], v["help"]) for v in results.response["violations"]
           if v["impact"] in ("serious", "critical")]
    assert not bad, bad


@needs_browser
async def test_replies_render_as_markdown_safely_and_grow_as_they_stream(api: dict, llm: FakeOpenAI,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    root = api["base"].removesuffix("/v1") + "/"
    llm.stream_interval, llm.stream_piece_chars = 0.03, 16  # seen growing for over a second
    answer = ("## Three jobs\n\n- **backup** at 02:30\n- *status* weekdays\n\n| job | when |\n| --- | --- |\n"
              "| tea | hourly |\n\n```python\nprint('hi')\n```\n\n" + XSS + "\n\nLog in at "
              "[https://bank.example](https://evil.example/steal).\n\n" + "More words. " * 30)
    llm.script(reply(answer))
    async with browser_page() as page:
        await page.goto(root)
        await page.fill("#key", "nb-not-a-key")
        await page.press("#key", "Enter")
        await shows(page, "#sign-in-error", "That key does not work: mistyped, or revoked.")
        await no_serious_violations(page)
        await page.fill("#key", api["owner"])
        await page.get_by_role("button", name="Sign in").click()  # a button to press (Enter alone was the way)
        await page.get_by_role("navigation", name="Conversations").wait_for()
        await page.get_by_label("Message").fill("what runs?")
        await page.get_by_label("Message").press("Enter")
        stop = page.get_by_role("button", name="Stop")
        await stop.wait_for()  # shown while the turn runs
        await page.wait_for_function("() => document.querySelector('#messages li.assistant strong')")
        grown = await page.evaluate("document.querySelector('#messages li.assistant').textContent.length")
        await shows(page, "#messages", "More words. More words.")
        reply_box = page.locator("#messages li.assistant").last
        assert grown < len(await reply_box.inner_text())  # seen growing, already rendered
        assert await reply_box.locator("h2").inner_text() == "Three jobs"
        assert await reply_box.locator("table td").first.inner_text() == "tea"
        assert await reply_box.locator(".code-head span").inner_text() == "python"
        assert await reply_box.get_by_role("button", name="Copy the python code").count() == 1
        assert await page.evaluate("window.pwned") is None  # neither script nor onerror ran
        assert await reply_box.locator("script, img[onerror]").count() == 0
        assert await reply_box.locator("a[href^='javascript']").count() == 0
        link = reply_box.locator("a[href='https://example.org']")
        assert await link.get_attribute("target") == "_blank" and "noopener" in await link.get_attribute("rel")
        assert await link.inner_text() == "site"  # its words name no address: as written
        # words naming another address than the target (a steered reply) show the target too
        assert await reply_box.locator("a[href='https://evil.example/steal']").inner_text() == \
            "https://bank.example (https://evil.example/steal)"
        await stop.wait_for(state="hidden")
        await no_serious_violations(page)
        await page.screenshot(path=str(tmp_path / "page-chat.png"))
        await page.reload()  # the history comes from the server, rendered the same way
        await page.wait_for_function("() => document.querySelectorAll('#messages > li').length === 2")
        assert await page.locator("#messages li.assistant h2").inner_text() == "Three jobs"
        llm.script(error(400, message="the model is gone"))  # a failed turn: its words, marked as such
        await page.get_by_label("Message").fill("and now?")
        await page.get_by_label("Message").press("Enter")
        failed = page.locator("#messages li.assistant.failed")
        await failed.wait_for()
        assert "the model is gone" in await failed.inner_text() and await page.locator("#messages li.note").count() == 0
        await page.reload()  # the failed turn stays, marked as it was live
        await page.wait_for_function("() => document.querySelectorAll('#messages > li').length === 4")
        assert "the model is gone" in await page.locator("#messages li.assistant.failed").inner_text()
        await no_serious_violations(page)


@needs_browser
async def test_conversations_mode_model_stop_attach_and_keyboard(api: dict, llm: FakeOpenAI,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    root = api["base"].removesuffix("/v1") + "/"
    llm.fallback = lambda body: reply("you said: " + next(
        m["content"] for m in reversed(body["messages"]) if m["role"] == "user")[-120:])
    async with browser_page() as page:
        await sign_in(page, root, api["owner"])
        message = page.get_by_label("Message")
        await message.fill("first line")
        await message.press("Shift+Enter")  # a new line, not a send
        await message.type("second line")
        assert await page.locator("#messages > li").count() == 0
        await message.press("Enter")
        await shows(page, "#messages", "you said: first line\nsecond line")
        conversations = page.get_by_role("navigation", name="Conversations")
        await conversations.get_by_role("button", name="New conversation", exact=True).click()
        await page.wait_for_function("() => document.querySelectorAll('#messages > li').length === 0")
        await message.fill("about tea")
        await message.press("Enter")
        await shows(page, "#messages", "you said: about tea")
        await shows(page, "#conversation-list", "about tea")
        await conversations.locator("#conversation-list button", has_text="first line").click()
        await shows(page, "#messages", "second line")
        assert "about tea" not in await page.locator("#messages").inner_text()  # switched, history loaded
        await page.get_by_label("Mode", exact=True).select_option("code")
        await shows(page, "#messages", "Mode set to code for this chat.")
        assert await page.get_by_label("Mode", exact=True).input_value() == "code"
        (tmp_path / "notes.txt").write_text("CANARY-attached-note")
        await page.get_by_label("Attach").set_input_files(str(tmp_path / "notes.txt"))
        await shows(page, "#attached", "notes.txt")
        llm.fallback = lambda body: reply("read: " + ("yes" if "CANARY-attached-note" in str(body["messages"]) else "no"))
        await message.fill("what is in the file?")
        await message.press("Enter")
        await shows(page, "#messages", "read: yes")  # through the media pipeline, into the turn
        llm.fallback = lambda body: delayed(reply("too late"), 30)
        await message.fill("slow")
        await message.press("Enter")
        await page.get_by_role("button", name="Stop").wait_for()
        await page.keyboard.press("Escape")  # Esc stops, like the button
        await shows(page, "#messages", "stopped")
        await no_serious_violations(page)


@needs_browser
async def test_a_voice_message_recorded_on_the_page_is_heard_and_answered_aloud(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    """Speak, then Send voice: the recording goes up as an audio file, is transcribed, answered,
    and (a voice message in) the answer is spoken too: a player under it. Esc throws one away."""
    tools = api["gateway"].runtime.config.tools
    tools.transcription.provider, tools.speech.provider = "openai", "openai"  # speech.reply: whenVoice
    llm.transcripts.append("what is on today")
    llm.fallback = lambda body: reply("You asked: " + str(body["messages"][-1]["content"])[-40:])
    async with browser_page() as page:
        await sign_in(page, api["base"].removesuffix("/v1") + "/", api["owner"])
        speak = page.get_by_role("button", name="Speak", exact=True)
        await speak.click()
        await page.get_by_role("button", name="Send voice", exact=True).wait_for()  # recording
        await shows(page, "#attached", "Esc throws it away")
        await page.keyboard.press("Escape")  # thrown away
        await speak.wait_for()
        await speak.click()
        await page.wait_for_timeout(700)  # a recording is as long as it ran: some sound in it, not only a header
        await page.get_by_role("button", name="Send voice", exact=True).click()
        await shows(page, "#messages", "You asked: ")
        await shows(page, "#messages", "[voice] what is on today")
        await page.locator("#messages li.file audio").wait_for()  # the spoken answer's player
        await no_serious_violations(page)
        # On plain http under a name that is no loopback's, the browser offers no microphone: said so
        await sign_in(page, api["base"].removesuffix("/v1").replace("127.0.0.1", "nanobot.test") + "/", api["owner"])
        await page.get_by_role("button", name="Speak", exact=True).click()
        await shows(page, "#attached", "Recording needs the page on https (or on localhost)")
    [heard] = llm.transcriptions
    assert heard["filename"].endswith(".webm") and 0 < recording_seconds(heard["data"]) < 60  # how long: read


@needs_browser
async def test_stop_pressed_before_the_gateway_has_the_message_stops_it(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    """Stop at once after Enter: the page's /stop must not overtake the message it stops. The
    message's request is held until a /stop has been answered, or a second has passed."""
    llm.fallback = lambda body: delayed(reply("too late"), 30)
    stop_answered = asyncio.Event()

    async def hold_the_message(route) -> None:  # type: ignore[no-untyped-def]
        if "/stop" in (route.request.post_data or ""):
            await route.fulfill(response=await route.fetch())
            stop_answered.set()
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(stop_answered.wait(), 1.0)
        await route.continue_()

    async with browser_page() as page:
        await sign_in(page, api["base"].removesuffix("/v1") + "/", api["owner"])
        await page.route("**/v1/chat/completions", hold_the_message)
        await page.get_by_label("Message").fill("slow")
        await page.get_by_label("Message").press("Enter")
        await page.get_by_role("button", name="Stop").click()
        await shows(page, "#messages", "stopped")


@needs_browser
async def test_notes_and_files_the_assistant_sends_show_in_the_chat(api: dict, llm: FakeOpenAI,  # noqa: F811
                                                                     workspace: Path) -> None:
    import base64

    (workspace / "chart.png").write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="))
    (workspace / "report.csv").write_text("month,sales\njan,3\n")
    llm.script(tool_call("send_message", {"content": "Working on **it**."}),
               tool_calls(("send_file", {"path": "chart.png", "caption": "Sales"}), ("send_file", {"path": "report.csv"})),
               reply("Here they are."))
    async with browser_page() as page:
        await sign_in(page, api["base"].removesuffix("/v1") + "/", api["owner"])
        await page.get_by_label("Message").fill("the report?")
        await page.get_by_label("Message").press("Enter")
        await shows(page, "#messages > li.assistant", "Here they are.")
        assert await page.locator("#messages > li.note strong").inner_text() == "it"  # a note, in Markdown
        picture = page.get_by_role("img", name="Sales")
        await picture.wait_for()
        assert await picture.evaluate("img => img.naturalWidth") == 1  # fetched with the key, shown
        download = page.get_by_role("link", name="Download report.csv")
        async with page.expect_download() as started:
            await download.click()
        saved = await (await started.value).path()
        assert Path(saved).read_text() == "month,sales\njan,3\n"
        await no_serious_violations(page)
        api["gateway"].runtime.config.tools.speech.provider = "openai"  # the reply spoken: the page plays it
        llm.script(reply("Spoken."))
        for text, answer in (("/voice always", "Voice set to always"), ("say it", "Spoken.")):
            await page.get_by_label("Message").fill(text)
            await page.get_by_label("Message").press("Enter")
            await shows(page, "#messages", answer)  # one turn at a time: the page sends no second meanwhile
        voice = page.get_by_label("reply.ogg")
        await voice.wait_for()
        loaded = await voice.evaluate("audio => audio.readyState >= 1 ? 'loaded' : new Promise((done) => {"
                                      "audio.onloadedmetadata = () => done('loaded'); audio.onerror = () => done('error');"
                                      "setTimeout(() => done('not loaded in 10 s'), 10000); })")
        assert loaded == "loaded"  # the page's CSP lets it play, and the stand-in's OGG/Opus is a real one
        await no_serious_violations(page)


@needs_browser
async def test_what_reaches_the_open_chat_with_nobody_asking_shows_at_once_once(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    """A job's output (or a task's result) for the chat in view appears within seconds, below
    what is there, and only once; it showed only once the page was reloaded. A reader scrolled
    up to read is not pulled down to it."""
    from tests.helpers import add_cron_job, until

    gateway = api["gateway"]

    async def job_says(said: str) -> None:
        job = await add_cron_job(gateway.cron_jobs.service, owner_session="api:ada", schedule_kind="every",
                                 expression="3600", payload_kind="code", payload=f"print({said!r})")
        assert (await gateway.runtime.cron_runs.run(job.id, 15)).status == "ok"
        await looking_until(lambda: shown(said))

    async def shown(text: str) -> bool:
        return text in await page.locator("#messages").inner_text()

    async def looking_until(done: Callable[[], Awaitable[bool]]) -> None:
        """The page looks for news every 3 s, then less often while nothing comes (up to 30 s):
        until ``done``, the clock jumps to its next look each time, and the page runs as then."""
        async def looked() -> bool:
            if await done():
                return True
            await page.clock.fast_forward(30_000)
            return False
        await until(looked)

    llm.script(reply("Hello."))
    async with browser_page() as page:
        asked: list[str] = []
        page.on("requestfinished", lambda request: asked.append(request.url) if "/nanobot/news" in request.url else None)
        await page.clock.install()  # time runs as ever; looking_until jumps it to the page's next look
        await sign_in(page, api["base"].removesuffix("/v1") + "/", api["owner"])
        await page.get_by_label("Message").fill("hi")
        await page.get_by_label("Message").press("Enter")
        await shows(page, "#messages > li.assistant", "Hello.")
        await job_says("the backup finished")
        await page.set_viewport_size({"width": 800, "height": 240})  # a reader scrolled up to read
        await page.evaluate("window.scrollTo(0, 0)")
        await job_says("the tea is ready")
        assert await page.evaluate("window.scrollY") == 0  # is not pulled away from what they read
        before = len(asked)

        async def asked_twice() -> bool:
            return len(asked) >= before + 2
        await looking_until(asked_twice)  # asked again since: nothing comes twice
        assert await page.locator("#messages > li.assistant").all_inner_texts() == [
            "Hello.", "the backup finished", "the tea is ready"]


@needs_browser
async def test_an_owner_reads_every_chat_and_a_member_only_its_own(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    root = api["base"].removesuffix("/v1") + "/"
    llm.script(reply("the owner's secret plan"), reply("hello member"))
    await _owner_says_something(api)
    async with browser_page() as page:
        await sign_in(page, root, api["member"])
        await page.get_by_label("Message").fill("hi")
        await page.get_by_label("Message").press("Enter")
        await shows(page, "#messages", "hello member")
        assert "secret plan" not in await page.locator("#messages").inner_text()
        assert await page.locator("#every-chat").is_hidden()
        for view in ("status", "cron", "pairing", "usage"):  # views a member key would only be refused
            assert await page.locator(f"#nav-{view}").is_hidden()
        await page.click("#sign-out")
        await sign_in(page, root, api["owner"])
        await shows(page, "#chat-list", "api:bob")
        assert await page.locator("#nav-usage").is_visible()
        await page.locator("#chat-list button", has_text="api:bob").click()
        await shows(page, "#messages", "hello member")
        assert await page.get_by_label("Message").is_disabled() and await page.locator("#read-only").is_visible()


async def _owner_says_something(api: dict) -> None:
    import openai

    ai = openai.AsyncOpenAI(base_url=api["base"], api_key=api["owner"], max_retries=0)
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "plan"}])


async def test_the_page_is_small_and_locked_down(api: dict) -> None:  # noqa: F811
    """No CDN, under 300 KB with its vendored libraries, served with a policy that allows only
    its own scripts; the vendored files carry their licences."""
    import aiohttp

    root = api["base"].removesuffix("/v1")
    ours = ("/", "/static/app.js", "/static/style.css", "/static/icon.svg")
    vendored = ("/static/vendor/markdown-it.min.js", "/static/vendor/purify.min.js")
    async with aiohttp.ClientSession() as http:
        sizes = []
        for path in (*ours, *vendored):
            async with http.get(root + path) as resp:
                body = await resp.read()
                assert resp.status == 200 and "default-src 'self'" in resp.headers["Content-Security-Policy"]
                if path in ours:
                    outside = body.replace(b"http://www.w3.org/2000/svg", b"")  # a namespace, not a fetch
                    assert b"http://" not in outside and b"https://" not in outside  # nothing from elsewhere
                sizes.append(len(body))
        async with http.get(root + "/static/vendor/../../server.py") as resp:
            assert resp.status == 404
    assert sum(sizes) < 300_000
    vendor = Path(__file__).resolve().parent.parent / "nanobot" / "api" / "web" / "vendor"
    assert (vendor / "markdown-it.LICENSE").read_text().startswith("Copyright") or "MIT" in (vendor / "markdown-it.LICENSE").read_text()
    assert "Apache License" in (vendor / "purify.LICENSE").read_text()


@needs_browser
async def test_the_owner_views_cron_pairing_usage_status(api: dict, llm: FakeOpenAI, tmp_path: Path) -> None:  # noqa: F811
    from nanobot.cron.store import CronStore

    root = api["base"].removesuffix("/v1") + "/"
    rt = api["gateway"].runtime
    await (await CronStore.open(rt.db)).add(name="tea timer", owner_session="api:ada", schedule_kind="cron",
                                            expression="0 9 * * 1-5", timezone="UTC", payload_kind="code",
                                            payload="print('tea is ready')")
    await rt.pairing.request("telegram", "555", "carol")
    await rt.announce("New scheduled job 1a2b3c4d (every 1h) made by api:bob: stretch")  # no chat channel: kept here
    await rt.usage.record_call("api:ada", "tools", "small-model", 100, 20, cost=0.25)
    await rt.usage.record_call("api:bob", "tools", "big-model", 100, 20, cost=1.5, cached_tokens=64)
    await rt.usage.record_call("api:bob", "tools", "small-model", 0, 0, outcome="the model server answered HTTP 429: "
                               "You exceeded your current quota")  # why it last failed, on the status view
    async with browser_page() as page:
        await sign_in(page, root, api["owner"])
        await shows(page, "#nav-status", "Status (1 new)")  # the notice below, not seen yet
        await page.click("#nav-cron")
        await shows(page, "#jobs", "weekdays at 09:00 (UTC)")
        await page.click("#jobs button:text('Disable')")
        await shows(page, "#jobs", "disabled")
        await page.click("#jobs button:text('Run now')")
        await shows(page, "#jobs", "Last runs (1)")  # the run (its output kept in the API chat), folded
        await page.click("#jobs summary:text('Last runs (1)')")
        await page.get_by_text("tea is ready", exact=False).last.wait_for()
        assert "made in api:ada" in await page.locator("#jobs").inner_text()  # whose job it is
        await page.click("#jobs summary:text('Its code')")
        await page.locator("#jobs pre", has_text="print('tea is ready')").wait_for()
        await no_serious_violations(page)
        page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))  # "Remove the job tea timer?"
        await page.click("#jobs button:text('Remove')")
        await shows(page, "#cron-note", "No cron jobs.")
        assert await (await CronStore.open(rt.db)).list() == []
        await page.click("#nav-pairing")
        await shows(page, "#requests", "carol")
        await shows(page, "#paired-note", "Nobody yet.")
        await page.click("#requests button:text('Approve')")
        await shows(page, "#paired", "carol")
        assert await rt.pairing.is_paired("telegram", "555")
        page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))  # "Take back ...'s approval?"
        await page.click("#paired button:text('Revoke')")
        await shows(page, "#paired-note", "Nobody yet.")
        await page.click("#nav-usage")
        await shows(page, "#usage-note", "240 tokens (64 cached), $1.7500")
        assert await page.locator("#chart rect").count() == 2 and await page.locator("#chart text").count() >= 8
        axis = await page.locator("#chart > text").all_text_contents()
        assert {"$2.00", "$1.00", "$0.00"} <= set(axis), axis  # round steps, not $1.75 and $0.8750
        assert await page.locator("#legend").inner_text() == "big-model\nsmall-model" or "big-model" in \
            await page.locator("#legend").inner_text()
        swatches = await page.locator("#legend span").evaluate_all(
            "spans => spans.map((s) => getComputedStyle(s).backgroundColor)")
        assert len(set(swatches)) == 2 and "rgba(0, 0, 0, 0)" not in swatches  # coloured under the real CSP
        assert (await page.locator("#top-chats tbody tr").first.inner_text()).startswith("api:bob")
        await no_serious_violations(page)
        await page.click("#nav-status")
        await shows(page, "#status-list", "Shell")
        await shows(page, "#notices", "New scheduled job")  # the member's job, announced: here for a page-only owner
        assert await page.locator("#nav-status").inner_text() == "Status"  # seen
        shown = await page.locator("#status-list").inner_text()
        assert "GB free" in shown and re.search(r"Model\s+small-model: last failed at \d\d:\d\d: the model server "
                                                 r"answered HTTP 429: You exceeded your current quota", shown), shown
        await no_serious_violations(page)
        await rt.announce("telegram user 7 (dave) asked to talk to me")
        await page.goto(root)  # the chat again: seen before stays seen; only the new one counts
        await shows(page, "#nav-status", "Status (1 new)")
    assert not await rt.pairing.is_paired("telegram", "555")  # approved, then revoked on the page


@needs_browser
@pytest.mark.parametrize("dark", [False, True])
async def test_it_works_at_375_pixels_light_and_dark(api: dict, llm: FakeOpenAI, dark: bool) -> None:  # noqa: F811
    root = api["base"].removesuffix("/v1") + "/"
    llm.fallback = lambda body: reply("A reply that is long enough to wrap on a phone, with `code` and **bold** words."
                                      "\n\n| Conversation | Notifications | Attachments |\n|---|---|---|\n| a | b | c |"
                                      "\n\n```bash\nnanobot cron runs backup --limit 3 && nanobot cron runs tea --limit 3\n```")
    async with browser_page(width=375, height=740, dark=dark) as page:
        await sign_in(page, root, api["owner"])
        for n in range(4):  # conversations whose names are as long as their first messages
            if n:
                await page.get_by_role("button", name="New conversation", exact=True).click()
                await page.wait_for_function("() => document.querySelectorAll('#messages > li').length === 0")
            await page.get_by_label("Message").fill(f"conversation {n}: hello from a phone, at some length")
            await page.get_by_label("Message").press("Enter")
            await shows(page, "#messages", "bold")
        await shows(page, "#conversation-list", "conversation 3")
        assert await page.locator("#conversation-list li").count() >= 4
        assert await page.evaluate("document.scrollingElement.scrollWidth") <= 375  # nothing sideways
        for name in ("mode", "model"):  # a label stays beside its list ("Model" ended a line, its list the next)
            label, select = [await page.locator(s).bounding_box() for s in (f"label[for={name}]", f"#{name}")]
            assert abs(label["y"] + label["height"] / 2 - select["y"] - select["height"] / 2) < 8, (name, label, select)
        lines = await page.locator("#messages th").evaluate_all(  # a table's words stay whole: it scrolls instead
            "cells => cells.map(c => { const r = document.createRange(); r.selectNodeContents(c); "
            "return r.getClientRects().length; })")
        assert lines and set(lines) == {1}, lines
        # A code line stays one line and scrolls too (it wrapped: "backup --" above "limit 3").
        assert await page.locator("#messages .code pre").evaluate("pre => pre.scrollWidth > pre.clientWidth")
        background = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert (background == "rgb(13, 17, 23)") == dark
        await no_serious_violations(page)
    await asyncio.sleep(0)


@asynccontextmanager
async def under_a_path(target: str, prefix: str):  # type: ignore[no-untyped-def]
    """A reverse proxy serving ``target`` under ``prefix``, streaming, as nginx's
    ``location /nanobot/ { proxy_pass http://127.0.0.1:8765/; }`` does; its base URL."""
    import aiohttp
    from aiohttp import web

    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async def forward(request: web.Request) -> web.StreamResponse:
            url = target + request.path_qs.removeprefix(prefix)
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            async with http.request(request.method, url, headers=headers, data=await request.read()) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length", "transfer-encoding")})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

        app = web.Application()
        app.router.add_route("*", prefix + "{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}{prefix}"
        finally:
            await runner.cleanup()


@needs_browser
async def test_the_page_works_behind_a_proxy_under_a_path(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    """Self-hosters put it behind their web server at a path (home.example/nanobot/): the page
    asked for its files and the API at the host's root, and showed a blank sign-in that never
    worked. Everything it asks for is relative to where it is."""
    llm.script(reply("Hello from under a path."))
    async with under_a_path(api["base"].removesuffix("/v1") + "/", "/nanobot/") as root, browser_page() as page:
        failed: list[str] = []
        streams: list[str | None] = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.on("response", lambda response: response.url.endswith("completions") and
                streams.append(response.headers.get("x-accel-buffering")))  # nginx streams it at once
        page.on("response", lambda response: response.status >= 400 and failed.append(response.url))
        await sign_in(page, root, api["owner"])
        await page.get_by_label("Message").fill("hi")
        await page.get_by_label("Message").press("Enter")
        await shows(page, "#messages", "Hello from under a path.")
        assert await page.evaluate("typeof DOMPurify.sanitize") == "function" and failed == []
        assert streams == ["no"]
