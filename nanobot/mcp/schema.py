"""From an MCP tool's JSON schemas to Python: the parameters a program may pass, the stub the
model reads (and the type checker enforces), and the value a result becomes.

Stub types: string -> str, integer -> int, number -> float, boolean -> bool, array -> list[T],
object -> dict, enum -> Literal[...], anything else -> Any (``$ref`` into ``$defs`` followed).
A result with fields also gets them in the stub's comment (``Returns {id: int, title: str}``),
so a program can use them without printing one first. A property whose name is not a Python
identifier gets one (``start-date`` -> ``start_date``), mapped back when called.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from typing import Any

_SIMPLE = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "dict", "null": "None"}
MAX_COMMENT = 80
MAX_SHAPE = 240  # characters of a result's fields in the stub comment


def identifier(name: str) -> str:
    """A Python name for an MCP name: every other character becomes ``_``."""
    text = re.sub(r"\W", "_", name, flags=re.ASCII) or "_"
    if text[0].isdigit() or keyword.iskeyword(text):
        text = "_" + text
    return text


def type_text(schema: Any, defs: dict[str, Any] | None = None) -> str:
    schema = _resolved(schema, defs)
    if not isinstance(schema, dict):
        return "Any"
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return f"Literal[{', '.join(repr(v) for v in schema['enum'])}]"
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        kinds = [type_text(o, defs) for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        inner = kinds[0] if len(kinds) == 1 else f"Union[{', '.join(dict.fromkeys(kinds))}]" if kinds else "Any"
        return f"Optional[{inner}]" if len(kinds) < len(options) else inner
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]
        kinds = [k for k in kind if k != "null"]
        inner = type_text({**schema, "type": kinds[0]}, defs) if len(kinds) == 1 else "Any"
        return f"Optional[{inner}]" if "null" in kind else inner
    if kind == "array":
        return f"list[{type_text(schema.get('items'), defs)}]"
    return _SIMPLE.get(kind, "Any")


def _resolved(schema: Any, defs: dict[str, Any] | None) -> Any:
    """A ``{"$ref": "#/$defs/Note"}`` as the schema it names (pydantic writes nested models so)."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith("#/$defs/") and defs:
        return defs.get(ref.removeprefix("#/$defs/"), {})
    return schema


def shape_text(schema: Any, defs: dict[str, Any] | None, depth: int = 0) -> str:
    """A result's type with the fields of its objects: ``list[{id: int, tags: list[str]}]``."""
    schema = _resolved(schema, defs)
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and depth < 2:
        fields = ", ".join(f"{name}: {shape_text(spec, defs, depth + 1)}" for name, spec in schema["properties"].items())
        return "{" + fields + "}"
    if isinstance(schema, dict) and schema.get("type") == "array":
        return f"list[{shape_text(schema.get('items'), defs, depth)}]"
    return type_text(schema, defs)


@dataclass(frozen=True)
class Param:
    name: str  # the Python name
    wire: str  # the name in the schema
    type: str
    required: bool
    description: str
    default: str | None = None  # the schema's default, as Python source; None: not given

    def source(self) -> str:
        if self.required:
            return f"{self.name}: {self.type}"
        if self.default is not None:
            return f"{self.name}: {self.type} = {self.default}"
        return f"{self.name}: {_optional(self.type)} = None"


def params(input_schema: dict[str, Any]) -> list[Param]:
    """Required parameters first (a Python signature needs that), in schema order otherwise."""
    props = input_schema.get("properties") or {}
    required = set(input_schema.get("required") or [])
    out = [Param(identifier(name), name, type_text(spec), name in required, _one_line(spec.get("description", "")),
                 repr(spec["default"]) if "default" in spec and spec["default"] is not None else None)
           for name, spec in props.items() if isinstance(spec, dict)]
    return sorted(out, key=lambda p: not p.required)


def return_type(output_schema: dict[str, Any] | None) -> str:
    if not output_schema:
        return "str"
    wrapped = _wrapped_result(output_schema)
    return type_text(wrapped if wrapped is not None else output_schema, output_schema.get("$defs"))


def result_fields(output_schema: dict[str, Any] | None) -> str:
    """`` Returns {vendor: str, amount: float}.`` for a result with fields, else ""."""
    if not output_schema:
        return ""
    wrapped = _wrapped_result(output_schema)
    shape = shape_text(wrapped if wrapped is not None else output_schema, output_schema.get("$defs"))
    if "{" not in shape:
        return ""
    return f" Returns {shape if len(shape) <= MAX_SHAPE else shape[:MAX_SHAPE - 1] + '…'}."


def render_stub(name: str, description: str, plist: list[Param], output_schema: dict[str, Any] | None) -> str:
    """``def notes_search(query: str, limit: Optional[int] = None) -> list[int]: ...  # summary``,
    one parameter per line with its description as a comment when there are any."""
    returns = return_type(output_schema)
    summary = (_one_line(description) or name) + result_fields(output_schema)
    args = [p.source() for p in plist]
    if not any(p.description for p in plist):
        return f"def {name}({', '.join(args)}) -> {returns}: ...  # {summary}"
    lines = [f"def {name}(  # {summary}"]
    lines += [f"    {a},{'  # ' + p.description if p.description else ''}" for a, p in zip(args, plist)]
    return "\n".join(lines) + f"\n) -> {returns}: ..."


def _optional(text: str) -> str:
    return text if text.startswith("Optional[") or text in ("Any", "None") else f"Optional[{text}]"


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_COMMENT else line[:MAX_COMMENT - 1] + "…"


def _wrapped_result(output_schema: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of ``value`` when the server wraps a non-object result as ``{"result": value}``."""
    props = output_schema.get("properties")
    if isinstance(props, dict) and list(props) == ["result"] and output_schema.get("required") == ["result"]:
        return props["result"]
    return None


class ToolFailed(Exception):
    """The server said the call failed (``isError``): its message."""


def to_value(result: Any, output_schema: dict[str, Any] | None) -> Any:
    """A ``CallToolResult`` as a Python value: structured content as dict/list (unwrapped from
    ``{"result": ...}``), text as ``str`` (parsed as JSON when an output schema is declared),
    images and audio as a short placeholder. ``isError`` raises ToolFailed."""
    texts = [_content_text(c) for c in result.content or []]
    if result.is_error:
        raise ToolFailed(" ".join(t for t in texts if t).strip() or "the tool reported an error")
    structured = result.structured_content
    if structured is not None:
        if output_schema and _wrapped_result(output_schema) is not None and isinstance(structured, dict):
            return structured.get("result")
        return structured
    text = "\n".join(texts)
    if output_schema and len(texts) == 1:
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _content_text(content: Any) -> str:
    kind = getattr(content, "type", "")
    if kind == "text":
        return content.text
    if kind in ("image", "audio"):
        size = len(getattr(content, "data", "") or "") * 3 // 4
        return f"[{kind}: {getattr(content, 'mime_type', '?')}, {size:,} bytes]"
    if kind == "resource_link":
        return f"[resource: {getattr(content, 'uri', '?')}]"
    if kind == "resource":
        resource = getattr(content, "resource", None)
        return getattr(resource, "text", None) or f"[resource: {getattr(resource, 'uri', '?')}]"
    return f"[{kind or 'content'}]"
