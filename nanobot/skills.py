"""Skills: task instructions the model reads when it needs them.

A skill is a folder with a ``SKILL.md`` that starts with YAML front matter::

    ---
    name: weather
    description: Current weather and forecasts from wttr.in or Open-Meteo (no API key).
    requires: {bins: [curl], env: [SOME_TOKEN]}   # optional
    ---
    (instructions in Markdown)

and optionally a ``helpers.py`` of plain functions that code mode can load into the chat's
Python session (``skill_helpers_code``). Built-in skills live in the repo's ``skills/``; the
user's own in the workspace's ``skills/``, which win on a name clash.

Only a one-line summary of each skill goes into the system prompt (it is sent every turn);
the model reads the full text on demand with the ``read_skill`` tool. Built-in skills lie
outside the workspace, where the file tools cannot (and must not) reach, so ``read_skill``
serves both kinds by name. Copying built-ins into the workspace instead would leave stale
copies behind after an upgrade, and every copy would shadow the newer built-in forever.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from nanobot import beneath
from nanobot.filecache import Stamp, StampedCache, stamp
from nanobot.prompts import render_prompt
from nanobot.workspace_template import builtin_skills_dir
from nanobot.tools.paths import FileScope, file_scope, resolve_in_workspace
from nanobot.tools.registry import ToolContext, tool

__all__ = ["Skill", "builtin_skills_dir", "list_skills", "find_skill", "skills_section", "skill_helpers_code",
           "read_skill", "skills_prompt"]

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
HELPERS_FILE = "helpers.py"
MAX_DESCRIPTION_CHARS = 200  # one line per skill in every prompt: keep it short
MAX_SKILL_FILE = 1 << 20  # bytes of a SKILL.md read for its front matter
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_warned: set[tuple[str, float]] = set()  # (path, mtime): warn once per version of a broken file


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    directory: Path  # the skill's folder (real path)
    builtin: bool
    bins: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)  # other front matter keys, as written
    shadows_builtin: bool = False  # a workspace skill with a built-in's name: used instead of it, and shown

    @property
    def path(self) -> Path:
        return self.directory / SKILL_FILE

    @property
    def has_helpers(self) -> bool:
        return (self.directory / HELPERS_FILE).is_file()

    def missing(self) -> list[str]:
        """Requirements not met here: programs not on PATH, environment variables not set."""
        return ([b for b in self.bins if shutil.which(b) is None]
                + [f"${e}" for e in self.env if not os.environ.get(e)])


# ---------------------------------------------------------------------------------- loading


def parse_front_matter(text: str) -> dict:
    """The YAML mapping between the leading ``---`` lines; ValueError if absent or broken."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError("SKILL.md must start with a '---' line (YAML front matter)")
    for end, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            break
    else:
        raise ValueError("the front matter has no closing '---' line")
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML in the front matter: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("the front matter must be a YAML mapping")
    return data


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{what} must be a list of names")
    return tuple(value)


def _read_front_matter(path: str) -> dict:
    """``skills/NAME/SKILL.md``'s front matter, read without following a link below the folder
    holding ``skills/``: a member chat's skills are in its own folder, which it can fill with
    links (to the owner's files) and named pipes."""
    anchor = Path(path).parents[2]
    text = beneath.read_bytes(anchor, Path(path).relative_to(anchor).as_posix(), MAX_SKILL_FILE)
    return parse_front_matter(text.decode("utf-8"))


# The skills list is in every prompt; parsing YAML each turn cost ~3 ms, so a SKILL.md is
# re-read only when it changes, and the list is kept while none of what it was read from did.
_parsed = StampedCache(_read_front_matter)
_listed: dict[tuple[str, str], tuple[tuple[str, ...], tuple[Stamp | None, ...], list[Skill]]] = {}


def _front_matter(path: Path) -> dict:
    try:
        return _parsed.get(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {SKILL_FILE}: {exc}") from None


def load_skill(directory: Path, *, builtin: bool) -> Skill:
    """Read one skill folder; ValueError says what is wrong with it."""
    meta = _front_matter(directory / SKILL_FILE)
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError("front matter needs 'name': letters, digits, '-', '_' or '.'")
    if name != directory.name:
        raise ValueError(f"front matter name {name!r} differs from the folder name {directory.name!r}")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("front matter needs a 'description' (one line: what the skill is for)")
    requires = meta.get("requires") or {}
    if not isinstance(requires, dict):
        raise ValueError("'requires' must be a mapping like {bins: [...], env: [...]}")
    description = " ".join(description.split())
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS - 1].rstrip() + "…"
    extra = {k: v for k, v in meta.items() if k not in ("name", "description", "requires")}
    return Skill(name, description, directory.resolve(), builtin, _strings(requires.get("bins"), "requires.bins"),
                 _strings(requires.get("env"), "requires.env"), extra)


