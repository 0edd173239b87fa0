"""``nanobot backup FILE`` and ``nanobot restore FILE``: a home in one ``.tar.gz``.

A backup holds the SQLite database, copied with SQLite's online backup API (consistent while a
gateway writes it: cron jobs, pairing, hashed API keys, usage, delivery), the JSONL histories,
``config.json``, the channels' keys (a Matrix device's, SQLite files copied the same way: without
them the restored bot could not read its encrypted rooms), and with ``--with-workspace`` the
workspace; and ``manifest.json`` with the row count of every table and the record count of
every history. The database is copied first and the histories after, so whatever was answered
before the backup began is in both.

``restore`` unpacks into an empty home, then counts again and compares with the manifest.
On PostgreSQL the database is backed up with its own tools (``pg_dump``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import stat
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

from nanobot.beneath import DIR_FLAGS, make_dirs, open_last, parts_of, write_bytes
from nanobot.chat_names import HISTORY_SUFFIX

MANIFEST = "manifest.json"
DATABASE = "nanobot.db"
HOME_FILES = ("config.json", "vision-off.json", "cli_history")
KEYS = ("keys", "matrix")  # the folder of a Matrix device's keys: SQLite files (nanobot_channels.matrix_crypto)
COPY_IN_MEMORY = 8 << 20  # a workspace file is copied before it is stored; a larger one, through a temporary file


class BackupError(Exception):
    """One line for the user (exit 1)."""


def backup(home: Path, workspace: Path, target: Path, *, with_workspace: bool) -> dict:
    """Write ``target``; the manifest (counts, and the links left out) it holds. A failure
    (a full disk) leaves no partial file behind."""
    partial = target.with_name(f".{target.name}.partial")
    try:
        return _write_backup(home, workspace, partial, target, with_workspace)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _write_backup(home: Path, workspace: Path, partial: Path, target: Path, with_workspace: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / DATABASE
        if (home / DATABASE).exists():
            _online_copy(home / DATABASE, copy)
        manifest = {"version": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "tables": _table_counts(copy) if copy.exists() else {}, "histories": {},
                    "workspace": with_workspace, "links_left_out": []}
        with tarfile.open(partial, "w:gz") as tar:
            if copy.exists():
                tar.add(copy, DATABASE)
            for path in sorted((home / "sessions").glob("*" + HISTORY_SUFFIX)):
                data = path.read_bytes()  # what is there now; a line being written is left for the next one
                data = data[:data.rfind(b"\n") + 1]
                manifest["histories"][path.name] = _records(data)
                _add_bytes(tar, f"sessions/{path.name}", data)
            for name in HOME_FILES:
                if (home / name).is_file():
                    tar.add(home / name, name)
            for path in sorted(home.joinpath(*KEYS).glob("*.db")):  # consistent while the gateway writes them
                _online_copy(path, Path(tmp) / path.name)
                tar.add(Path(tmp) / path.name, "/".join((*KEYS, path.name)))
            if with_workspace and workspace.is_dir():
                top = os.open(workspace, DIR_FLAGS)
                try:
                    _add_folder(tar, top, "workspace", manifest["links_left_out"])
                finally:
                    os.close(top)
            _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
        partial.chmod(0o600)  # it holds the config's keys and every chat
        partial.replace(target)
    return manifest


def _add_folder(tar: tarfile.TarFile, folder: int, arcname: str, left_out: list[str]) -> None:
    """The open ``folder`` and all below it: files and folders only. A member chat can make a
    link in its folder, and swap a file or folder for one while this walks: each entry is opened
    without following a link and read through the descriptor it was checked on. A link (or named
    pipe) is left out, and named, rather than restored to point who knows where."""
    st = os.fstat(folder)
    tar.addfile(_info(arcname, st, tarfile.DIRTYPE))
    for name in sorted(os.listdir(folder)):
        path = f"{arcname}/{name}"
        try:
            fd = open_last(folder, name, os.O_RDONLY | os.O_NONBLOCK, path)  # a named pipe must not hold us
        except FileNotFoundError:
            continue  # gone since the listing
        except OSError:  # a link (LinkRefused); ENXIO: a socket
            left_out.append(path)
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                _add_folder(tar, fd, path, left_out)
            elif stat.S_ISREG(st.st_mode):
                _add_file(tar, fd, path, st)
            else:
                left_out.append(path)
        finally:
            os.close(fd)


def _add_file(tar: tarfile.TarFile, fd: int, path: str, st: os.stat_result) -> None:
    """The file as far as it is read: a chat's program may cut it short meanwhile (tar would
    stop at a size it no longer has) or make it grow (what was there when listed is kept)."""
    with os.fdopen(fd, "rb", closefd=False) as file, tempfile.SpooledTemporaryFile(COPY_IN_MEMORY) as copy:
        left = st.st_size
        while left and (chunk := file.read(min(left, 1 << 20))):
            copy.write(chunk)
            left -= len(chunk)
        info = _info(path, st, tarfile.REGTYPE)
        info.size = copy.tell()
        copy.seek(0)
        tar.addfile(info, copy)


def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, stat.S_IMODE(st.st_mode), int(st.st_mtime)
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    return info


def restore(source: Path, home: Path, workspace_of: Callable[[], Path], workspace: Path | None = None) -> dict:
    """Unpack ``source`` into ``home`` (which must hold no state) and check the counts; the
    workspace goes to ``workspace`` (then named in the restored config) or where the restored
    config puts it (``workspace_of``, asked once it is back). All or nothing: every entry is
    checked before anything is written, and a failure takes back what was written."""
    if (home / DATABASE).exists() or any((home / "sessions").glob("*" + HISTORY_SUFFIX)):
        raise BackupError(f"{home} holds a nanobot already (nanobot.db or sessions/): restore into an empty "
                          "home (set NANOBOT_HOME to a new folder)")
    with tarfile.open(source, "r:gz") as tar:
        manifest = json.loads(tar.extractfile(MANIFEST).read())  # type: ignore[union-attr]
        home_part, workspace_part = _checked_members(tar)
        written = _Written()
        try:
            written.made(home)
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
            for member, name in home_part:
                _extract(tar, member, home, name, written)
            if workspace is not None:
                _name_workspace(home, workspace)
            if workspace_part:
                target = workspace or workspace_of()
                if target.exists() and any(target.iterdir()):
                    raise BackupError(f"the workspace {target} is not empty: move it away, or name another with "
                                      "--workspace PATH")
                written.made(target)
                for member, name in workspace_part:
                    _extract(tar, member, target, name, written)
            _check_counts(home, manifest)
        except BaseException:
            written.take_back()
            raise
    return manifest


def _checked_members(tar: tarfile.TarFile) -> tuple[list[tuple[tarfile.TarInfo, str]], list[tuple[tarfile.TarInfo, str]]]:
    """(home entries, workspace entries), each with its path below where it goes; BackupError
    for any entry that is not a plain file or folder where a backup puts one (before any write)."""
    home_part, workspace_part = [], []
    for member in tar.getmembers():
        if member.name == MANIFEST:
            continue
        unsafe = BackupError(f"the backup holds an unsafe entry ({member.name}): nothing restored")
        if not (member.isfile() or member.isdir()):
            raise unsafe
        try:
            parts = parts_of(member.name)
        except ValueError:
            raise unsafe from None
        if parts[0] == "workspace":
            if len(parts) > 1:
                workspace_part.append((member, "/".join(parts[1:])))
        elif "/".join(parts) in (DATABASE, *HOME_FILES) or (len(parts) == 2 and parts[0] == "sessions"
                                                            and parts[1].endswith(HISTORY_SUFFIX)) \
                or (parts[:2] == KEYS and len(parts) == 3 and parts[2].endswith(".db") and member.isfile()):
            home_part.append((member, "/".join(parts)))
        elif not (member.isdir() and parts in (("sessions",), KEYS[:1], KEYS)):
            raise unsafe
    return home_part, workspace_part


class _Written:
    """What a restore wrote, to take back if it fails half way."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self.roots: list[Path] = []  # folders it made whole (removed with all they hold)

    def made(self, folder: Path) -> None:
        if not folder.exists():
            self.roots.append(folder)

    def take_back(self) -> None:
        for path in reversed(self.files):
            path.unlink(missing_ok=True)
        for root in self.roots:
            shutil.rmtree(root, ignore_errors=True)


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path, name: str, written: _Written) -> None:
    """One checked member, written below ``into`` without following any link there (``beneath``)."""
    if member.isdir():
        make_dirs(into, name)
        return
    existed = (into / name).exists()
    with tar.extractfile(member) as data:  # type: ignore[union-attr]
        write_bytes(into, name, data.read())
    if not existed:
        written.files.append(into / name)


