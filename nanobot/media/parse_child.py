"""The child process that parses one untrusted file or web page: ``python -I -m
nanobot.media.parse_child KIND FD NAME`` (FD: the file, opened and checked by the daemon,
inherited; NAME: its name, for messages).

A sent file is an attacker's input to pypdf, python-docx (lxml) and Pillow: a 400 KB DOCX can
inflate to gigabytes, a PNG header can claim a billion pixels. So the daemon never parses one
itself; this process does, under the limits the daemon passes in the environment
(``NANOBOT_PARSE_LIMITS``: CPU seconds and bytes of address space), and, where the kernel
offers them, under the shell's confinement (no capabilities, Landlock: read the system, the
Python installation; the file is the inherited descriptor; seccomp: no sockets). It prints one JSON object:
``{"text", "truncated", "pages"}`` for a document, ``{"jpeg": base64}`` for an image,
``{"title", "markdown", "complete"}`` for a web page (KIND ``page``: FD 0, the page on stdin as
``{"html", "url", "max_chars"}``), or ``{"error", "no_text"}`` for one it refused or could not read.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import BinaryIO

from nanobot import confine


def _confine(cpu_seconds: int, memory_bytes: int) -> None:
    """rlimits always; the rest when this kernel can (the limits are what stop a bomb)."""
    confine.set_rlimits(cpu_seconds, 0, memory_bytes)  # no file may be written
    if not confine.probe().ok:
        return
    arch = confine.current_arch()
    abi = confine.landlock_abi()
    confine.drop_capabilities()
    confine.set_no_new_privs()
    program = confine.shell_filter(arch, network=False, abi=abi, protected_pid=os.getppid())
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # an editable install lives elsewhere
    readable = {sys.prefix, sys.base_prefix, sys.exec_prefix, *filter(os.path.isdir, sys.path), package}
    confine.apply_landlock(abi, [*confine.SYSTEM_READ_PATHS, *sorted(readable)],
                           list(confine.SYSTEM_WRITE_PATHS), network=False)
    confine.install_seccomp(program)


def _parse(kind: str, file: BinaryIO, name: str) -> dict:
    if kind == "page":
        from nanobot.media.html_markdown import html_to_markdown

        page = json.load(file)
        title, markdown, complete = html_to_markdown(page["html"], page["url"], page["max_chars"])
        return {"title": title, "markdown": markdown, "complete": complete}
    if kind == "image":
        from nanobot.media.images import resized_jpeg

        return {"jpeg": base64.b64encode(resized_jpeg(file, name)).decode("ascii")}
    from nanobot.media.documents import NoText, extract_text

    try:
        doc = extract_text(file, name)
    except NoText as exc:
        return {"error": str(exc), "no_text": True}
    return {"text": doc.text, "truncated": doc.truncated, "pages": doc.pages}


def main(argv: list[str]) -> int:
    kind, fd, name = argv
    cpu_seconds, memory_bytes = (int(v) for v in os.environ["NANOBOT_PARSE_LIMITS"].split(","))
    _confine(cpu_seconds, memory_bytes)
    try:
        with os.fdopen(int(fd), "rb") as file:
            result = _parse(kind, file, name)
    except MemoryError:
        result = {"error": "it needs more memory to read than I allow for one file", "no_text": False}
    except (ValueError, OSError, RecursionError) as exc:
        result = {"error": str(exc), "no_text": False}
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
