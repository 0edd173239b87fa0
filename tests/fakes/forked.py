"""``python tests/fakes/forked.py SOCKET MODULE ARGS...``: ``python -m MODULE ARGS`` forked by a
test worker's zygote (tests/cli_zygote.py), standing in for it as this process.

For a child the code under test starts (an MCP server over stdio): the module's imports are done
already in the zygote, so this costs a bare interpreter's start. The fork gets this process's
stdin, stdout and stderr and holds them alone (their ends close when it exits, as a child's
do); TERM, INT and HUP sent here go to it, and this process exits as it did. Run by path, not
``-m``: only the standard library is imported.
"""

import json
import os
import signal
import socket
import struct
import sys


def main() -> None:
    path, module, *argv = sys.argv[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(path)
    job = {"module": module, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(job).encode()], [0, 1, 2])
    pid = struct.unpack("!i", conn.recv(4))[0]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda sig, _: os.kill(pid, sig))
    nothing = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(nothing, fd)
    code = struct.unpack("!i", conn.recv(4))[0]
    if code < 0:  # killed by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
