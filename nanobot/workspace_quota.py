"""``tools.maxWorkspaceMb``: how far the workspace may fill. The file tools, the files chats send
and the page's uploads all write there, members' folders included: without one limit for all, a
member could fill the disk the database is on, and every chat would stop.

Walking a large workspace on every write would cost more than the write, so the total is
re-counted at most every few seconds and the bytes written in between are added to it. A
shell command is held to the room left as it runs, by the free space of its file system (its
RLIMIT_FSIZE bounds only each file it writes; see tools/shell.py).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

RECOUNT_SECONDS = 5.0
# What a file or folder takes of the disk at least (a block, and an inode): a loop of empty files
# fills a disk's inodes as surely as big ones fill its bytes.
FILE_COST = 4096
_usage: dict[Path, tuple[float, int]] = {}  # workspace -> (when counted, bytes)


class WorkspaceFull(PermissionError):
    """The write would pass ``tools.maxWorkspaceMb``; says so in one line."""


def workspace_bytes(root: Path) -> int:
    """What the files and folders under ``root`` take: their sizes, each at least ``FILE_COST``
    (symlinks not followed)."""
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
                    total += max(st.st_size, FILE_COST)
        except OSError:
            continue
    return total


def check_room(root: Path, limit_mb: int, adding: int) -> None:
    """WorkspaceFull if writing ``adding`` more bytes under ``root`` would pass ``limit_mb``; else
    the bytes are counted as written."""
    counted_at, used = _counted(root)
    if used + adding > limit_mb * 2**20:
        raise WorkspaceFull(f"the workspace is full: {used / 2**20:.1f} MiB used, this write needs "
                            f"{adding / 2**20:.1f} MiB more, the limit is {limit_mb} MiB "
                            "(tools.maxWorkspaceMb); delete something first")
    _usage[root] = (counted_at, used + adding)


def room_left(root: Path, limit_mb: int) -> int:
    """Bytes the workspace may still take (what a shell command may write as it runs)."""
    return limit_mb * 2**20 - _counted(root)[1]


def _counted(root: Path) -> tuple[float, int]:
    """(when counted, bytes used): counted again when the last count is a few seconds old."""
    counted_at, used = _usage.get(root, (0.0, 0))
    if (now := time.monotonic()) - counted_at > RECOUNT_SECONDS:
        counted_at, used = _usage[root] = now, workspace_bytes(root)
    return counted_at, used
