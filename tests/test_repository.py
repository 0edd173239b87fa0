"""The repository as others clone it: no large binaries committed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 1024 * 1024


def test_no_tracked_file_is_over_1_mb() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing tracked to check")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    large = [name for name in tracked.decode().split("\0")
             if name and (ROOT / name).is_file() and (ROOT / name).stat().st_size > MAX_BYTES]
    assert not large, f"tracked files over 1 MB (keep them out of git): {large}"
