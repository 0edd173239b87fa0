"""The garbage collector during a command's start, and at its end.

Start-up builds the program (openai's ~650 model classes, pydantic's, the config) and little
garbage, yet the collector scanned it again and again meanwhile: 250 ms of ``nanobot agent``'s
start, two full scans among them. It is off from the entry (``for_the_start``) until the
program is built (``started``: the runtime is open, or the chat through a running gateway
begins), then on, with what start-up made frozen, so that no later scan goes over it again (a
full one took 0.1 s). A command that reaches neither (``status``, ``cron list``) ends with it
off: it makes nothing that lasts. At the end (``at_exit``) all that is left is the loaded
program, and the interpreter's last scans over it took 0.5-0.8 s at every command's exit (and
the gateway's): frozen, they skip it.
"""

from __future__ import annotations

import gc


def for_the_start() -> None:
    gc.disable()


def started() -> None:
    """On, if the start turned it off; a process that kept it on (tests, a program embedding
    nanobot) is left as it is."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def at_exit() -> None:
    """Files and sockets are closed by now, and standard output is flushed by the interpreter
    all the same."""
    gc.freeze()
