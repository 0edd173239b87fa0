"""Objects are whole when built: no object gets a collaborator from outside after construction.
A collaborator is passed to the constructor; an object that must tell another about itself
later calls a method of it, or sets a flag it was built with (``eventloop.Changed``).

Three checks, each on every module of nanobot/ and channels/:

- no assignment ``X.attr = value`` with ``X`` not ``self``, where the value is a function (a
  lambda) or something of the assigning object's (``outbox.sender = self.send``);
- no method setter: a method (not ``__init__``) that keeps a parameter which is not plain
  data in ``self`` (``def handover(self, holder): self._holder = holder``, or appended to a
  list of its own), which is how a link is made after building through the front door;
- no collaborator's container changed in place: a function (a lambda, one defined in the
  module, or something of the calling object's) put into a list or dict of another object's
  (``extras.append(lambda ctx: ...)``, ``gateway.hooks["x"] = self.on_x``).

Data handed over (``result.error = text``, ``found.notes.append(text)``) is not a collaborator
and is not flagged.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Parameters of these types are data, not collaborators (Aside: a note the API streams).
DATA_TYPES = {"str", "int", "float", "bool", "bytes", "None", "Path", "list", "dict", "tuple", "set", "Any", "Aside"}
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault"}


def rooted_at_self(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def late_links(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)):
            continue
        target = node.targets[0]
        if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
            continue
        if isinstance(node.value, ast.Lambda) or (isinstance(node.value, ast.Attribute) and rooted_at_self(node.value)):
            found.append(f"{path.relative_to(root)}: {ast.unparse(node)}")
    return found


def is_data(annotation: ast.expr | None) -> bool:
    return annotation is not None and all(
        node.id in DATA_TYPES for node in ast.walk(annotation) if isinstance(node, ast.Name))


def method_setters(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
        for method in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            if method.name.startswith("__"):
                continue
            params = {a.arg for a in [*method.args.args[1:], *method.args.kwonlyargs] if not is_data(a.annotation)}
            for node in ast.walk(method):
                kept = (node.value if isinstance(node, ast.Assign) and rooted_at_self(node.targets[0])
                        and isinstance(node.targets[0], ast.Attribute) else
                        node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in MUTATORS and rooted_at_self(node.func.value) and node.args else None)
                if isinstance(kept, ast.Name) and kept.id in params:
                    found.append(f"{path.relative_to(root)}: {cls.name}.{method.name} keeps {kept.id}")
    return found


def filled_from_outside(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def is_function(value: ast.expr) -> bool:
        return isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in functions) or (
            isinstance(value, ast.Attribute) and rooted_at_self(value))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            container, values = node.func.value, node.args
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            container, values = node.targets[0].value, [node.value]
        else:
            continue
        if not rooted_at_self(container) and any(is_function(v) for v in values):
            found.append(f"{path.relative_to(root)}: {ast.unparse(node)}")
    return found


def everywhere(check) -> set[str]:
    return {line for root in ("nanobot", "channels") for path in sorted((ROOT / root).rglob("*.py"))
            for line in check(path)}


def test_no_collaborator_is_assigned_after_construction() -> None:
    found = everywhere(late_links)
    assert found == set(), "assigned after construction (pass it to the constructor):\n" + "\n".join(sorted(found))


def test_no_method_keeps_a_collaborator_after_construction() -> None:
    assert everywhere(method_setters) == set(), "pass it to the constructor instead"


def test_no_collaborators_container_is_filled_from_outside() -> None:
    assert everywhere(filled_from_outside) == set(), "build the container whole and pass it to the constructor"


def test_the_checks_see_a_late_link(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("class A:\n    def wire(self, outbox):\n        outbox.sender = self.deliver\n"
                     "        outbox.on_state = lambda: None\n        outbox.count = 3\n"
                     "        outbox.hooks.append(self.deliver)\n        outbox.notes.append('data')\n\n"
                     "    def handover(self, holder: Holder, name: str) -> None:\n"
                     "        self._holder = holder\n        self.name = name\n\n"
                     "    def watch(self, on_change) -> None:\n        self._watchers.append(on_change)\n\n"
                     "def show(ctx):\n    return ''\n\n"
                     "def install(extras):\n    extras.append(show)\n    extras.append('text')\n")
    assert late_links(probe, tmp_path) == ["probe.py: outbox.sender = self.deliver",
                                           "probe.py: outbox.on_state = lambda: None"]
    assert method_setters(probe, tmp_path) == ["probe.py: A.handover keeps holder", "probe.py: A.watch keeps on_change"]
    assert sorted(filled_from_outside(probe, tmp_path)) == ["probe.py: extras.append(show)",
                                                            "probe.py: outbox.hooks.append(self.deliver)"]
