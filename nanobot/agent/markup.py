"""Reading what the model wrote: think blocks, text tool calls, code blocks, ``<say>`` notes."""

from __future__ import annotations

import re
from dataclasses import dataclass

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_SAY = re.compile(r"<say>(.*?)</say>", re.DOTALL)
_FENCE = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)  # ```Python, ```python3 too
# ```python show: code written for the user (an example, a "how do I"), shown and never run.
_SHOW_FENCE = re.compile(r"```(python|py)[ \t]+show[ \t]*\n", re.IGNORECASE)


class FailedReply(str):
    """A reply that tells the user the turn failed (``nanobot agent -m`` exits 1 on it)."""


EMPTY_ANSWER = "(The model sent an empty answer. Please ask again, or pick another model with /model.)"


def answer_or_failure(reply: str) -> str:
    """The reply to send: the model's text, or, when it is empty, a failure that says so."""
    return reply if reply.strip() else FailedReply(EMPTY_ANSWER)


def strip_think(text: str | None) -> str:
    """Remove reasoning blocks (closed, or left open at the end) that some models emit."""
    return _THINK.sub("", text or "").strip()


def text_tool_calls(text: str) -> list[str]:
    """The JSON payloads of ``<tool_call>{...}</tool_call>`` blocks, for models without native tools."""
    return _TOOL_CALL.findall(text)


def say_notes(text: str) -> list[str]:
    return [s.strip() for s in _SAY.findall(text) if s.strip()]


def without_say(text: str) -> str:
    return _SAY.sub("", text).strip()


@dataclass
class CodeBlock:
    code: str
    before: str  # prose the model wrote before the code


def extract_code(text: str) -> CodeBlock | None:
    """The program in a reply: ``<run_python>`` (first opening tag to last closing tag) or python fences.

    Tags win because they are unambiguous; several python fences are joined in order, as the
    model meant them to run as one program.
    """
    start = text.find("<run_python>")
    end = text.rfind("</run_python>")
    if start != -1 and end > start:
        code = text[start + len("<run_python>"):end]
        code = _FENCE.sub(lambda m: m.group(1), code)  # a fence inside the tags is still just code
        return CodeBlock(_dedent_fence(code), text[:start].strip())
    fences = list(_FENCE.finditer(text))
    if not fences:
        return None
    return CodeBlock("\n".join(m.group(1) for m in fences).strip("\n"), text[:fences[0].start()].strip())


def for_the_user(text: str) -> str:
    """The reply as the user should see it: ``show`` fences become plain python fences."""
    return _SHOW_FENCE.sub(lambda m: f"```{m.group(1)}\n", text)


def _dedent_fence(code: str) -> str:
    code = code.strip("\n")
    if code.lstrip().startswith("```"):
        code = code.split("\n", 1)[1] if "\n" in code else ""
        code = code.rsplit("```", 1)[0]
    return code.strip("\n")
