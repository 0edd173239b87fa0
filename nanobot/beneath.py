"""Files under a folder someone else can change (a member chat's folder, its inbox, what it
uploads): opened, read, written and served without following a link that someone made.

A member's shell or an emailed archive can put a symlink anywhere in its folder, and swap a
folder for one at any moment. So nothing here checks a path and then opens it again by name:
the walk opens each component relative to the one before with ``O_NOFOLLOW`` (a link is
refused, never followed), and a file is checked (a regular file with one link: a hard link
can bring in a file from elsewhere) through the very descriptor that is then read or served.
The folder itself (``root``) is opened as it is: it is the daemon's, not the member's.

``tools/paths.py`` pins the file tools' paths the same way, through ``walk_dirs`` below.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path, PurePosixPath
from typing import Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class LinkRefused(PermissionError):
    """A link (or a folder swapped for one) on a path that must not follow links."""


def parts_of(relative: str) -> tuple[str, ...]:
    """The components of a path relative to a folder; ValueError for one that leaves it."""
    path = PurePosixPath(relative)
    if "\x00" in relative or path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"{relative!r} is not a path inside the folder")
    return tuple(p for p in path.parts if p != ".")


def walk_dirs(fd: int, parts: tuple[str, ...], shown: str, *, create: bool = False, mode: int = 0o700) -> int:
    """Open the folder ``parts`` below the open folder ``fd`` one component at a time, never
    following a link (made when missing and ``create``). Returns a new descriptor; ``fd`` stays
    open. A link on the way is LinkRefused, a missing folder FileNotFoundError."""
    current = os.dup(fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=current)
            try:
                child = os.open(part, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            except FileNotFoundError:
                raise FileNotFoundError(f"{shown}: no such file or directory") from None
            except OSError as exc:
                # O_DIRECTORY|O_NOFOLLOW on a symlink fails with ENOTDIR (or ELOOP): tell the two apart.
                if exc.errno == errno.ELOOP or _is_link(part, current):
                    raise LinkRefused(f"{shown!r}: a folder on the path is a link; links are not followed here") \
                        from None
                if exc.errno == errno.ENOTDIR:
                    raise NotADirectoryError(f"{shown}: a parent of it is not a directory") from None
                raise
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def parent_of(root: Path, relative: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """(the open folder holding ``relative``, its last component), reached without links."""
    parts = parts_of(relative)
    if create:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    top = os.open(root, DIR_FLAGS)
    try:
        folder = walk_dirs(top, parts[:-1], relative, create=create)
    finally:
        os.close(top)
    try:
        yield folder, parts[-1]
    finally:
        os.close(folder)


def make_dirs(root: Path, relative: str) -> None:
    """The folder ``relative`` under ``root`` and those above it (0700), made without following a link."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    top = os.open(root, DIR_FLAGS)
    try:
        os.close(walk_dirs(top, parts_of(relative), relative, create=True))
    finally:
        os.close(top)


def open_file(root: Path, relative: str, *, hard_links: bool = False) -> int:
    """A descriptor of the regular file ``relative`` under ``root``, for reading: no link on
    the way or at the end, not a FIFO or device, not hard-linked. Check and read through it."""
    with parent_of(root, relative) as (folder, name):
        return open_regular(folder, name, relative, hard_links=hard_links)


def open_regular(folder: int, name: str, relative: str, *, hard_links: bool = False) -> int:
    """``open_file`` for the last component, in the open ``folder`` (``hard_links``: a file with
    other names is read too, where a change made through another name must be seen)."""
    fd = open_last(folder, name, os.O_RDONLY | os.O_NONBLOCK, relative)  # a FIFO must not hang us
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(f"{relative} is a directory") if stat.S_ISDIR(st.st_mode) \
                else ValueError(f"{relative} is not a regular file")
        if st.st_nlink > 1 and not hard_links:
            raise LinkRefused(f"{relative} has {st.st_nlink} hard links; such files are not read here")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened(root: Path, relative: str, *, hard_links: bool = False) -> Iterator[int]:
    """``open_file`` as a context: the descriptor is closed after."""
    fd = open_file(root, relative, hard_links=hard_links)
    try:
        yield fd
    finally:
        os.close(fd)


def read_bytes(root: Path, relative: str, limit: int | None = None, *, hard_links: bool = False) -> bytes:
    """The whole file (ValueError past ``limit`` bytes)."""
    with opened(root, relative, hard_links=hard_links) as fd:
        return read_all(fd, relative, limit)


def read_all(fd: int, relative: str, limit: int | None = None, hint: str = "") -> bytes:
    """What is left to read of ``fd``; ValueError past ``limit`` bytes (``hint``: what to do instead)."""
    chunks, size = [], 0
    if limit is not None and os.fstat(fd).st_size > limit:
        size = limit + 1  # too big already: not read
    while (limit is None or size <= limit) and (chunk := os.read(fd, 1 << 16)):  # it may grow as it is read
        chunks.append(chunk)
        size += len(chunk)
    if limit is not None and size > limit:
        raise ValueError(f"{relative} is over the {limit:,}-byte limit" + (f"; {hint}" if hint else ""))
    return b"".join(chunks)


def size_of(root: Path, relative: str) -> int:
    with opened(root, relative) as fd:
        return os.fstat(fd).st_size


def open_last(folder: int, name: str, flags: int, relative: str, mode: int = 0o600) -> int:
    """The last component, opened in ``folder`` without following a link there (LinkRefused)."""
    try:
        return os.open(name, flags | _NOFOLLOW, mode, dir_fd=folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"{relative}: no such file or directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(f"{relative!r} is a link; links are not followed here") from None
        raise


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``, then to the disk (fsync)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_bytes(root: Path, relative: str, data: bytes) -> None:
    """Write ``relative`` whole (folders made as needed, 0700; the file 0600), see ``replace_file``."""
    with parent_of(root, relative, create=True) as (folder, name):
        replace_file(folder, name, data, relative)


def replace_file(folder: int, name: str, data: bytes, relative: str, *, mode: int = 0o600,
                 keep_mode: bool = False) -> None:
    """Write ``name`` in ``folder`` whole: into a new temporary file in the same folder, then
    renamed over the name, so a crash leaves the old file or the new one, and a link at the
    name is replaced, never written through. ``keep_mode``: an existing file keeps its mode."""
    try:
        old = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if name == "." or (old is not None and stat.S_ISDIR(old.st_mode)):
        raise IsADirectoryError(f"{relative} is a directory")
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=folder)
    try:
        try:
            if keep_mode and old is not None and stat.S_ISREG(old.st_mode):
                os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)
            write_all(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def append_text(root: Path, relative: str, text: str, header: str = "") -> None:
    """Append to a text file (made with ``header`` when new or empty), without following a link."""
    with parent_of(root, relative, create=True) as (folder, name):
        try:  # a named pipe nobody reads would block the open (and the event loop) for ever
            fd = open_last(folder, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, relative)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            raise LinkRefused(f"{relative} is not a plain file of this folder") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                raise LinkRefused(f"{relative} is not a plain file of this folder")
            write_all(fd, ((header if st.st_size == 0 else "") + text).encode("utf-8"))
        finally:
            os.close(fd)


def is_link_free(root: Path, relative: str) -> bool:
    """Whether ``relative`` names a file under ``root`` reached without links (and not hard-linked)."""
    try:
        with opened(root, relative):
            return True
    except (OSError, ValueError):
        return False