def _scan(root: Path, *, builtin: bool) -> dict[str, Skill]:
    skills: dict[str, Skill] = {}
    try:
        folders = sorted(p for p in root.iterdir() if (p / SKILL_FILE).is_file())
    except OSError:  # no skills/ folder (yet): nothing to list
        return skills
    for folder in folders:
        try:
            skill = load_skill(folder, builtin=builtin)
        except ValueError as exc:
            _warn_once(folder / SKILL_FILE, f"skill {folder.name!r} skipped ({folder / SKILL_FILE}): {exc}")
            continue
        skills[skill.name] = skill
    return skills


def _warn_once(path: Path, message: str) -> None:
    """The prompt is built every turn; a broken skill should not flood the log every turn."""
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError:
        key = (str(path), 0.0)
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def _workspace_skills(workspace: Path) -> dict[str, Skill]:
    """The workspace's skills, minus any whose folder resolves outside the workspace (a symlink)."""
    found = _scan(workspace / "skills", builtin=False)
    ws = workspace.resolve()
    return {name: s for name, s in found.items() if s.directory.is_relative_to(ws)}


def list_skills(workspace: Path, builtin_dir: Path | None = None) -> list[Skill]:
    """Every usable skill, sorted by name; a workspace skill replaces a built-in of the same name,
    marked ``shadows_builtin`` so the clash shows in the prompt's list and in ``nanobot status``.

    The prompt asks for this every turn, so the list is kept while nothing it was read from
    changed: the two skills folders (a skill added or removed) and each SKILL.md (edited)."""
    roots = ((builtin_dir or builtin_skills_dir()).resolve(), workspace / "skills")  # the package's own links resolved
    key = (str(roots[0]), str(roots[1]))
    cached = _listed.get(key)
    if cached is not None and cached[1] == tuple(map(stamp, cached[0])):
        return cached[2]
    skills = _scan(roots[0], builtin=True)
    for name, skill in _workspace_skills(workspace).items():
        skills[name] = replace(skill, shadows_builtin=name in skills)
    listed = [skills[name] for name in sorted(skills)]
    # What the list depends on: the two folders (a skill added or removed) and each SKILL.md.
    paths = (*key, *(str(s.directory / SKILL_FILE) for s in listed))
    _listed[key] = (paths, tuple(map(stamp, paths)), listed)
    return listed


def shadowing_skills(workspace: Path, builtin_dir: Path | None = None) -> list[str]:
    """Names of workspace skills that replace a built-in one."""
    return [s.name for s in list_skills(workspace, builtin_dir) if s.shadows_builtin]


def find_skill(name: str, workspace: Path, builtin_dir: Path | None = None) -> Skill:
    """The skill called ``name`` (the workspace's first); ValueError naming the known ones."""
    skills = {s.name: s for s in list_skills(workspace, builtin_dir)}
    skill = skills.get(name.strip())
    if skill is None:
        known = ", ".join(skills) or "none"
        raise ValueError(f"no skill named {name!r}; available skills: {known}")
    return skill


# ---------------------------------------------------------------------------------- prompt


HELPERS_NOTE = ' "helpers": use_skill(name) defines its Python functions in your session.'


def skill_line(skill: Skill, workspace: Path, *, code: bool = True) -> str:
    where = "built-in" if skill.builtin else skill.path.relative_to(workspace.resolve()).as_posix()
    flags = [where]
    if skill.shadows_builtin:
        flags.append("REPLACES the built-in skill of this name")
    if skill.has_helpers and code:
        flags.append("helpers")
    missing = skill.missing()
    if missing:
        flags.append("unavailable, missing: " + " ".join(missing))
    return f"- {skill.name}: {skill.description} [{'; '.join(flags)}]"


