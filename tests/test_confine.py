"""The shell launcher (``nanobot/confine.py``) as exec_command runs it: a real child
process, real Landlock and seccomp. Each attack names what must stop it; positive controls
show that ordinary work still runs. Skipped where the kernel cannot confine (the fail-closed
path has its own test in test_trust_process.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nanobot import confine

pytestmark = pytest.mark.skipif(not confine.probe().ok, reason="this kernel cannot confine: " + confine.probe().detail)


def run(root: Path, command: str, *extra: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-I", "-S", confine.__file__, "--rw", str(root), "--cpu", "20", *extra,
            "--", "/bin/sh", "-c", command]
    return subprocess.run(argv, cwd=root if root.exists() else None, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root), "LANG": "C.UTF-8"})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "chat"
    path.mkdir()
    return path


def test_ordinary_work_runs(root: Path) -> None:
    done = run(root, "python3 -c 'print(6 * 7)' && git init -q repo && cd repo && echo hi > a.txt && "
                     "git add a.txt && git -c user.email=a@b -c user.name=n commit -qm first && "
                     "tar czf ../a.tgz . && cd .. && tar tzf a.tgz | grep -c a.txt && ls /usr/bin | grep -c . "
                     "&& echo quiet 2>/dev/null")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == "42" and lines[1] == "1" and int(lines[2]) > 10 and lines[3] == "quiet"
    assert (root / "repo" / ".git").is_dir()


def test_files_outside_the_root_are_unreadable_and_unwritable(root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("CANARY-OUTSIDE")
    done = run(root, f"cat {secret}; echo x > {tmp_path}/planted; ls {tmp_path}; cat /root/.bashrc")
    assert "CANARY-OUTSIDE" not in done.stdout
    assert not (tmp_path / "planted").exists()
    assert done.stderr.count("Permission denied") >= 3


def test_no_capabilities_even_as_root(root: Path) -> None:
    done = run(root, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status")
    values = [line.split()[1] for line in done.stdout.splitlines()]
    assert len(values) == 4 and set(values) == {"0000000000000000"}


def test_daemon_memory_and_environment_are_unreachable(root: Path) -> None:
    done = run(root, "cat /proc/$PPID/environ; cat /proc/$PPID/mem; ls /proc/$PPID/cwd/")
    assert done.stdout == ""
    assert done.stderr.count("Permission denied") == 3


@pytest.mark.parametrize("abi", [0, 5])  # 0: the kernel's own (Landlock scopes signals); 5: seccomp guards
def test_the_daemon_cannot_be_signalled(root: Path, abi: int) -> None:
    # kill -0 only asks "may I?": if the guard failed, nothing is actually sent to the test runner.
    done = run(root, "kill -0 $PPID && echo REACHED; sleep 30 & kill $! && echo own-child-ok",
               *(["--abi", str(abi)] if abi else []))
    assert "REACHED" not in done.stdout and "own-child-ok" in done.stdout


def test_no_sockets_unless_the_network_is_allowed(root: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(0.5)
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    try:
        denied = run(root, f'python3 -c "{code}"')
        assert "CONNECTED" not in denied.stdout and "PermissionError" in denied.stderr
        with pytest.raises(TimeoutError):
            listener.accept()
        allowed = run(root, f'python3 -c "{code}"', "--network")
        assert "CONNECTED" in allowed.stdout
    finally:
        listener.close()


def test_no_new_session_so_the_group_kill_reaches_everything(root: Path) -> None:
    done = run(root, "setsid true || echo no-setsid; python3 -c 'import os; os.setpgid(0, 0)' || echo no-setpgid")
    assert "no-setsid" in done.stdout and "no-setpgid" in done.stdout


def test_rlimits_bound_file_size(root: Path) -> None:
    done = run(root, "head -c 2000000 /dev/zero > big; wc -c < big", "--fsize", "1000000")
    assert done.stdout.strip() == "1000000"


def test_a_step_that_fails_refuses_to_run_the_command(root: Path) -> None:
    done = run(root / "missing", "echo RAN")
    assert done.returncode == confine.EXIT_REFUSED and "RAN" not in done.stdout
    assert confine.MARK in done.stderr and "missing" in done.stderr
