"""The garbage collector during a command's start.

Start-up builds the program (openai's ~650 model classes, pydantic's, the config) and little
garbage, yet the collector scanned it again and again meanwhile: 250 ms of ``nanobot agent``'s
start, two full scans among them. It is off from the entry (``for_the_start``) until the
program is built (``started``: the runtime is open, or the chat through a running gateway
begins), then on, with what start-up made frozen, so that no later scan goes over it again (a
full one took 0.1 s). A command that reaches neither (``status``, ``cron list``) ends with it
off: it makes nothing that lasts.
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
