"""The workspace path guard shared by every tool that touches files.

Two rules, checked on the *real* path (``..`` collapsed, ``~`` expanded, symlinks followed):

1. With ``tools.restrictToWorkspace`` (the default) a path must lie inside the real workspace.
2. Always: nothing inside ``NANOBOT_HOME`` (config.json with API keys, nanobot.db, sessions/)
   is reachable, except the workspace subtree when the workspace itself lives in the home
   (the default ``~/.nanobot/workspace``).

Checking a path and then opening it leaves a window in which a directory can be swapped for a
symlink. ``pinned_parent`` closes most of it: it opens the checked parent directory, confirms
the open descriptor is the directory that was checked, and callers open the last component
relative to that descriptor with ``O_NOFOLLOW``. Hard links are out of scope: making one takes
a shell, and ``exec_command`` is not sandboxed anyway.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from nanobot.config import nanobot_home

if TYPE_CHECKING:
    from nanobot.tools.registry import ToolContext

__all__ = ["resolve_in_workspace", "display_path", "pinned_parent", "open_pinned", "Pinned"]


def _settings(ctx_or_workspace: ToolContext | Path | str) -> tuple[Path, bool]:
    """(workspace, restrict): a bare workspace path means the default, restricted."""
    if isinstance(ctx_or_workspace, (str, os.PathLike)):
        return Path(ctx_or_workspace).expanduser(), True
    return Path(ctx_or_workspace.workspace).expanduser(), ctx_or_workspace.config.tools.restrict_to_workspace


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def display_path(path: Path, workspace: Path) -> str:
    """``path`` as the model should see it: relative to the workspace when inside it."""
    ws = workspace.resolve()
    if _inside(path, ws):
        rel = path.relative_to(ws).as_posix()
        return rel if rel != "." else "."
    return str(path)


def _check(real: Path, ws: Path, restrict: bool, shown: str) -> None:
    """Raise PermissionError unless the real path ``real`` may be used (``ws`` is real too)."""
    if restrict and not _inside(real, ws):
        raise PermissionError(
            f"{shown!r} is outside the workspace ({ws}); use a path relative to the workspace"
        )
    home = nanobot_home().resolve()
    if _inside(real, home):
        workspace_in_home = ws != home and ws.is_relative_to(home)
        if not (workspace_in_home and _inside(real, ws)):
            where = "the workspace" if restrict else "the allowed paths"
            raise PermissionError(
                f"{shown!r} is outside {where}: it is inside NANOBOT_HOME ({home}), "
                f"which file tools never touch; the workspace is {ws}"
            )


def resolve_in_workspace(ctx_or_workspace: ToolContext | Path | str, path: str, *, must_exist: bool = False) -> Path:
    """The real absolute path for ``path``, or PermissionError if it leaves the allowed area.

    Relative paths are relative to the workspace; ``~`` is expanded. Accepts a ToolContext
    (honours ``tools.restrict_to_workspace``) or a bare workspace path (always restricted).
    """
    workspace, restrict = _settings(ctx_or_workspace)
    if "\x00" in path:
        raise ValueError("path contains a NUL byte")
    try:
        candidate = Path(path).expanduser()
    except RuntimeError:  # "~user" that does not exist, or no HOME
        raise ValueError(f"cannot expand {path!r}") from None
    ws = workspace.resolve()
    real = (ws / candidate).resolve(strict=False)  # joining an absolute path keeps it as is
    _check(real, ws, restrict, path)
    if must_exist and not real.exists():
        raise FileNotFoundError(f"{display_path(real, ws)}: no such file or directory")
    return real


@dataclass(frozen=True)
class Pinned:
    """A checked parent directory held open, and the last component to open relative to it."""

    dir_fd: int
    name: str  # open with dir_fd=..., and O_NOFOLLOW
    path: Path  # the real path, for messages
    shown: str  # the path as the model should see it


def _fd_path(fd: int) -> Path | None:
    """Where an open directory really is, if the OS can tell (Linux /proc, macOS F_GETPATH)."""
    with contextlib.suppress(OSError):
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    getpath = getattr(fcntl, "F_GETPATH", None)
    if getpath is not None:
        with contextlib.suppress(OSError):
            raw = fcntl.fcntl(fd, getpath, b"\0" * 1024)
            return Path(os.fsdecode(raw.rstrip(b"\0")))
    return None


@contextlib.contextmanager
def pinned_parent(ctx_or_workspace: ToolContext | Path | str, path: str, *, create_parents: bool = False) -> Iterator[Pinned]:
    """Check ``path``, open its parent directory, and confirm that it is the one checked.

    Callers then ``os.open(pinned.name, flags | os.O_NOFOLLOW, dir_fd=pinned.dir_fd)``: a
    directory swapped for a symlink between check and open is detected here, a last
    component swapped for a symlink fails the open with ELOOP.
    """
    workspace, _ = _settings(ctx_or_workspace)
    real = resolve_in_workspace(ctx_or_workspace, path)
    shown = display_path(real, workspace)
    parent, name = (real.parent, real.name) if real.parent != real else (real, ".")
    if create_parents:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise NotADirectoryError(f"{shown}: a parent of it is a file, not a directory") from None
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{shown}: no such file or directory") from None
    except NotADirectoryError:
        raise NotADirectoryError(f"{shown}: a parent of it is not a directory") from None
    try:
        opened = _fd_path(dir_fd)
        if opened is None:  # no way to ask the OS: compare identities after a fresh resolve
            st = os.fstat(dir_fd)
            again = parent.resolve()
            same = again == parent and os.path.samestat(st, os.stat(again))
        else:
            same = opened == parent
        if not same or not stat.S_ISDIR(os.fstat(dir_fd).st_mode):
            raise PermissionError(f"{shown!r}: a directory on the path changed while it was being opened")
        yield Pinned(dir_fd, name, real, shown)
    finally:
        os.close(dir_fd)


def open_pinned(pinned: Pinned, flags: int, mode: int = 0o666) -> int:
    """Open the pinned last component without following a symlink there."""
    try:
        return os.open(pinned.name, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=pinned.dir_fd)
    except FileNotFoundError:
        raise FileNotFoundError(f"{pinned.shown}: no such file or directory") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{pinned.shown} is a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"{pinned.shown!r} became a symlink while it was being opened") from None
        raise
