"""Steering files (AGENTS.md, SOUL.md, USER.md, TOOLS.md, HEARTBEAT.md, memory/, skills/): who may
change them, and how a change is announced.

They decide what the assistant does in every later turn, so a change to one is a lasting
change: only an owner chat may make it, never in a turn that read outside content (a web
page or document could have asked for it), and every change is announced to the owner.
The file tools ask before writing (``check_change``); the shell, which can write anything in
its folder, is checked afterwards: ``Snapshot`` records the files before a command, and a
change a tainted turn made is rolled back and refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nanobot import beneath
from nanobot.trust import OWNER, STEERING_DIRS, STEERING_FILES, steering_name

if TYPE_CHECKING:
    from nanobot.tools.registry import ToolContext

MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024  # what a tainted turn's shell command may have to restore


def steering_target(ctx: ToolContext, real: Path) -> str | None:
    """The steering file or folder ``real`` (a resolved path) is in, for this chat, or None."""
    root = Path(ctx.workspace).resolve()
    if not real.is_relative_to(root):
        return None
    return steering_name(real.relative_to(root).as_posix())


def refusal(ctx: ToolContext, name: str) -> PermissionError | None:
    """Why this turn may not change steering file(s) ``name``, or None when it may."""
    if ctx.trust != OWNER:
        return PermissionError(f"{name} steers the assistant and can only be changed from the owner's chat")
    return ctx.guard.refusal(f"changing {name}")


def check_change(ctx: ToolContext, name: str) -> None:
    """PermissionError unless this turn may change steering file ``name`` (file tools, before writing)."""
    if error := refusal(ctx, name):
        raise error


async def announce_change(ctx: ToolContext, names: list[str], how: str) -> None:
    await ctx.announce(f"{', '.join(names)} changed by {ctx.session_key} ({how}).")


async def settle(ctx: ToolContext, before: Snapshot, how: str) -> None:
    """After a shell command: undo and refuse the steering changes this turn may not make,
    announce the ones it may."""
    changed = await asyncio.to_thread(before.changed)  # off the event loop: a walk, and writes
    if not changed:
        return
    if error := refusal(ctx, ", ".join(changed)):
        await asyncio.to_thread(before.restore, changed)
        raise PermissionError(f"{error}; the command's change was undone")
    await announce_change(ctx, changed, how)


@dataclass
class Snapshot:
    """The steering files under a chat root before a shell command: stats, and (for a tainted
    turn, which must be rolled back) their bytes."""

    root: Path
    keep_bytes: bool
    stats: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # rel -> (ino, size, mtime, mode)
    contents: dict[str, bytes] = field(default_factory=dict)  # up to MAX_SNAPSHOT_BYTES in all

    @classmethod
    def take(cls, root: Path, *, keep_bytes: bool) -> Snapshot:
        snap = cls(root, keep_bytes)
        kept = 0
        for rel, st in _steering_files(root):
            snap.stats[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
            if keep_bytes:
                kept += st.st_size
                if kept > MAX_SNAPSHOT_BYTES:
                    continue
                # Never through a link (a member's other command may have made one to the daemon's
                # files) nor from a named pipe (it would block); a hard-linked file is read: a
                # change made through its other name must be undone too. It may have grown since.
                with contextlib.suppress(OSError, ValueError):
                    snap.contents[rel] = beneath.read_bytes(root, rel, MAX_SNAPSHOT_BYTES, hard_links=True)
        return snap

    def changed(self) -> list[str]:
        now = {rel: (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode) for rel, st in _steering_files(self.root)}
        return sorted(rel for rel in set(now) | set(self.stats) if now.get(rel) != self.stats.get(rel))

    def restore(self, changed: list[str]) -> None:
        """Put the files back as they were: changed ones rewritten, new ones removed. A file
        too large to have been kept is left as it is (never deleted); the change is still refused."""
        for rel in changed:  # sorted: a folder swapped for a link goes before what was in it
            if rel in self.stats and rel not in self.contents:
                continue
            with contextlib.suppress(FileNotFoundError), beneath.parent_of(self.root, rel) as (folder, name):
                _remove(folder, name)
            if rel in self.contents:
                with beneath.parent_of(self.root, rel, create=True) as (folder, name):
                    beneath.replace_file(folder, name, self.contents[rel], rel,
                                         mode=stat.S_IMODE(self.stats[rel][3]))


def _remove(folder: int, name: str) -> None:
    """Whatever ``name`` is now (a file, link, named pipe, or folder), gone; a link is not followed."""
    if stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
        shutil.rmtree(name, dir_fd=folder)
    else:
        os.unlink(name, dir_fd=folder)


def _steering_files(root: Path):
    """(relative path, lstat) of every steering file and every file in a steering folder."""
    for name in STEERING_FILES:
        try:
            yield name, os.lstat(root / name)
        except OSError:
            pass
    for folder in STEERING_DIRS:
        base = root / folder
        if base.is_symlink():
            yield folder, os.lstat(base)
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for entry in (*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))):
                full = os.path.join(dirpath, entry)
                try:
                    yield os.path.relpath(full, root), os.lstat(full)
                except OSError:
                    pass
