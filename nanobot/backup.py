"""``nanobot backup FILE`` and ``nanobot restore FILE``: a home in one ``.tar.gz``.

A backup holds the SQLite database, copied with SQLite's online backup API (consistent while a
gateway writes it: cron jobs, pairing, hashed API keys, usage, delivery), the JSONL histories,
``config.json``, and with ``--with-workspace`` the workspace; and ``manifest.json`` with the
row count of every table and the record count of every history. The database is copied first
and the histories after, so whatever was answered before the backup began is in both.

``restore`` unpacks into an empty home, then counts again and compares with the manifest.
On PostgreSQL the database is backed up with its own tools (``pg_dump``).
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

from nanobot.chat_names import HISTORY_SUFFIX

MANIFEST = "manifest.json"
DATABASE = "nanobot.db"
HOME_FILES = ("config.json", "vision-off.json", "cli_history")


class BackupError(Exception):
    """One line for the user (exit 1)."""


def backup(home: Path, workspace: Path, target: Path, *, with_workspace: bool) -> dict:
    """Write ``target``; the manifest (counts) it holds."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / DATABASE
        if (home / DATABASE).exists():
            _online_copy(home / DATABASE, copy)
        manifest = {"version": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "tables": _table_counts(copy) if copy.exists() else {}, "histories": {},
                    "workspace": with_workspace}
        partial = target.with_name(f".{target.name}.partial")
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
            if with_workspace and workspace.is_dir():
                tar.add(workspace, "workspace")
            _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
        partial.chmod(0o600)  # it holds the config's keys and every chat
        partial.replace(target)
    return manifest


def restore(source: Path, home: Path, workspace_of: Callable[[], Path]) -> dict:
    """Unpack ``source`` into ``home`` (which must hold no state) and check the counts; the
    workspace goes where the restored config puts it (``workspace_of``, asked once it is back)."""
    if (home / DATABASE).exists() or any((home / "sessions").glob("*" + HISTORY_SUFFIX)):
        raise BackupError(f"{home} holds a nanobot already (nanobot.db or sessions/): restore into an empty "
                          "home (set NANOBOT_HOME to a new folder)")
    with tarfile.open(source, "r:gz") as tar:
        manifest = json.loads(tar.extractfile(MANIFEST).read())  # type: ignore[union-attr]
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        members = [m for m in tar.getmembers() if m.name != MANIFEST]
        in_workspace = [m for m in members if m.name == "workspace" or m.name.startswith("workspace/")]
        for member in members:
            if member not in in_workspace:
                _extract(tar, member, home)
        if in_workspace:
            workspace = workspace_of()
            if workspace.exists() and any(workspace.iterdir()):
                raise BackupError(f"the workspace {workspace} is not empty: move it away, and restore again into "
                                  "an empty home")
            for member in in_workspace:
                _extract(tar, member, workspace.parent, rename=("workspace", workspace.name))
    found = {"tables": _table_counts(home / DATABASE) if (home / DATABASE).exists() else {},
             "histories": {p.name: _records(p.read_bytes()) for p in (home / "sessions").glob("*" + HISTORY_SUFFIX)}}
    for part in ("tables", "histories"):
        if found[part] != manifest[part]:
            wrong = sorted(k for k in {*found[part], *manifest[part]} if found[part].get(k) != manifest[part].get(k))
            raise BackupError(f"the restored {part} differ from the backup's counts ({', '.join(wrong[:5])}): "
                              "the file is damaged")
    return manifest


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


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path, rename: tuple[str, str] | None = None) -> None:
    """One member, refusing anything that would land outside ``into`` (links, absolute paths, ..)."""
    name = member.name
    if rename and (name == rename[0] or name.startswith(rename[0] + "/")):
        name = rename[1] + name[len(rename[0]):]
    target = (into / name).resolve()
    if not target.is_relative_to(into.resolve()) or member.issym() or member.islnk():
        raise BackupError(f"the backup holds an unsafe entry ({member.name}): not restored")
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
    elif member.isfile():
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tar.extractfile(member) as data, open(target, "wb") as out:  # type: ignore[union-attr]
            shutil.copyfileobj(data, out)
        target.chmod(0o600)
