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
ANSWER = ("You have **3 scheduled jobs**:\n\n| job | when | last run |\n| --- | --- | --- |\n"
          "| status check | weekdays at 09:00 | today, 0.4 s |\n| backup | every night at 02:30 | 41 s |\n"
          "| tea timer | every hour | 12:00 |\n\nThe backup is the slow one; to see its log:\n\n"
          "```bash\nnanobot cron runs backup --limit 3\n```")
# (file name, width, height, dark, view): the chat on a desktop and a phone, light and dark, and
# the owner's usage and status views.
SHOTS = [("page-chat.png", 1100, 640, False, "chat"), ("page-chat-dark.png", 1100, 640, True, "chat"),
         ("page-phone.png", 375, 740, False, "chat"), ("page-phone-dark.png", 375, 740, True, "chat"),
         ("page-usage.png", 1100, 640, False, "usage"), ("page-status.png", 1100, 640, True, "status")]


async def shoot(root: str, key: str, name: str, width: int, height: int, dark: bool, view: str) -> None:
    async with browser_page(width=width, height=height, dark=dark) as page:
        await sign_in(page, root, key)
        if view == "chat":
            await page.wait_for_function("() => [...document.querySelectorAll('#messages > li.assistant')]"
                                         ".some(li => li.textContent.includes('log:'))")
        else:
            await page.click(f"#nav-{view}")
            await page.wait_for_selector({"usage": "#chart rect", "status": "#status-list dt"}[view])
        await page.screenshot(path=str(IMAGES / name))


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
                root = f"http://{config.gateway.api.listen}/"
                await some_usage(gateway.runtime.db)
                await ask_once(root, key)
                for shot in SHOTS:
                    await shoot(root, key, *shot)
                    print(f"wrote {IMAGES / shot[0]}")


async def some_usage(db) -> None:  # type: ignore[no-untyped-def]
    """A month of made-up model calls, so the usage picture has something to show."""
    import random
    import time

    pick = random.Random(7)
    for day in range(30):
        for _ in range(pick.randint(2, 9)):
            model, price = pick.choice([("gpt-5-mini", 0.004), ("claude-sonnet-4.5", 0.03)])
            await db.execute(
                "INSERT INTO model_calls (ts, session_key, mode, purpose, model, prompt_tokens, completion_tokens, "
                "outcome, provider, cost_usd, member) VALUES ($1, $2, 'code', 'turn', $3, 3000, 400, 'ok', "
                "'openai', $4, 0)", time.time() - day * 86400, pick.choice(["telegram:ada", "api:ada", "cron:backup"]),
                model, price * pick.uniform(0.5, 2))


async def ask_once(root: str, key: str) -> None:
    """One real exchange through the page, so every picture shows the same history."""
    async with browser_page() as page:
        await sign_in(page, root, key)
        await page.fill("#text", "what is scheduled?")
        await page.press("#text", "Enter")
        await page.wait_for_function("() => [...document.querySelectorAll('#messages > li.assistant')]"
                                     ".some(li => li.textContent.includes('log:'))")
        await page.get_by_role("button", name="Stop").wait_for(state="hidden")


if __name__ == "__main__":
    asyncio.run(main())
