"""A real Matrix homeserver for the tests: Synapse (PyPI ``matrix-synapse``) in its own venv,
on SQLite, listening on one loopback port, federation and outside key servers off.

The venv is ``.venv-synapse`` in the repository (made on first use, about a minute; its
dependencies would clash with ours in one venv), or the Python that ``NANOBOT_SYNAPSE_PYTHON``
names. Users are registered through the shared-secret admin API, as
``register_new_matrix_user`` does. When Synapse cannot be installed or started, the tests skip
with one line saying how to get it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import aiohttp
import yaml

from tests.fakes.loopback import free_port

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-synapse"
VERSION = "1.163.0"
START_S = 90.0  # about 12 s on SQLite here; a loaded CI machine may take longer
HOW = (f"python3 -m venv {VENV.name} && {VENV.name}/bin/pip install matrix-synapse=={VERSION} "
       "(or set NANOBOT_SYNAPSE_PYTHON to a Python that has it)")
LIMITS = {"per_second": 1000, "burst_count": 1000}


class SynapseUnavailable(Exception):
    """Synapse could not be had here; the message says how to get it."""


@dataclass
class Homeserver:
    url: str
    server_name: str
    shared_secret: str
    passwords: dict[str, str] = field(default_factory=dict)  # user id -> the password it was registered with

    async def register(self, name: str = "") -> tuple[str, str]:
        """A new user (a unique name): (user id, access token)."""
        username = f"{name or 'user'}{uuid.uuid4().hex[:8]}"
        password = uuid.uuid4().hex
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        async with aiohttp.ClientSession() as http:
            async with http.get(endpoint) as response:
                nonce = (await response.json())["nonce"]
            mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
            mac.update(b"\x00".join([nonce.encode(), username.encode(), password.encode(), b"notadmin"]))
            body = {"nonce": nonce, "username": username, "password": password, "admin": False,
                    "mac": mac.hexdigest()}
            async with http.post(endpoint, json=body) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"registering {username}: {answer}")
        self.passwords[answer["user_id"]] = password
        return answer["user_id"], answer["access_token"]


def synapse_python() -> str:
    """A Python with Synapse, installing it into ``.venv-synapse`` once (one installer at a time)."""
    explicit = os.environ.get("NANOBOT_SYNAPSE_PYTHON")
    if explicit:
        return explicit
    python = VENV / "bin" / "python"
    with open(REPO / ".venv-synapse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _has_synapse(python):
            try:
                subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
                subprocess.run([str(python), "-m", "pip", "install", "-q", f"matrix-synapse=={VERSION}"],
                               check=True, capture_output=True, timeout=900)
            except (subprocess.SubprocessError, OSError) as exc:
                said = getattr(exc, "stderr", b"") or b""
                raise SynapseUnavailable(f"could not install matrix-synapse ({exc}; "
                                         f"{said.decode(errors='replace').strip()[-200:]}): {HOW}") from None
    return str(python)


def _has_synapse(python: Path) -> bool:
    return python.exists() and subprocess.run([str(python), "-c", "import synapse"], capture_output=True).returncode == 0


@contextlib.contextmanager
def homeserver(folder: Path) -> Iterator[Homeserver]:
    """A started Synapse with its data in ``folder``; stopped on the way out."""
    python = synapse_python()
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "homeserver.yaml"
    subprocess.run([python, "-m", "synapse.app.homeserver", "--server-name", "test.local", "--config-path",
                    str(config), "--generate-config", "--report-stats=no", "--data-directory", str(folder / "data")],
                   check=True, capture_output=True, cwd=folder)
    settings = yaml.safe_load(config.read_text())
    port = free_port()
    settings.update(
        listeners=[{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                    "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}],
        trusted_key_servers=[], suppress_key_server_warning=True, federation_domain_whitelist=[],
        enable_metrics=False, presence={"enabled": False}, url_preview_enabled=False,
        rc_message=LIMITS, rc_registration=LIMITS, rc_admin_redaction=LIMITS,
        rc_login={"address": LIMITS, "account": LIMITS, "failed_attempts": LIMITS},
        rc_joins={"local": LIMITS, "remote": LIMITS}, rc_joins_per_room=LIMITS,
        rc_invites={"per_room": LIMITS, "per_user": LIMITS, "per_issuer": LIMITS},
        rc_media_create=LIMITS, bcrypt_rounds=4)  # registering: 3 ms, not 0.8 s
    settings.pop("log_config")  # its own log file: the output goes to synapse.log below
    config.write_text(yaml.safe_dump(settings))
    url = f"http://127.0.0.1:{port}"
    with open(folder / "synapse.log", "wb") as log:
        proc = subprocess.Popen([python, "-m", "synapse.app.homeserver", "--config-path", str(config)],
                                cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_up(url, proc, folder / "synapse.log")
        yield Homeserver(url, "test.local", settings["registration_shared_secret"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_up(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SynapseUnavailable(f"Synapse exited ({proc.returncode}): {log.read_text()[-400:]}")
        try:
            with urllib.request.urlopen(f"{url}/_matrix/client/versions", timeout=1):
                return
        except OSError:
            time.sleep(0.1)  # Synapse says nothing else when it is up
    raise SynapseUnavailable(f"Synapse did not answer within {START_S:g} s: {log.read_text()[-400:]}")
