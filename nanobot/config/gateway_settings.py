"""``gateway`` and ``database``: the daemon's heartbeat, API, metrics, workers and the store."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from nanobot.config.base import Section, _check_listen, is_near, listen_address, url_without_password


class Heartbeat(Section):
    enabled: bool = True
    interval_minutes: int = Field(30, gt=0)
    to: str | None = Field(None, pattern=r"^[^:\s]+:\S+$")  # "channel:chat_id"; default: the first owner chat


class Api(Section):
    """The OpenAI-compatible API and the web page on the gateway (nanobot/api/)."""

    enabled: bool = False
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:8765"  # beyond loopback: a key first
    max_body_kb: int = Field(1024, gt=0)
    requests_per_minute: int = Field(60, gt=0)  # per key
    concurrent_turns: int = Field(4, gt=0)  # per key

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)


class Metrics(Section):
    """Prometheus metrics (and /healthz, /readyz) of this worker (nanobot/metrics.py)."""

    enabled: bool = False
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:9464"

    def address(self) -> tuple[str, int]:
        return listen_address(self.listen)


class Gateway(Section):
    heartbeat: Heartbeat = Heartbeat()
    api: Api = Api()
    metrics: Metrics = Metrics()
    log_format: Literal["text", "json"] = "text"  # json: one object per line (time, level, logger, ...)
    max_concurrent_sessions: int = Field(16, gt=0)
    idle_worker_seconds: float = Field(300.0, gt=0)
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    cron_grace_seconds: int = Field(3600, ge=0)
    max_messages_per_turn: int = Field(20, gt=0)
    max_cron_jobs_per_chat: int = Field(20, gt=0)
    # Workers on one PostgreSQL (database.url): who this one is, and how soon the others take
    # over what a dead one held.
    worker_id: str = Field("", max_length=100)  # "": HOST:PID
    failover_seconds: float = Field(10.0, ge=4.0, le=300.0)


ENCRYPTED_SSLMODES = ("require", "verify-ca", "verify-full")


def unencrypted_database(url: str) -> str | None:
    """Why a PostgreSQL URL would carry the chats unencrypted (a far host, no TLS demanded), or None.
    Without ``sslmode`` the driver falls back to plain text where the server has no TLS."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    sslmode = (query.get("sslmode") or [os.environ.get("PGSSLMODE", "prefer")])[-1]
    named = parts.netloc.rpartition("@")[2].split(",") + ",".join(query.get("host", [])).split(",")
    hosts = [entry[1:].partition("]")[0] if entry.startswith("[") else entry.partition(":")[0] for entry in named]
    far = [host for host in hosts if host and not host.startswith("/") and not is_near(host)]
    if far and sslmode not in ENCRYPTED_SSLMODES:
        return (f"{far[0]} is not on this machine or a private network, and without ?sslmode=verify-full (or "
                "require) every chat could cross the network unencrypted")
    return None


def _check_database_url(url: str) -> str:
    url = url.strip()
    if url in ("", "sqlite"):
        return url
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise ValueError(f"{url_without_password(url)!r} is not a database this nanobot knows: use \"sqlite\" "
                         "(the default) or postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    if trouble := unencrypted_database(url):
        raise ValueError(trouble)
    return url


DatabaseUrl = Annotated[str, AfterValidator(_check_database_url)]


class Database(Section):
    # "" or "sqlite": nanobot.db and JSONL histories in the home (the default). A PostgreSQL URL
    # (any libpq URI; a Unix socket directory as ?host=/path) is for several workers (issue 21).
    url: DatabaseUrl = ""

    @property
    def engine(self) -> Literal["sqlite", "postgresql"]:
        return "sqlite" if self.url in ("", "sqlite") else "postgresql"