def _name_workspace(home: Path, workspace: Path) -> None:
    """``--workspace``: the restored config names it, so the home uses it."""
    path = home / "config.json"
    config = json.loads(path.read_text(encoding="utf-8-sig")) if path.exists() else {}
    config.setdefault("agents", {}).setdefault("defaults", {})["workspace"] = str(workspace)
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    path.chmod(0o600)


def _check_counts(home: Path, manifest: dict) -> None:
    found = {"tables": _table_counts(home / DATABASE) if (home / DATABASE).exists() else {},
             "histories": {p.name: _records(p.read_bytes()) for p in (home / "sessions").glob("*" + HISTORY_SUFFIX)}}
    for part in ("tables", "histories"):
        if found[part] != manifest[part]:
            wrong = sorted(k for k in {*found[part], *manifest[part]} if found[part].get(k) != manifest[part].get(k))
            raise BackupError(f"the restored {part} differ from the backup's counts ({', '.join(wrong[:5])}): "
                              "the file is damaged")


def _online_copy(source: Path, target: Path) -> None:
    """SQLite's backup API: a consistent copy while another process writes (WAL included)."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def _table_counts(database: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
    finally:
        conn.close()


def _records(data: bytes) -> int:
    return sum(1 for line in data.splitlines() if line.strip())


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    tar.addfile(info, io.BytesIO(data))
