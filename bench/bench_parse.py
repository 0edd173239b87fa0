"""What parsing a sent file in a child process costs, against parsing it in the daemon.

    python bench/bench_parse.py

Untrusted files (PDF, DOCX, pictures) are parsed in ``nanobot.media.parse_child`` under
limits; this times that (p50 of 7) beside the same parse in this process, for a small DOCX,
a one-page PDF and a 3000x2000 photo, and a DOCX zip bomb (140 MB of XML in 0.5 MB), which
is refused before parsing. Then web pages as ``web_fetch`` reads them (the child, ``maxChars``
50,000): a small article, a megabyte of prose, and pages of 5 MB (``maxBytes``) built to be slow.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from nanobot.media.documents import extract_text
from nanobot.media.images import resized_jpeg
from nanobot.media.isolation import Unreadable, failure_marker, parse_file, parse_page
from tests.media_files import docx, docx_inflating_to, jpeg, pdf_with_text


async def main() -> None:
    folder = Path(tempfile.mkdtemp())
    files = {"docx": ("a.docx", docx("hello world")), "pdf": ("a.pdf", pdf_with_text("hello")),
             "photo 3000x2000": ("a.jpg", jpeg())}
    for label, (name, data) in files.items():
        path = folder / name
        path.write_bytes(data)
        kind = "image" if name.endswith(".jpg") else "document"
        here, child = [], []
        for _ in range(7):
            start = time.perf_counter()
            resized_jpeg(path) if kind == "image" else extract_text(path)
            here.append(time.perf_counter() - start)
            start = time.perf_counter()
            await parse_file(kind, folder, name)
            child.append(time.perf_counter() - start)
        print(f"{label}: in the daemon {statistics.median(here) * 1000:.0f} ms, "
              f"in the child {statistics.median(child) * 1000:.0f} ms")
    bomb = folder / "bomb.docx"
    bomb.write_bytes(docx_inflating_to(140))
    start = time.perf_counter()
    try:
        await parse_file("document", folder, "bomb.docx")
    except Unreadable as exc:
        print(f"zip bomb ({bomb.stat().st_size // 1024} KB): refused in {(time.perf_counter() - start) * 1000:.0f} ms: "
              f"{exc}")
    failure_marker(bomb).unlink()
    await web_pages()


PAGE_BYTES = 5_000_000  # web_fetch's maxBytes
PAGES = {
    "small article": "<html><head><title>T</title></head><body><article><h1>Hi</h1>"
                     + "<p>Some prose here, with commas, and more of it.</p>" * 50 + "</article></body></html>",
    "1 MB of prose": "<html><body><article>" + "<p>Some prose here, with commas, and more of it.</p>" * 20_000
                     + "</article></body></html>",
    "5 MB of paragraphs": "<html><body>" + "<p>word word word word</p>" * (PAGE_BYTES // 30) + "</body></html>",
    "5 MB of links": "<html><body>" + "".join(f'<a href="https://x.org/{i}">l{i}</a> '
                                              for i in range(PAGE_BYTES // 40)) + "</body></html>",
    "5 MB of table": "<html><body><table>" + "<tr><td>a</td><td>b</td></tr>" * (PAGE_BYTES // 30)
                     + "</table></body></html>",
}


async def web_pages() -> None:
    for label, html in PAGES.items():
        times = []
        for _ in range(3):
            start = time.perf_counter()
            made = await parse_page(html, "https://x.org/", 50_000)
            times.append(time.perf_counter() - start)
        print(f"web page, {label}: {statistics.median(times) * 1000:.0f} ms in the child "
              f"({len(made['markdown']):,} characters of Markdown, {'all' if made['complete'] else 'the start'})")


if __name__ == "__main__":
    asyncio.run(main())
