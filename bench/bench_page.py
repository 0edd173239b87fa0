"""The web page's weight and its time to interactive in chromium (Playwright), served by a
gateway in this process with the API on: the sign-in form ready (its scripts, the vendored
Markdown parser and sanitizer included, have run: DOMContentLoaded's end), and with a key in
the tab's storage, the chat drawn (conversations and history loaded).

    python bench/bench_page.py
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.api import keys as api_keys
from nanobot.api.keys import ApiKeys
from nanobot.api.server import PAGE_FILES, WEB
from tests.fakes.openai_server import FakeOpenAI
from tests.helpers import config_for, running_gateway


async def main() -> None:
    from playwright.async_api import async_playwright

    api_keys.REFRESH_S = 0.0  # the key made below works at once
    weight = sum((WEB / name).stat().st_size for name in PAGE_FILES)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeOpenAI() as llm:
            config = config_for(llm.base_url, Path(tmp))
            config.use_home(Path(tmp) / "home")
            config.gateway.heartbeat.enabled = False
            config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{port}"
            async with running_gateway(config, with_services=True) as gateway, async_playwright() as p:
                key = await ApiKeys(gateway.runtime.db).add("ada", owner=True)
                browser = await p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
                page = await (await browser.new_context(bypass_csp=True)).new_page()
                form, chat = [], []
                for _ in range(7):
                    await page.goto(f"http://127.0.0.1:{port}/")
                    await page.wait_for_selector("#key")
                    form.append(await page.evaluate(
                        "performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
                await page.evaluate(f"sessionStorage.setItem('nanobot-key', '{key}')")
                for _ in range(7):
                    await page.goto(f"http://127.0.0.1:{port}/")
                    await page.wait_for_function("document.querySelector('#conversation-list li')")
                    chat.append(await page.evaluate("performance.now()"))
                await browser.close()
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    print(f"page weight (HTML + JS + CSS + vendored libraries): {weight:,} bytes (goal < 300 KB)")
    print(f"time to interactive in chromium, local (median of 7): sign-in form {median(form):.0f} ms; "
          f"signed in, the chat drawn {median(chat):.0f} ms (goal < 100 ms)")


if __name__ == "__main__":
    asyncio.run(main())
