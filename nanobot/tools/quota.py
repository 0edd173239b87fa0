"""``tools.maxWorkspaceMb``: how far the file tools may fill the workspace.

Walking a large workspace on every write would cost more than the write, so the total is
re-counted at most every few seconds and the bytes written in between are added to it. The
shell's own writes are bounded per file by its RLIMIT_FSIZE (see shell.py).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanobot.tools.registry import ToolContext

RECOUNT_SECONDS = 5.0
_usage: dict[Path, tuple[float, int]] = {}  # workspace -> (when counted, bytes)


def workspace_bytes(root: Path) -> int:
    """The size of every regular file under ``root`` (symlinks not followed)."""
    total, pending = 0, [str(root)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(entry.path)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
        except OSError:
            continue
    return total


def check_quota(ctx: ToolContext, adding: int) -> None:
    """PermissionError if writing ``adding`` more bytes would pass the workspace quota."""
    limit = ctx.config.tools.max_workspace_mb * 1024 * 1024
    root = ctx.config.workspace_path
    counted_at, used = _usage.get(root, (0.0, 0))
    now = time.monotonic()
    if now - counted_at > RECOUNT_SECONDS:
        counted_at, used = now, workspace_bytes(root)
    if used + adding > limit:
        raise PermissionError(f"the workspace is full: {used / 2**20:.1f} MiB used, this write needs "
                              f"{adding / 2**20:.1f} MiB more, the limit is {limit / 2**20:.0f} MiB "
                              "(tools.maxWorkspaceMb); delete something first")
    _usage[root] = (counted_at, used + adding)
