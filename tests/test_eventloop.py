"""Stopping what runs in the background: a cancel that ``asyncio.wait_for`` swallowed is honoured."""

from __future__ import annotations

import asyncio

from nanobot.eventloop import Background, raise_if_cancelled


async def test_a_reader_whose_cancel_wait_for_swallowed_stops_before_its_next_long_wait() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns its future's result, dropping the cancel, when
    the cancel comes as that future completes (aioimaplib waits on every IMAP command so): the
    email reader ran on into its next IDLE after the stop's cancel, and the stop waited on it."""
    answers: list[asyncio.Future[None]] = []
    idled = asyncio.Event()

    async def reader() -> None:
        while True:
            answers.append(asyncio.get_running_loop().create_future())
            await asyncio.wait_for(answers[-1], 60)  # a command, answered within the minute
            raise_if_cancelled()
            idled.set()  # the long wait for new mail
            await asyncio.Event().wait()

    background = Background()
    task = background.run(reader())
    while not answers:
        await asyncio.sleep(0)
    answers[-1].set_result(None)  # the answer is in, not yet seen: the stop's cancel comes now
    async with asyncio.timeout(10):
        await background.stop()
    assert task.cancelled() and not idled.is_set()
