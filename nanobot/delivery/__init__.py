"""Durable delivery: no message lost or answered twice across crashes and outages.

- ``store``: the ``inbound`` and ``outbox`` tables, written by one task that commits in
  batches (cheap under load); incoming messages are also synced to disk before the platform
  is told they arrived, so they survive a power cut too.
- ``intake``: messages are recorded before the platform is told they arrived (Telegram's
  offset moves only past stored updates), repeats are dropped, and unfinished ones are queued
  again at start.
- ``outbox``: how unsent replies are retried, in order per chat, for as long as the platform
  is down (``SendGate``); recording a reply before it is sent and marking it when the
  platform accepted it is ``gateway.outbound.Outbound``'s.
"""
