"""Objects are whole when built: no object gets a collaborator assigned from outside after
construction (``outbox.sender = ...``, ``router.on_lost = ...``). A collaborator is passed to
the constructor; an object that must tell another about itself later calls a method of it.

The check: no assignment ``X.attr = value`` with ``X`` not ``self``, where the value is a
function (a lambda) or something of the assigning object's (``self.send``, ``self.service``).
Data handed over (``result.error = text``) is not a collaborator and is not flagged.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The links still made after building, each with why; the list only shrinks.
KNOWN = {
    # The cron service is built with the gateway's CronJobs (its runner asks the gateway for
    # turns), and the runtime's SchedulerLink is how the cron tools reach it.
    "nanobot/gateway/cron_jobs.py: runtime.scheduler.service = self.service",
}


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


def test_no_collaborator_is_assigned_after_construction() -> None:
    found = {line for root in ("nanobot", "channels") for path in sorted((ROOT / root).rglob("*.py"))
             for line in late_links(path)}
    assert found - KNOWN == set(), "assigned after construction (pass it to the constructor):\n" + "\n".join(
        sorted(found - KNOWN))
    assert KNOWN - found == set(), f"gone, so take them off KNOWN: {KNOWN - found}"


def test_the_check_sees_a_late_link(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("class A:\n    def wire(self, outbox):\n        outbox.sender = self.deliver\n"
                     "        outbox.on_state = lambda: None\n        outbox.count = 3\n")
    assert late_links(probe, tmp_path) == ["probe.py: outbox.sender = self.deliver",
                                           "probe.py: outbox.on_state = lambda: None"]
