"""Sent documents as text: PDF (pypdf), Word (python-docx), and plain text formats.

The text is capped at ``MAX_CHARS``; a PDF with no text layer (a scan) is reported as such
rather than handed over as an empty string the model would take at face value.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

MAX_CHARS = 400_000  # of extracted text per document (about 100 pages)
MAX_PAGES = 500
PARSED_SUFFIXES = {".pdf", ".docx"}  # parsed by a library (in a child process); the rest is read as text
# A DOCX is a zip: what its members would inflate to is checked before any of it is parsed
# (a 432 KB file can hold 140 MB of XML, which lxml turns into gigabytes: 30 MB of XML took
# 11 s and 390 MB here). Pictures inside are kept as bytes, not parsed, so they get more room.
MAX_UNZIPPED_XML = 16 * 1024 * 1024
MAX_UNZIPPED_BYTES = 100 * 1024 * 1024


class NoText(ValueError):
    """The document has no text to extract (a scanned PDF, an empty file)."""


@dataclass(frozen=True)
class DocumentText:
    text: str
    truncated: bool  # cut at MAX_CHARS
    pages: int | None = None


def extract_text(path: Path | BinaryIO, name: str | None = None) -> DocumentText:
    """The document's text; NoText when there is none, ValueError when it cannot be read.
    ``path`` may be an open file (one checked through ``beneath``), then ``name`` is its name."""
    shown = name or Path(path).name  # type: ignore[arg-type]
    suffix = Path(shown).suffix.lower()
    if suffix == ".pdf":
        text, pages = _pdf_text(path, shown)
    elif suffix == ".docx":
        text, pages = _docx_text(path, shown), None
    else:
        with _binary(path) as f:  # only what can be kept, not the whole file
            text, pages = f.read(MAX_CHARS * 4).decode("utf-8", errors="replace"), None
    if not text.strip():
        if suffix == ".pdf":
            raise NoText(f"{shown} has no text layer ({pages} page(s), probably scanned images); "
                         "I cannot read scans (no OCR here)")
        raise NoText(f"{shown} has no text")
    return DocumentText(text[:MAX_CHARS], len(text) > MAX_CHARS, pages)


@contextlib.contextmanager
def _binary(path: Path | BinaryIO) -> Iterator[BinaryIO]:
    """``path`` opened for reading, or the open file itself from its start (left open)."""
    if isinstance(path, Path):
        with path.open("rb") as f:
            yield f
    else:
        path.seek(0)
        yield path


def _pdf_text(path: Path | BinaryIO, name: str) -> tuple[str, int]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        with _binary(path) as f:
            reader = PdfReader(f)
            if reader.is_encrypted and not reader.decrypt(""):
                raise ValueError(f"{name} is password-protected")
            pages, size = [], 0
            for page in reader.pages[:MAX_PAGES]:
                pages.append(page.extract_text() or "")
                size += len(pages[-1])
                if size > MAX_CHARS:
                    break
            return "\n\n".join(p.strip() for p in pages), len(reader.pages)
    except (PdfReadError, OSError, KeyError) as exc:
        raise ValueError(f"{name} is not a PDF I can read ({exc})") from None


def check_unzipped_size(path: Path | BinaryIO, name: str) -> None:
    """ValueError when the archive would inflate past the caps (sizes from its directory; one
    that lies is still stopped by the parsing process's memory and CPU limits)."""
    import zipfile

    try:
        with _binary(path) as f, zipfile.ZipFile(f) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{name} is not a Word document I can read ({exc})") from None
    xml = sum(m.file_size for m in members if not m.filename.startswith("word/media/"))
    total = sum(m.file_size for m in members)
    for size, limit, what in ((xml, MAX_UNZIPPED_XML, "text and markup"), (total, MAX_UNZIPPED_BYTES, "in all")):
        if size > limit:
            raise ValueError(f"{name} would unpack to {size / 1048576:,.0f} MB of {what}; "
                             f"I read documents up to {limit // 1048576} MB")


def _docx_text(path: Path | BinaryIO, name: str) -> str:
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    check_unzipped_size(path, name)
    try:
        with _binary(path) as f:
            document = docx.Document(f)
    except (PackageNotFoundError, KeyError, ValueError, OSError) as exc:
        raise ValueError(f"{name} is not a Word document I can read ({exc})") from None
    lines = [p.text for p in document.paragraphs]
    for table in document.tables:  # tables are not in .paragraphs
        for row in table.rows:
            lines.append(" | ".join(cell.text for cell in row.cells))
    return "\n".join(lines)
