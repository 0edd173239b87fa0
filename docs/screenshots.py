"""Makes the pictures in docs/images/ from a real gateway and a real browser, so they show
what the page is: the scripted model (tests/fakes) answers, Playwright drives Debian's
chromium (apt-get install chromium).

    .venv/bin/python docs/screenshots.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanobot.api import keys as api_keys  # noqa: E402
from nanobot.api.keys import ApiKeys  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI, reply  # noqa: E402
from tests.helpers import config_for, running_gateway  # noqa: E402
from tests.test_api import free_port  # noqa: E402
from tests.test_web_page import CHROMIUM, browser_page, sign_in  # noqa: E402

IMAGES = ROOT / "docs" / "images"
ANSWER = ("You have 3 scheduled jobs: the morning status check (weekdays at 9:00), the backup "
          "(every night at 2:30) and the tea timer (every hour). The last backup ran at 02:30 and took 41 s.")


async def main() -> None:
    if CHROMIUM is None:
        raise SystemExit("needs a browser: apt-get install chromium")
    IMAGES.mkdir(parents=True, exist_ok=True)
    api_keys.REFRESH_S = 0.0  # the key made below works at once
    with tempfile.TemporaryDirectory() as tmp:
        import os

        os.environ["NANOBOT_HOME"] = str(Path(tmp) / "home")
        async with FakeOpenAI(fallback=lambda body: reply(ANSWER)) as llm:
            config = config_for(llm.base_url, Path(tmp) / "workspace", mode="code")
            config.gateway.heartbeat.enabled = False
            config.gateway.api.enabled, config.gateway.api.listen = True, f"127.0.0.1:{free_port()}"
            async with running_gateway(config, with_services=True) as gateway:
                key = await ApiKeys(gateway.runtime.db).add("ada", owner=True)
                playwright, browser, page = await browser_page()
                try:
                    await page.set_viewport_size({"width": 900, "height": 560})
                    await sign_in(page, f"http://{config.gateway.api.listen}/", key)
                    await page.wait_for_selector("#chat:not([hidden])")
                    await page.fill("#text", "what is scheduled?")
                    await page.press("#text", "Enter")
                    await page.wait_for_function("[...document.querySelectorAll('#messages li.assistant')]"
                                                 ".some(li => li.textContent.includes('41 s'))")
                    await page.screenshot(path=str(IMAGES / "page-chat.png"))
                finally:
                    await browser.close()
                    await playwright.stop()
    print(f"wrote {IMAGES / 'page-chat.png'}")


if __name__ == "__main__":
    asyncio.run(main())
