"""Backups and restores that a member's links or a crafted archive cannot turn into writes
outside the home and workspace; restores all or nothing; a backup that fails leaves nothing."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.test_cli import nanobot


def home_with_workspace(tmp_path: Path) -> tuple[Path, Path]:
    home, workspace = tmp_path / "nanobot-home", tmp_path / "ws"
    (workspace / "chats" / "telegram_-100").mkdir(parents=True)
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"agents": {"defaults": {"workspace": str(workspace)}}}))
    (workspace / "notes.md").write_text("kept")
    (workspace / "chats" / "telegram_-100" / "mine.txt").write_text("the member's")
    return home, workspace


def crafted(path: Path, entries: dict[str, bytes], config: dict) -> None:
    manifest = {"version": 1, "tables": {}, "histories": {}, "workspace": True}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {"config.json": json.dumps(config).encode(), **entries,
                           "manifest.json": json.dumps(manifest).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


async def test_links_in_member_folders_are_left_out_and_said(tmp_path: Path) -> None:
    home, workspace = home_with_workspace(tmp_path)
    member = workspace / "chats" / "telegram_-100"
    (member / "leak").symlink_to(home / "config.json")
    (member / "home").symlink_to(home, target_is_directory=True)
    os.mkfifo(member / "pipe")  # opened, it would hold the backup for ever
    (member / "same.txt").hardlink_to(member / "mine.txt")
    archive = tmp_path / "b.tar.gz"
    code, out, err = await nanobot("backup", str(archive), "--with-workspace", home=home)
    assert code == 0, err
    assert "Left out 3 links in the workspace" in out and all(f"workspace/chats/telegram_-100/{name}" in out
                                               for name in ("leak", "home", "pipe"))
    fresh = tmp_path / "fresh"
    code, out, err = await nanobot("restore", str(archive), "--workspace", str(tmp_path / "ws2"), home=fresh)
    assert code == 0 and "counts checked" in out, err
    assert (tmp_path / "ws2" / "chats" / "telegram_-100" / "mine.txt").read_text() == "the member's"
    assert (tmp_path / "ws2" / "chats" / "telegram_-100" / "same.txt").read_text() == "the member's"
    assert not (tmp_path / "ws2" / "chats" / "telegram_-100" / "leak").exists()
    assert json.loads((fresh / "config.json").read_text())["agents"]["defaults"]["workspace"] == str(tmp_path / "ws2")


async def test_a_crafted_archive_writes_nothing_anywhere(tmp_path: Path) -> None:
    workspace = tmp_path / "victim" / "workspace"
    archive = tmp_path / "evil.tar.gz"
    crafted(archive, {"workspace/ok.txt": b"fine", "workspace/../X": b"escaped"},
            {"agents": {"defaults": {"workspace": str(workspace)}}})
    fresh = tmp_path / "fresh"
    code, _, err = await nanobot("restore", str(archive), home=fresh)
    assert code == 1 and "unsafe entry (workspace/../X)" in err
    assert not (tmp_path / "victim" / "X").exists() and not workspace.exists()
    assert not fresh.exists() or list(fresh.iterdir()) == []


async def test_a_refused_restore_leaves_nothing_and_can_be_tried_again(tmp_path: Path) -> None:
    home, workspace = home_with_workspace(tmp_path)
    archive = tmp_path / "b.tar.gz"
    assert (await nanobot("backup", str(archive), "--with-workspace", home=home))[0] == 0
    fresh = tmp_path / "fresh"  # the same host: the config's absolute workspace is in use
    code, _, err = await nanobot("restore", str(archive), home=fresh)
    assert code == 1 and "is not empty" in err and "--workspace PATH" in err
    assert not fresh.exists() or list(fresh.iterdir()) == []  # all or nothing
    code, out, err = await nanobot("restore", str(archive), "--workspace", str(tmp_path / "other"), home=fresh)
    assert code == 0, err
    assert (tmp_path / "other" / "notes.md").read_text() == "kept" and (workspace / "notes.md").read_text() == "kept"


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(
    ["unshare", "-rm", "true"], capture_output=True).returncode != 0, reason="needs unshare -rm for a small tmpfs")
def test_a_backup_onto_a_full_disk_leaves_no_partial_file(tmp_path: Path) -> None:
    home, workspace = home_with_workspace(tmp_path)
    (workspace / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024))  # does not compress: over the 256 KB disk
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=256k tmpfs {disk} && "
              f"{sys.executable} -m nanobot backup {disk}/b.tar.gz --with-workspace; echo exit=$?; ls -A {disk}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NANOBOT_HOME": str(home)})
    assert "exit=1" in done.stdout and "backup failed" in done.stderr, done.stderr
    assert done.stdout.strip().endswith("exit=1")  # and ls found nothing: no .b.tar.gz.partial


SHORTER_THAN_SAID = next((path for path in ("/sys/kernel/profiling", "/sys/kernel/mm/transparent_hugepage/enabled",
                                            "/sys/power/state") if os.path.isfile(path)), None)


@pytest.mark.skipif(SHORTER_THAN_SAID is None or shutil.which("unshare") is None or subprocess.run(
    ["unshare", "-rm", "true"], capture_output=True).returncode != 0, reason="needs unshare -rm and a sysfs file")
def test_a_file_that_shrinks_while_read_is_backed_up_as_far_as_it_went(tmp_path: Path) -> None:
    """A chat's program may cut a file in its folder short while the backup reads it: the backup
    still completes. A sysfs file bound over a workspace file stands in: its size says 4096 bytes
    and a read gives a few."""
    home, workspace = home_with_workspace(tmp_path)
    shrinking = workspace / "chats" / "telegram_-100" / "log.txt"
    shrinking.write_text("")
    archive = tmp_path / "b.tar.gz"
    script = (f"mount --bind {SHORTER_THAN_SAID} {shrinking} && "
              f"{sys.executable} -m nanobot backup {archive} --with-workspace; echo exit=$?")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NANOBOT_HOME": str(home)})
    assert done.stdout.strip().endswith("exit=0"), done.stderr
    with tarfile.open(archive) as tar:
        kept = tar.extractfile("workspace/chats/telegram_-100/log.txt").read()
        assert kept == Path(SHORTER_THAN_SAID).read_bytes()
        assert tar.extractfile("workspace/notes.md").read() == b"kept"  # and what came after it


async def test_a_matrix_devices_keys_go_with_the_home(tmp_path: Path) -> None:
    """Without its device's keys a restored bot could read none of its encrypted rooms."""
    home, workspace = home_with_workspace(tmp_path)
    (home / "keys" / "matrix").mkdir(parents=True, mode=0o700)
    with sqlite3.connect(home / "keys" / "matrix" / "@bot:example.org_DEVICE.db") as db:
        db.execute("CREATE TABLE accounts (pickle TEXT)")
        db.execute("INSERT INTO accounts VALUES ('CANARY-device-keys')")
    archive = tmp_path / "b.tar.gz"
    assert (await nanobot("backup", str(archive), home=home))[0] == 0
    fresh = tmp_path / "fresh"
    code, _, err = await nanobot("restore", str(archive), home=fresh)
    assert code == 0, err
    restored = fresh / "keys" / "matrix" / "@bot:example.org_DEVICE.db"
    with sqlite3.connect(restored) as db:
        assert db.execute("SELECT pickle FROM accounts").fetchall() == [("CANARY-device-keys",)]
    assert oct((fresh / "keys" / "matrix").stat().st_mode & 0o777) == "0o700"
    assert oct(restored.stat().st_mode & 0o777) == "0o600"
