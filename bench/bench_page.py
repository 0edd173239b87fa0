"""The web page's weight and its time to interactive in chromium (Playwright), served by a
gateway in this process with the API on.

    python bench/bench_page.py
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.api.server import PAGE_FILES, WEB
from tests.fakes.openai_server import FakeOpenAI
from tests.helpers import config_for, running_gateway


async def main() -> None:
    from playwright.async_api import async_playwright

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
            async with running_gateway(config, with_services=True), async_playwright() as p:
                browser = await p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
                page = await (await browser.new_context(bypass_csp=True)).new_page()
                times = []
                for _ in range(5):
                    await page.goto(f"http://127.0.0.1:{port}/")
                    await page.wait_for_selector("#key")
                    times.append(await page.evaluate(
                        "performance.getEntriesByType('navigation')[0].domInteractive"))
                await browser.close()
    print(f"page weight (HTML + JS + CSS): {weight:,} bytes (goal < 100 KB); time to interactive in chromium, "
          f"local: {sorted(times)[len(times) // 2]:.0f} ms (median of 5)")


if __name__ == "__main__":
    asyncio.run(main())
