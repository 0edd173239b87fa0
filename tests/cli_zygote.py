"""``nanobot`` commands for the tests, each a process of its own, forked from one that has
imported nanobot and its libraries already.

A command run as ``python -m nanobot`` spends 0.3-0.8 s of CPU importing (openai's types alone
are 0.4 s) before it does its work, and the suite runs a few hundred: that was a third of its
CPU. Here one process per test worker (the zygote) imports them once; each command is a fork
of it, with the caller's arguments, environment, working directory and stdin/stdout/stderr,
that runs ``nanobot`` (or another module: the tests' MCP servers, by ``tests/fakes/forked.py``)
and exits as the command would (its atexit handlers, its threads joined), its exit code sent
back. What needs a fresh interpreter (a ``PYTHON*`` variable, read at start) runs as
``python -m nanobot`` (``tests.test_cli.nanobot``).

    python -m tests.cli_zygote SOCKET_PATH     # serves until its parent closes its stdin
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from asyncio.streams import FlowControlMixin
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PRELOADED = ("nanobot.entry", "nanobot.cli", "nanobot.cli.onboarding", "nanobot.gateway", "nanobot.mcp.cli",
             "nanobot.providers.openai_provider", "mcp.client.stdio", "mcp.client.streamable_http",
             "nanobot_channels.telegram", "nanobot_channels.slack", "nanobot_channels.email",  # gateways
             "mcp.server.mcpserver", "uvicorn", "sse_starlette")  # tests/fakes/mcp_notes.py
_zygote: tuple[subprocess.Popen[bytes], str] | None = None
_starting = threading.Lock()  # commands come from threads (asyncio.to_thread): one zygote


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    """``nanobot *args`` in a fork of this test process's zygote: (exit code, stdout, stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            open(os.devnull, "rb") as stdin, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.settimeout(timeout)
        conn.connect(socket_path())
        job = json.dumps({"argv": args, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [job], [stdin.fileno(), out.fileno(), err.fileno()])
        pid = struct.unpack("!i", _recv(conn, 4))[0]
        try:
            code = struct.unpack("!i", _recv(conn, 4))[0]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


async def start(args: list[str], env: dict[str, str], module: str = "nanobot", cwd: str | Path | None = None,
                **streams: Any) -> Forked:
    """``python -m MODULE *args`` forked by the zygote, held as ``asyncio.create_subprocess_exec``
    holds a process (``streams``: stdin/stdout/stderr as it takes them: PIPE, DEVNULL, STDOUT, a
    file or fd)."""
    loop = asyncio.get_running_loop()
    path = await asyncio.to_thread(socket_path)
    ours, theirs = {}, []
    with ExitStack() as opened:
        for target, name in enumerate(("stdin", "stdout", "stderr")):
            given = streams.get(name)
            if given == asyncio.subprocess.PIPE:
                read, write = os.pipe()
                ours[name], given = (write, read) if target == 0 else (read, write)
                opened.callback(os.close, given)
            elif given == asyncio.subprocess.DEVNULL:
                given = opened.enter_context(open(os.devnull, "rb" if target == 0 else "wb")).fileno()
            elif given == asyncio.subprocess.STDOUT:
                given = theirs[1]
            elif given is None:
                given = target  # inherited, as a subprocess's are
            theirs.append(given if isinstance(given, int) else given.fileno())
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
        job = json.dumps({"module": module, "argv": args, "env": env, "cwd": str(cwd or os.getcwd())}).encode()
        socket.send_fds(conn, [job], theirs)
    conn.setblocking(False)
    pid = struct.unpack("!i", await loop.sock_recv(conn, 4))[0]
    pipes = {name: await (_writer if name == "stdin" else _reader)(fd) for name, fd in ours.items()}
    return Forked(pid, conn, **pipes)


class Forked:
    """What the tests use of ``asyncio.subprocess.Process``, for a command the zygote forked: its
    exit code comes over the zygote's connection (it is not this process's child)."""

    def __init__(self, pid: int, conn: socket.socket, stdin: asyncio.StreamWriter | None = None,
                 stdout: asyncio.StreamReader | None = None, stderr: asyncio.StreamReader | None = None) -> None:
        self.pid, self.stdin, self.stdout, self.stderr = pid, stdin, stdout, stderr
        self.returncode: int | None = None
        self._exit = asyncio.ensure_future(self._exit_code(conn))

    async def _exit_code(self, conn: socket.socket) -> int:
        with conn:
            data = await asyncio.get_running_loop().sock_recv(conn, 4)
        self.returncode = struct.unpack("!i", data)[0]
        return self.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
                await self.stdin.drain()
            self.stdin.close()
        out, err = await asyncio.gather(*(s.read() if s else asyncio.sleep(0) for s in (self.stdout, self.stderr)))
        await self.wait()
        return out, err


async def _reader(fd: int) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=2 ** 16)  # asyncio.subprocess's own limit
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                       os.fdopen(fd, "rb", 0))
    return reader


async def _writer(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(FlowControlMixin, os.fdopen(fd, "wb", 0))
    return asyncio.StreamWriter(transport, protocol, None, loop)


def _recv(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        if not (chunk := conn.recv(size - len(data))):
            raise ConnectionError("the zygote went away")
        data += chunk
    return data


def socket_path() -> str:
    """The zygote's socket, started at the first command (it ends with this process: its stdin closes).
    ``tests/fakes/forked.py SOCKET MODULE ARGS`` runs a module forked by it."""
    global _zygote
    with _starting:
        if _zygote is None or _zygote[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="nanobot-zygote-"), "sock")
            proc = subprocess.Popen([sys.executable, "-m", "tests.cli_zygote", path], cwd=REPO,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n", "the zygote did not start"
            _zygote = (proc, path)
        return _zygote[1]


def _serve(path: str) -> dict | None:
    """Accept commands until stdin closes; in a forked child, return its job."""
    for name in PRELOADED:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # a job is one message, whole
    listener.bind(path)
    listener.listen(64)
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)  # a child's exit wakes the loop below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}  # a command's pid -> the connection its exit code goes to
    with selectors.DefaultSelector() as selector:
        for source in (listener, wakeup_r, sys.stdin):
            selector.register(source, selectors.EVENT_READ)
        print("ready", flush=True)
        while True:
            for key, _ in selector.select():
                if key.fileobj is sys.stdin:
                    os.unlink(path)
                    os.rmdir(os.path.dirname(path))
                    return None
                if key.fileobj == wakeup_r:
                    os.read(wakeup_r, 512)
                    _reap(waiting)
                    continue
                conn, _ = listener.accept()
                raw, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                if (pid := os.fork()) == 0:  # the command: none of the zygote's sockets or signal handling
                    for held in (listener, conn, *waiting.values()):
                        held.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wakeup_r)
                    os.close(wakeup_w)
                    for target, fd in enumerate(fds):  # its stdin, stdout, stderr
                        os.dup2(fd, target)
                        os.close(fd)
                    return json.loads(raw)
                for fd in fds:
                    os.close(fd)
                conn.sendall(struct.pack("!i", pid))
                waiting[pid] = conn


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if (conn := waiting.pop(pid, None)) is not None:
            with conn, suppress(OSError):  # a test that went away no longer asks
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))


if __name__ == "__main__":
    if (job := _serve(sys.argv[1])) is not None:
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        module = job.get("module", "nanobot")
        sys.argv = [module, *job["argv"]]
        runpy.run_module(module, run_name="__main__")  # as ``python -m MODULE`` runs it
