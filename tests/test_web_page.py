"""The web page in a real browser: Playwright driving Debian's chromium (Playwright's own
browser download is not used). Without chromium these tests skip, saying how to get it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAI, reply
from tests.test_api import api, config  # noqa: F401  (fixtures: a gateway with the API and two keys)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="the web page tests need a browser: apt-get install chromium")


async def browser_page():  # type: ignore[no-untyped-def]
    from playwright.async_api import async_playwright

    playwright = await async_playwright().start()
    browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    # The page's Content-Security-Policy forbids eval, which Playwright's waits use; the
    # header itself is checked in test_the_page_is_small_and_locked_down.
    context = await browser.new_context(bypass_csp=True)
    return playwright, browser, await context.new_page()


async def shows(page, selector: str, text: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until the element shows ``text`` (the page fills in as answers arrive)."""
    await page.wait_for_function("([s, t]) => document.querySelector(s)?.textContent.includes(t)", arg=[selector, text])


async def sign_in(page, root: str, key: str) -> None:  # type: ignore[no-untyped-def]
    await page.goto(root)
    await page.fill("#key", key)
    await page.press("#key", "Enter")


@needs_browser
async def test_sign_in_chat_streamed_history_and_status(api: dict, llm: FakeOpenAI, tmp_path: Path) -> None:  # noqa: F811
    root = api["base"].removesuffix("/v1") + "/"
    llm.script(reply("Hello <script>window.pwned = 1</script><b>there</b>"))
    playwright, browser, page = await browser_page()
    try:
        await sign_in(page, root, "nb-not-a-key")
        await shows(page, "#sign-in-error", "does not work")
        await sign_in(page, root, api["owner"])
        await page.wait_for_selector("#chat:not([hidden])")
        assert await page.locator("#sign-in").is_hidden() and await page.locator("#chat").is_visible()
        await page.fill("#text", "hi")
        await page.press("#text", "Enter")
        await page.wait_for_function("[...document.querySelectorAll('#messages li.assistant')]"
                                     ".some(li => li.textContent.includes('</b>'))")
        assert await page.evaluate("window.pwned") is None  # shown as text, never run
        assert await page.locator("#messages b").count() == 0
        await page.screenshot(path=str(tmp_path / "page-chat.png"))
        await page.reload()  # the history comes from the server
        await page.wait_for_function("document.querySelectorAll('#messages li').length === 2")
        await page.click("#nav-status")
        await shows(page, "#status-text", "Shell:")
        await page.screenshot(path=str(tmp_path / "page-status.png"))
    finally:
        await browser.close()
        await playwright.stop()
    assert (tmp_path / "page-chat.png").stat().st_size > 0


@needs_browser
async def test_a_member_key_sees_its_own_chat_and_no_status(api: dict, llm: FakeOpenAI) -> None:  # noqa: F811
    root = api["base"].removesuffix("/v1") + "/"
    llm.script(reply("the owner's secret plan"), reply("hello member"))
    await _owner_says_something(api)
    playwright, browser, page = await browser_page()
    try:
        await sign_in(page, root, api["member"])
        await page.wait_for_selector("#chat:not([hidden])")
        await page.fill("#text", "hi")
        await page.press("#text", "Enter")
        await shows(page, "#messages", "hello member")
        assert "secret plan" not in await page.locator("#messages").inner_text()
        await page.click("#nav-status")
        await shows(page, "#status-text", "owner key")
    finally:
        await browser.close()
        await playwright.stop()


async def _owner_says_something(api: dict) -> None:
    import openai

    ai = openai.AsyncOpenAI(base_url=api["base"], api_key=api["owner"], max_retries=0)
    await ai.chat.completions.create(model="nanobot", messages=[{"role": "user", "content": "plan"}])


async def test_the_page_is_small_and_locked_down(api: dict) -> None:  # noqa: F811
    """Three files, no CDN, under 100 KB, served with a policy that allows only its own script."""
    import aiohttp

    root = api["base"].removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        sizes = []
        for path in ("/", "/static/app.js", "/static/style.css"):
            async with http.get(root + path) as resp:
                body = await resp.read()
                assert resp.status == 200 and "default-src 'self'" in resp.headers["Content-Security-Policy"]
                outside = body.replace(b"http://www.w3.org/2000/svg", b"")  # the SVG namespace is a name, not a fetch
                assert b"http://" not in outside and b"https://" not in outside  # nothing from elsewhere
                sizes.append(len(body))
    assert sum(sizes) < 100_000


@needs_browser
async def test_the_owner_runs_cron_pairing_and_sees_usage(api: dict, llm: FakeOpenAI, tmp_path: Path) -> None:  # noqa: F811
    from nanobot.cron.store import CronStore

    root = api["base"].removesuffix("/v1") + "/"
    rt = api["gateway"].runtime
    await (await CronStore.open(rt.db)).add(name="tea timer", owner_session="api:ada", schedule_kind="every",
                                            expression="3600", timezone="UTC", payload_kind="code",
                                            payload="print('tea is ready')")
    await rt.deps.services.pairing.request("telegram", "555", "carol")
    await rt.usage.record_call("api:ada", "tools", "m", 100, 20, cost=0.25)
    playwright, browser, page = await browser_page()
    try:
        await sign_in(page, root, api["owner"])
        await page.wait_for_selector("#chat:not([hidden])")
        await page.click("#nav-cron")
        await shows(page, "#jobs", "tea timer")
        await page.click("#jobs button:text('Disable')")
        await shows(page, "#jobs", "disabled")
        await page.click("#jobs button:text('Run now')")
        # It ran (its output is kept in the API chat's history): the run shows under the job.
        await shows(page, "#jobs pre", "tea is ready")
        await page.screenshot(path=str(tmp_path / "page-cron.png"))
        await page.click("#nav-pairing")
        await shows(page, "#requests", "carol")
        await page.click("#requests button:text('Approve')")
        await shows(page, "#paired", "carol")
        await page.click("#nav-usage")
        await page.wait_for_function("document.querySelectorAll('#chart rect').length === 30")
        assert "$0.2500" in await page.locator("#usage-note").inner_text()
        await page.screenshot(path=str(tmp_path / "page-usage.png"))
    finally:
        await browser.close()
        await playwright.stop()
    job = (await (await CronStore.open(rt.db)).list())[0]
    assert not job.enabled and await rt.deps.services.pairing.is_paired("telegram", "555")
