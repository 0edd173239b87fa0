"""The repository as others clone it and read it: no large binaries committed, no module too long to read,
no bench script whose imports a change broke."""

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


def test_every_package_folder_is_in_the_wheel_list() -> None:
    """pyproject.toml lists the packages (it maps channels/ to nanobot_channels, which find
    cannot): a new folder of Python modules must be added there, or the wheel lacks it."""
    import tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(settings["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "nanobot").rglob("*.py")}
    assert folders <= listed, f"package folders missing from pyproject.toml: {sorted(folders - listed)}"
    assert settings["package-dir"] == {"nanobot_channels": "channels"} and "nanobot_channels" in listed


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_modules_and_functions_stay_short_enough_to_read() -> None:
    """The seams the house issue counted on: no module of nanobot/ or channels/ over 400 lines,
    no function over 60 (a longer one is split where its steps are, not squeezed)."""
    import ast

    long: list[str] = []
    for path in sorted([*(ROOT / "nanobot").rglob("*.py"), *(ROOT / "channels").rglob("*.py")]):
        source, name = path.read_text(), path.relative_to(ROOT)
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            long.append(f"{name}: {lines} lines")
        long += [f"{name}:{node.lineno} {node.name}(): {node.end_lineno - node.lineno + 1} lines"
                 for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_every_bench_script_still_imports() -> None:
    """Nothing else runs bench/ (its figures are measured by hand): a name one imports that a
    change renamed or removed would be found only at the next measurement. Each is imported (in
    a process of its own), which runs no benchmark."""
    import sys

    load = ("import importlib.util, pathlib, sys\n"
            "sys.path.insert(0, 'bench')  # as when run: python bench/NAME.py\n"
            "for path in sorted(pathlib.Path('bench').glob('bench_*.py')):\n"
            "    spec = importlib.util.spec_from_file_location(path.stem, path)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    done = subprocess.run([sys.executable, "-c", load], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert len(scripts) >= 30 and done.returncode == 0, done.stderr[-2000:]
