"""The access gate and pairing store: allowFrom matching, codes, limits, approval from the CLI."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanobot.access import CODE_ALPHABET, AccessGate, PairingPolicy, PairingStore, listed
from nanobot.bus import Identity
from nanobot.cli import app
from nanobot.database import SqliteDatabase


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def db(home: Path):
    db = await SqliteDatabase.open(home / "nanobot.db")
    yield db
    await db.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def gate(db, clock) -> AccessGate:
    policy = PairingPolicy(code_ttl=3600, resend_interval=600, max_pending=3)
    return AccessGate(await PairingStore.open(db, policy, clock))


def code_in(reply: str) -> str:
    return re.search(r"approve (\w+)", reply).group(1)


@pytest.mark.parametrize("allow_from, sender, expected", [
    (["*"], Identity("1"), True),
    (["42"], Identity("42", "bob"), True),
    (["alice"], Identity("42", "Alice"), True),
    (["@alice"], Identity("42", "alice"), True),
    (["42"], Identity("7", "42"), False),  # an all-digit entry is an id, never a username
    ([], Identity("42", "alice"), False),
    (["bob"], Identity("42", "alice"), False),
    # A display name (a From name, a profile name) is never an identity, whatever it says.
    (["alice"], Identity("42", None, "alice"), False),
    (["ada@example.org"], Identity("eve@evil.test", None, "ada@example.org"), False),
    (["ada@example.org"], Identity("ada@example.org", None, "Eve"), True),
])
def test_allow_from_matching(allow_from, sender, expected) -> None:
    assert listed(allow_from, sender) is expected


async def test_listed_sender_is_admitted_without_a_code(gate: AccessGate) -> None:
    assert await gate.check("telegram", Identity("42", "alice"), ["42"], True) == (True, None)
    assert await gate.store.pending() == []


async def test_stranger_in_private_gets_a_code_once_per_interval(gate: AccessGate, clock: Clock) -> None:
    admitted, reply = await gate.check("telegram", Identity("666", "mallory"), [], True)
    assert not admitted and "nanobot pairing approve" in reply
    code = code_in(reply)
    assert len(code) == 8 and set(code) <= set(CODE_ALPHABET)
    assert await gate.check("telegram", Identity("666", "mallory"), [], True) == (False, None)  # no reply spam
    clock.now += 601
    admitted, again = await gate.check("telegram", Identity("666", "mallory"), [], True)
    assert not admitted and code_in(again) == code  # a reminder, not a new code
    clock.now += 3600  # expired: a fresh code
    _, fresh = await gate.check("telegram", Identity("666", "mallory"), [], True)
    assert code_in(fresh) != code


async def test_stranger_in_group_is_ignored_silently(gate: AccessGate) -> None:
    assert await gate.check("discord", Identity("666", "mallory"), [], False) == (False, None)
    assert await gate.store.pending() == []


async def test_pending_codes_are_capped_without_silencing_newcomers(gate: AccessGate) -> None:
    for user in ("1", "2", "3"):
        assert (await gate.check("telegram", Identity(user, None), [], True))[1]
    _, reply = await gate.check("telegram", Identity("4", None), [], True)
    assert code_in(reply)  # a flood of strangers does not silence the next real one
    assert [r.sender_id for r in await gate.store.pending()] == ["2", "3", "4"]  # the oldest made room


async def test_a_strangers_repeats_cost_no_write(gate: AccessGate, db) -> None:
    await gate.check("telegram", Identity("666", "mallory"), [], True)
    statements: list[str] = []
    await db.conn.set_trace_callback(statements.append)
    for _ in range(50):
        assert await gate.check("telegram", Identity("666", "mallory"), [], True) == (False, None)
    await db.conn.set_trace_callback(None)
    writes = [s for s in statements if not s.lstrip().upper().startswith("SELECT")]
    assert writes == [] and len(statements) <= 50  # one lookup each (approved meanwhile?), nothing else


async def test_approve_admits_and_forgives_typing(gate: AccessGate) -> None:
    _, reply = await gate.check("telegram", Identity("666", "mallory"), [], True)
    code = code_in(reply)
    user = await gate.store.approve(f" {code[:4].lower()}-{code[4:]} ")
    assert (user.channel, user.sender_id, user.sender_name) == ("telegram", "666", "@mallory")
    assert await gate.check("telegram", Identity("666", "mallory"), [], False) == (True, None)
    assert await gate.store.pending() == []
    with pytest.raises(ValueError, match="no pending pairing code"):
        await gate.store.approve(code)  # one-time


async def test_expired_code_cannot_be_approved(gate: AccessGate, clock: Clock) -> None:
    code = code_in((await gate.check("telegram", Identity("666", None), [], True))[1])
    clock.now += 3601
    with pytest.raises(ValueError):
        await gate.store.approve(code)


async def test_cli_lists_and_approves(db, home: Path) -> None:
    gate = AccessGate(await PairingStore.open(db))
    code = code_in((await gate.check("discord", Identity("99", "stranger"), [], True))[1])
    listing = await nanobot_cli("pairing", "list")
    assert listing.exit_code == 0 and code in listing.output and "stranger" in listing.output
    approved = await nanobot_cli("pairing", "approve", code)
    assert approved.exit_code == 0, approved.output
    assert await gate.store.is_paired("discord", "99")  # seen through the other connection at once
    assert (await nanobot_cli("pairing", "approve", code)).exit_code == 1
    assert "discord 99 (@stranger)" in (await nanobot_cli("pairing", "list")).output



async def test_cli_shows_a_strangers_name_and_address_never_obeying_them(db, home: Path) -> None:
    """What a stranger chose (an address an email domain vouches for may hold any character)
    is shown with its control characters written out: no escape sequence, nothing backwards."""
    gate = AccessGate(await PairingStore.open(db))
    code = code_in((await gate.check("email", Identity("\u202eevil@x.example\x1b]0;owned\x07", "ev\x9bil"), [],
                                     True))[1])
    listed, approved = await nanobot_cli("pairing", "list"), await nanobot_cli("pairing", "approve", code)
    for output in (listed.output, approved.output, (await nanobot_cli("pairing", "list")).output):
        assert "\\u202eevil@x.example\\x1b]0;owned\\x07" in output and "@ev\\x9bil" in output
        assert not {"\x1b", "\x9b", "\u202e", "\x07"} & set(output)


async def nanobot_cli(*args: str):
    """The CLI runs its own event loop, so from an async test it runs in a thread."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


async def test_pairing_work_is_rate_limited_across_strangers(db, clock) -> None:
    gate = AccessGate(await PairingStore.open(db, PairingPolicy(codes_per_minute=2, max_pending=10), clock))
    replies = [(await gate.check("telegram", Identity(str(uid)), [], True))[1] for uid in range(1, 6)]
    assert [bool(r) for r in replies] == [True, True, False, False, False]
    assert len(await gate.store.pending()) == 2  # no row for the strangers past the rate
    clock.now += 60
    assert (await gate.check("telegram", Identity("5", None), [], True))[1]  # a minute on: pairing works again
