"""The bundled workspace template and built-in skills.

In the repository they are the top-level ``workspace/`` and ``skills/`` folders;
``nanobot/bundled/`` links to them, so a wheel (``pip install .``, the systemd path) ships
them inside the package and a checkout or editable install reads them in place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent / "bundled"


def template_dir() -> Path:
    return BUNDLED / "workspace"


def builtin_skills_dir() -> Path:
    return BUNDLED / "skills"


def copy_template(workspace: Path) -> None:
    """Copy the workspace template without overwriting anything the user already has."""
    source_root = template_dir()
    if not source_root.is_dir():
        raise FileNotFoundError(f"the workspace template is missing from this install ({source_root})")
    for source in source_root.rglob("*"):
        target = workspace / source.relative_to(source_root)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
