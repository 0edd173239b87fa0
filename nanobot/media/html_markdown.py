"""HTML to Markdown for web_fetch: readability finds the main content, markdownify converts it.

readability alone deletes short lists and link lists from what it keeps, so it only picks the
*place*; the elements there, minus known clutter, are converted from our own parsed tree. The
page's other links (an index page is mostly links, which main-content extraction throws away)
follow in a "Links" list, with absolute URLs, so a reader can go on without guessing them.

markdownify takes seconds a megabyte (9 s for a megabyte of table), so only as much is converted
as will be shown (``max_chars``). A page is anyone's to write: it is converted in the parsing
process (``isolation``), never in the daemon.
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Any

import lxml.html
from lxml import etree
from markdownify import markdownify
from readability import Document

_ID = "data-nanobot-id"
MAX_LINKS = 100  # links listed after the content (site chrome is gone already: nav, header, footer)
_SHOWN_LINK = re.compile(r"(?:\]\(|<)(https?://[^\s)>]+)")  # markdownify's [text](url) and <url>
# Never content: site chrome, hidden text (a favourite hiding place for prompt injection), code.
_NOISE = etree.XPath(
    "//script | //style | //noscript | //template | //iframe | //svg | //form | //button | //nav | //aside"
    " | //footer | //header[not(ancestor::article or ancestor::main)] | //*[@hidden] | //*[@aria-hidden='true']"
    " | //*[contains(translate(@style, ' ', ''), 'display:none')] | //img[starts-with(@src, 'data:')]")


def html_to_markdown(page: str, base_url: str = "", max_chars: int = 1 << 62) -> tuple[str, str, bool]:
    """The page's title, its main content as Markdown (at least ``max_chars`` of it, where the
    page has that much), and whether that is all of it.

    readability picks *where* the main content is; the Markdown is made from the original
    elements it picked, because readability's own cleanup drops short lists, link lists and
    headings that are links, which are often exactly what the reader came for.
    """
    page = re.sub(r"^\s*<\?xml[^>]*>", "", page)  # lxml refuses str input with an encoding declaration
    try:
        tree = lxml.html.document_fromstring(page)
    except (etree.ParserError, ValueError):
        return "", page.strip(), True
    title = " ".join((tree.findtext(".//title") or "").split())
    for element in _NOISE(tree):
        element.drop_tree()
    for anchor in tree.xpath("//a[starts-with(@href, '#')]"):  # in-page anchors are noise to a reader
        # A lone symbol is a permalink marker (the "¶" after docs headings); drop it entirely.
        if len(anchor.text_content().strip()) <= 1:
            anchor.drop_tree()
        else:
            anchor.drop_tag()
    if base_url:
        tree.make_links_absolute(base_url, handle_failures="discard")
    links = _links(tree)  # before _main_content marks every element with an id
    markdown, complete = _converted(_main_content(tree), max_chars)
    shown = set(_SHOWN_LINK.findall(markdown))
    more = list(islice((f"- [{text}]({href})" for href, text in links.items() if href not in shown), MAX_LINKS))
    if more:
        markdown += "\n\nLinks on the page:\n" + "\n".join(more)
    return title, markdown, complete


def _links(tree: lxml.html.HtmlElement) -> dict[str, str]:
    """The page's web links in order, each once: absolute URL -> its text."""
    found: dict[str, str] = {}
    for anchor in tree.xpath("//a[@href]"):
        href, text = anchor.get("href", ""), " ".join(anchor.text_content().split())
        if href.startswith(("http://", "https://")) and text and href not in found:
            found[href] = text.replace("[", "(").replace("]", ")")
    return found


def _main_content(tree: lxml.html.HtmlElement) -> list[lxml.html.HtmlElement]:
    """The elements readability chose, found again in our tree by an id we gave every element."""
    elements = {}
    for i, element in enumerate(tree.iter(etree.Element)):
        element.set(_ID, str(i))
        elements[str(i)] = element
    body = tree.find("body")
    fallback = [body if body is not None else tree]
    try:
        summary = Document(lxml.html.tostring(tree, encoding="unicode")).summary(html_partial=True)
        picked = lxml.html.fromstring(summary)
    except Exception:  # readability gives up on odd pages; the whole (cleaned) body will do
        return fallback
    chosen = [picked] if picked.get(_ID) else list(picked)
    # An element readability made up itself (it turns some divs into paragraphs) has no id.
    return [elements.get(el.get(_ID) or "", el) for el in chosen] or fallback


def _converted(parts: list[lxml.html.HtmlElement], max_chars: int) -> tuple[str, bool]:
    """The parts as Markdown, until there is more than ``max_chars`` of it; whether that is all."""
    pieces: list[str] = []
    for part in parts:
        markdown, whole = _to_markdown(lxml.html.tostring(part, encoding="unicode"), max_chars)
        pieces.append(markdown)
        max_chars -= len(markdown)
        if not whole or max_chars <= 0:
            return _joined(pieces), whole and part is parts[-1]
    return _joined(pieces), True


def _to_markdown(html: str, max_chars: int) -> tuple[str, bool]:
    """``html`` as Markdown, at least ``max_chars`` of it; whether that is all. Its start is
    converted first, twice as much each time that was not enough (a cut tag is closed by the
    parser): the work stays within a few times what is shown, however long the page."""
    size = 4 * max(max_chars, 1000)
    while True:
        start = html if size >= len(html) else html[:html.rfind(">", 0, size) + 1]
        markdown = markdownify(start, heading_style="ATX", bullets="-", code_language_callback=_code_language)
        if start is html or len(markdown) > max_chars:
            return markdown, start is html
        size *= 2


def _joined(pieces: list[str]) -> str:
    return re.sub(r"\n{3,}", "\n\n", "\n\n".join(pieces)).strip()


def _code_language(pre: Any) -> str | None:
    """The language of a <pre> from the usual class="language-x" on it or its <code>."""
    code = pre.find("code")
    for cls in (pre.get("class") or []) + ((code.get("class") or []) if code is not None else []):
        if cls.startswith(("language-", "lang-")):
            return cls.split("-", 1)[1]
    return None


# ---------------------------------------------------------------------------------- untrusted

