"""What the sandbox offers a program, said once: for the prompt, and for the errors a program
gets when it reaches for what is not there.

The lists are checked against Monty itself by the tests (each module imported in a real
sandbox), so the prompt cannot drift from what ``import`` does.
"""

from __future__ import annotations

# Modules a program can import (Monty's own implementations). ``os`` imports, but only its
# pure parts work (``os.path``); file and process calls are refused.
MODULES = ("json", "re", "math", "datetime", "time", "random", "collections", "itertools", "functools",
           "hashlib", "base64", "copy", "pathlib", "bisect", "decimal", "tomllib", "csv", "typing",
           "dataclasses", "asyncio", "unicodedata", "os (os.path only)")

# Modules a model often reaches for that are missing, and what to use instead.
MISSING_MODULES = {
    "statistics": "use sum(xs) / len(xs), sorted(xs)[len(xs) // 2], max and min",
    "heapq": "use sorted(xs)[:n] or min/max with key=",
    "string": "use str methods and literals, e.g. 'abcdefghijklmnopqrstuvwxyz'",
    "textwrap": "split and join the lines yourself",
    "io": "build text in a list and '\\n'.join(parts); csv.reader takes a list of lines",
    "operator": "use a lambda, e.g. key=lambda r: r['total']",
    "enum": "use constants or a dict",
    "uuid": "use hashlib or random.getrandbits(128)",
    "zoneinfo": "use datetime with a timezone(timedelta(hours=...)) offset",
    "struct": "use int.from_bytes / int.to_bytes",
    "subprocess": "use exec_command(command)",
    "urllib": "use web_fetch(url)",
    "requests": "use web_fetch(url)",
    "shutil": "use move_file, delete_file, or exec_command",
    "glob": "use glob(pattern), a function already here (no import)",
}

# Builtins Monty does not have, and what to do instead.
MISSING_BUILTINS = {
    "dir": "print the names you want to look at",
    "__import__": "write `import name`",
    "globals": "keep what you need in a dict of your own",
    "locals": "keep what you need in a dict of your own",
    "vars": "keep what you need in a dict of your own",
    "eval": "write the code in the program itself",
    "exec": "write the code in the program itself",
    "open": "use read_file(path) and write_file(path, content)",
}


def import_refusal(module: str) -> ModuleNotFoundError:
    """The error ``import module`` raises in a program: the module, and the usual replacement."""
    top = module.split(".")[0]
    hint = MISSING_MODULES.get(top, "the sandbox has only these modules: " + ", ".join(MODULES))
    return ModuleNotFoundError(f"No module named {module!r} in the sandbox; {hint}")


def builtin_refusal(name: str) -> NameError:
    return NameError(f"{name}() is not available in the sandbox; {MISSING_BUILTINS[name]}")


def prompt_line() -> str:
    """The code-mode prompt's line on imports."""
    return f"Imports: {', '.join(MODULES)}; no others (an import error says what to use instead)."