def skills_section(workspace: Path, builtin_dir: Path | None = None, *, code: bool = True) -> str:
    """The system prompt's skills section: a header and one line per skill ('' if none).
    Without ``code`` (tools mode) nothing mentions helpers, which only programs can use.

    Kept while the list and the skills' environment variables are unchanged, for up to
    PROGRAMS_TTL_S: building the lines (a path resolved and programs looked up on PATH, per
    skill) for every turn cost more than the rest of the prompt, and a program installed
    meanwhile shows as available that much later."""
    skills = list_skills(workspace, builtin_dir)
    key, now = (str(workspace), str(builtin_dir), code), time.monotonic()
    env = tuple(bool(os.environ.get(name)) for s in skills for name in s.env)
    kept = _sections.get(key)
    if kept is not None and kept[0] is skills and kept[1] == env and now < kept[2]:
        return kept[3]
    text = render_prompt("skills.md", skills="\n".join(skill_line(s, workspace, code=code) for s in skills),
                         helpers_note=HELPERS_NOTE if code else "").strip() if skills else ""
    _sections[key] = (skills, env, now + PROGRAMS_TTL_S, text)
    return text


PROGRAMS_TTL_S = 10.0
_sections: dict[tuple[str, str, bool], tuple[list[Skill], tuple[bool, ...], float, str]] = {}


# ---------------------------------------------------------------------------------- reading


def _skill_text(skill: Skill, file: str, scope: FileScope) -> str:
    """``_skill_file``'s text, read without following a link swapped in since it was checked
    (nor waiting on a named pipe): a member chat's skills are in its own folder."""
    relative = _skill_file(skill, file, scope).relative_to(skill.directory).as_posix()
    return beneath.read_bytes(skill.directory, relative).decode("utf-8", errors="replace")


def _skill_file(skill: Skill, file: str, scope: FileScope) -> Path:
    """The real path of ``file`` inside the skill's folder, or PermissionError / FileNotFoundError."""
    if not file or "\x00" in file or Path(file).is_absolute():
        raise PermissionError(f"{file!r}: give a file name inside the skill's folder, e.g. {SKILL_FILE!r}")
    real = (skill.directory / file).resolve()
    if not real.is_relative_to(skill.directory):
        raise PermissionError(f"{file!r} is outside the skill {skill.name!r}")
    if not skill.builtin:  # the file tools' own guard: inside the workspace, never in NANOBOT_HOME
        resolve_in_workspace(scope, str(real))
    if not real.is_file():
        files = sorted(p.relative_to(skill.directory).as_posix() for p in skill.directory.rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts)
        raise FileNotFoundError(f"skill {skill.name!r} has no file {file!r}; its files: {', '.join(files)}")
    return real


def skill_helpers_code(name: str, scope: FileScope, builtin_dir: Path | None = None) -> str:
    """The source of skill ``name``'s ``helpers.py``, for code mode's ``use_skill(name)``.

    The caller runs the returned source in the chat's Python session, which defines the
    helper functions there for later programs. Helpers are plain Monty-compatible
    functions (see the skill-creator skill). ValueError if there is no such skill, or it
    has no helpers.
    """
    skill = find_skill(name, scope.workspace, builtin_dir)
    if not skill.has_helpers:
        raise ValueError(f"skill {skill.name!r} has no {HELPERS_FILE}; read its instructions with read_skill")
    return _skill_text(skill, HELPERS_FILE, scope)


@tool
async def read_skill(ctx: ToolContext, name: str, file: str = SKILL_FILE) -> str:
    """Read a skill's SKILL.md, or another of its files (built-in skills too)."""
    skill = find_skill(name, ctx.workspace)
    text = _skill_text(skill, file, file_scope(ctx))
    if not ctx.runs_code and file == SKILL_FILE:
        text = TOOLS_MODE_NOTE + text
    return text


TOOLS_MODE_NOTE = ("[You act with tool calls in this chat, not programs: where this skill shows Python for you to run, "
                   "make the same calls as tools, one by one (use_skill, llm_query and final_answer do not exist "
                   "here). Python that is stored or sent as text stays Python: a scheduled job's program goes, as it "
                   "is, in schedule_cron's `code` argument.]\n\n")


# ---------------------------------------------------------------------------------- wiring


def skills_prompt(ctx: ToolContext) -> str:
    """The skills list every system prompt carries (a member chat: its own folder's skills)."""
    return skills_section(ctx.workspace, code=ctx.runs_code)
