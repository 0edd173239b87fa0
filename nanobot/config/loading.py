"""Reading the config: which file, its JSON, and every error as one line naming the key and its source."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_settings.exceptions import SettingsError
from pydantic.alias_generators import to_camel

from nanobot.config.base import ConfigError
from nanobot.config.root import Config, _FILE_DATA, _snake_keys, nanobot_home


def config_path(explicit: str | Path | None = None) -> tuple[Path, bool]:
    """Where the config lives and whether the user named it (a named file must exist)."""
    if explicit:
        return Path(explicit).expanduser(), True
    if os.environ.get("NANOBOT_CONFIG"):
        return Path(os.environ["NANOBOT_CONFIG"]).expanduser(), True
    return nanobot_home() / "config.json", False


def _read_file(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise ConfigError(f"{path}: config file not found")
        return {}
    try:  # utf-8-sig: an editor on Windows may start the file with a byte-order mark
        data = json.loads(path.read_text(encoding="utf-8-sig") or "{}")
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"  # json's messages may end in "at": finish the sentence
        what = f"{exc.msg} {where}" if exc.msg.endswith(" at") else f"{exc.msg} at {where}"
        raise ConfigError(f"{path}: invalid JSON: {what[0].lower()}{what[1:]}{_json_hint(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    try:
        return _snake_keys(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _json_hint(exc: json.JSONDecodeError) -> str:
    """What a hand-edited file most often has that JSON does not: a comma after the last item, a comment."""
    if exc.doc[exc.pos:exc.pos + 1] in ("}", "]") and exc.doc[:exc.pos].rstrip().endswith(","):
        return " (JSON allows no comma after the last item)"
    if exc.doc[exc.pos:].startswith(("//", "/*", "#")):
        return " (JSON has no comments)"
    return ""


def _key_path(loc: tuple[Any, ...]) -> str:
    return ".".join(to_camel(str(p)) if isinstance(p, str) and "_" in str(p) else str(p) for p in loc)


def _env_source(loc: tuple[Any, ...]) -> str | None:
    """The environment variable a bad value came from (env beats the file), if one did."""
    env = {name.upper(): name for name in os.environ}
    parts = [str(p).upper() for p in loc if not isinstance(p, int)]
    for end in range(len(parts), 0, -1):  # NANOBOT_AGENTS__DEFAULTS='{...}' sets a whole section
        name = "NANOBOT_" + "__".join(parts[:end])
        if name in env:
            return f"environment variable {env[name]}"
    return None


# The file's own shape, validated strictly (``true`` is no temperature, ``"yes"`` no boolean);
# environment variables are text by nature and go through Config's usual conversions.
_FileShape = create_model("ConfigFile", __config__=ConfigDict(extra="forbid"),
                          **{name: (field.annotation, field) for name, field in Config.model_fields.items()})


def _bad_value(source: str, loc: tuple[Any, ...], message: str) -> ConfigError:
    return ConfigError(f"{source}: invalid value for '{_key_path(loc)}': {message}")


def _validation_error(exc: ValidationError, path: Path, *, from_file: bool) -> ConfigError:
    err = exc.errors()[0]
    source = str(path) if from_file else _env_source(err["loc"]) or str(path)
    if err["type"] == "extra_forbidden":
        return ConfigError(f"{source}: unknown key '{_key_path(err['loc'])}'")
    return _bad_value(source, err["loc"], err["msg"].removeprefix("Value error, "))


def _env_parse_error(exc: SettingsError) -> ConfigError:
    """pydantic-settings names only the top-level field; find the variable that holds bad JSON
    (a list, a map or a section is read as JSON; a plain value never is)."""
    for name, value in sorted(os.environ.items()):
        parts = name.upper().removeprefix("NANOBOT_").lower().split("__")
        if not name.upper().startswith("NANOBOT_") or not _is_structured(Config, parts):
            continue
        try:
            json.loads(value)
        except ValueError as bad:
            return ConfigError(f"environment variable {name}: invalid JSON ({bad.msg} at column {bad.colno}); "
                               """lists and objects are written as JSON, e.g. '["111"]'""")
    return ConfigError(f"environment: {exc}")


def _is_structured(annotation: Any, parts: list[str]) -> bool:
    """Whether the setting at ``parts`` under ``annotation`` is a list, a map or a section."""
    while get_origin(annotation) in (Union, types.UnionType):  # Optional[X], X | None
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if not parts:
        return get_origin(annotation) in (list, dict) or isinstance(annotation, type) and issubclass(annotation,
                                                                                                     BaseModel)
    if get_origin(annotation) is dict:
        return _is_structured(get_args(annotation)[1], parts[1:])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and parts[0] in annotation.model_fields:
        return _is_structured(annotation.model_fields[parts[0]].annotation, parts[1:])
    return False


def load_config(explicit: str | Path | None = None) -> tuple[Config, Path]:
    """Load and validate; every problem becomes one ConfigError line naming the key and file
    (or environment variable)."""
    path, required = config_path(explicit)
    data = _read_file(path, required)
    try:
        _FileShape.model_validate(data, strict=True)
    except ValidationError as exc:
        raise _validation_error(exc, path, from_file=True) from None
    config = _built(path, data)
    config._source = path.resolve()
    return config, path


def defaults_and_environment(path: Path) -> Config:
    """The defaults with what the environment sets (what ``onboard`` writes to a new file at
    ``path``); a bad variable is one ConfigError naming it, as in ``load_config``."""
    return _built(path, {})


def _built(path: Path, data: dict[str, Any]) -> Config:
    token = _FILE_DATA.set(data)
    try:
        config = Config()
    except ValidationError as exc:
        raise _validation_error(exc, path, from_file=False) from None
    except SettingsError as exc:
        raise _env_parse_error(exc) from None
    finally:
        _FILE_DATA.reset(token)
    for loc, message in config.problems():
        raise _bad_value(_env_source(loc) or _section_source(loc, data) or str(path), loc, message)
    return config


def _section_source(loc: tuple[Any, ...], data: dict[str, Any]) -> str | None:
    """A rule across a section's keys (one empty while another is set) broken in a section the
    file has not: the environment variable that set it (in that section, or the one around it,
    as channels.email around channels.email.imap; never a whole "channels")."""
    section, node = [str(part) for part in loc[:-1]], data
    for part in section:
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return None  # the file has the section: the file says it
    for end in range(len(section), min(len(section), 2) - 1, -1):
        prefix = "NANOBOT_" + "__".join(section[:end]).upper() + "__"
        found = (name for name in os.environ if name.upper().startswith(prefix))  # ...__ENABLED first: it turned it on
        if setting := sorted(found, key=lambda name: (not name.upper().endswith("__ENABLED"), name)):
            return f"environment variable {setting[0]}"
    return None
