"""Downloading one page for web_fetch: through the SSRF guard, redirects by hand, body capped."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from yarl import URL

from nanobot.tools.ssrf import NONE_ALLOWED, Allowed, BlockedAddressError, GuardedResolver, check_url

MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; nanobot/0.1)"
_REDIRECTS = {301, 302, 303, 307, 308}


@dataclass
class Page:
    url: str
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool


async def download(url: str, max_bytes: int, allowed: Allowed = NONE_ALLOWED) -> Page:
    """``allowed``: private (address, port) pairs that may be fetched all the same."""
    target = check_url(url, allowed)
    # The guarded resolver vets every address at connect time; no env proxy may do the
    # resolving for us (trust_env=False), and redirects are followed here, hop by hop.
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(allowed), use_dns_cache=False)
    headers = {"User-Agent": USER_AGENT, "Accept": "text/html,text/plain,application/json;q=0.9,*/*;q=0.5"}
    async with aiohttp.ClientSession(connector=connector, trust_env=False, headers=headers) as session:
        for _ in range(MAX_REDIRECTS + 1):
            result = await _hop(session, target, max_bytes, allowed)
            if isinstance(result, Page):
                return result
            target = result
    raise RuntimeError(f"web_fetch: too many redirects (more than {MAX_REDIRECTS}) starting at {url}")


async def _hop(session: aiohttp.ClientSession, target: URL, max_bytes: int, allowed: Allowed) -> Page | URL:
    """One request: the page, or the vetted URL it redirects to."""
    try:
        async with session.get(target, allow_redirects=False) as resp:
            location = resp.headers.get("Location")
            if resp.status in _REDIRECTS and location:
                return check_url(target.join(URL(location)), allowed)
            if resp.status >= 400:
                hint = ", rate limited, try again later" if resp.status == 429 else ""
                raise RuntimeError(f"web_fetch: HTTP {resp.status} {resp.reason or ''}{hint} from {target}")
            body, truncated = await _read_capped(resp, max_bytes)
            return Page(str(target), resp.content_type, resp.charset, body, truncated)
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, BlockedAddressError):  # our resolver said no
            raise exc.os_error from None
        raise RuntimeError(f"web_fetch: cannot connect to {target.host}: {exc.os_error}") from None
    except aiohttp.ClientError as exc:
        raise RuntimeError(f"web_fetch: {target}: {exc}") from None


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes, then stop (closing the connection), however big the body."""
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False
