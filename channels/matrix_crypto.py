"""Matrix end-to-end encryption: matrix-nio's Olm machine (vodozemac), its keys in this home.

- The bot is one device of its account, the same at every start: an access token is the device
  it was made for (``whoami`` names it); a password login asks for the device id kept from the
  first one. The device's keys and the room keys others share with it live in
  ``<home>/keys/matrix`` (readable by this user only, and in backups).
- Among workers there is no such place (each has a home of its own and any may send a chat's
  reply): encrypted rooms are then told they cannot be read, as with ``encryption: false``.
- Keys go both ways between syncs (``exchange``): this device's keys uploaded, the keys of
  devices that changed fetched, one-time keys claimed, queued to-device messages sent.
- A room key is shared with every device of the room's members, verified or not, as Element
  does by default, and a new one goes out when someone's devices change (a new phone reads the
  next reply; a removed device does not): who wrote a message is still only its sender's user
  id, which the homeserver vouches for; no device is taken for an identity.
- A device whose keys the homeserver holds but this home does not (another client's, or a lost
  keys folder) cannot be the bot's: ``taken_by_another`` says so before any key is uploaded; a
  password login then starts over as a new device (what came before cannot be read again), a
  token goes on without encryption (as a token copied from Element, which the docs once
  suggested, did before), saying why in the log.
- A file in an encrypted room is an encrypted attachment: its key and hash travel in the
  (encrypted) event and are checked on download; files sent there are encrypted the same way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
from nio import AsyncClient, ErrorResponse
from nio.crypto.attachments import decrypt_attachment
from nio.exceptions import EncryptionError

log = logging.getLogger(__name__)

UNREADABLE_REPLY = ("I could not decrypt your last message: its key did not reach this device. Send it again, "
                    "please (if it keeps happening, start a new chat with me).")


def keys_dir(keys_root: Path | None, wanted: bool) -> Path | None:
    """Where the device's keys are kept; None: no encryption."""
    if not wanted:
        return None
    if keys_root is None:
        log.warning("matrix: end-to-end encryption needs the one gateway of a home (the device's keys live "
                    "there): among workers, encrypted rooms are told they cannot be read (channels.matrix."
                    "encryption false says so without this warning)")
        return None
    return keys_root / "matrix"


def make_private(path: Path) -> None:
    """``path`` made if missing, and readable by this user only (the keys are secrets)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.chmod(0o700)
    except OSError as exc:
        raise RuntimeError(f"matrix: the device's keys cannot be kept in {path} ({exc.strerror}); make it this "
                           "user's, or set channels.matrix.encryption to false") from None


async def taken_by_another(client: AsyncClient, homeserver: str) -> bool:
    """Whether the homeserver holds keys for this device that are not the ones kept here: another
    client's (the Element session an access token was copied from), or a keys folder that was
    lost. Uploading ours then fails for good, and no message to the bot could be read."""
    if client.olm is None or client.olm.account.shared:  # ours are up: the device is ours
        return False
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http, http.post(
            f"{homeserver}/_matrix/client/v3/keys/query", json={"device_keys": {client.user_id: [client.device_id]}},
            headers={"Authorization": f"Bearer {client.access_token}"}) as answer:
        answer.raise_for_status()
        found = (await answer.json()).get("device_keys")
    device = client.device_id
    mine = found.get(client.user_id) if isinstance(found, dict) else None
    held = mine.get(device) if isinstance(mine, dict) else None
    if not isinstance(held, dict):
        return False  # a device with no keys yet: ours go up
    # Ours already, if a crash came between their upload and nio noting it
    return (held.get("keys") or {}).get(f"ed25519:{device}") != client.olm.account.identity_keys["ed25519"]


async def exchange(client: AsyncClient, said: set[str]) -> None:
    """What the Olm machine has to send or fetch (what nio's ``sync_forever`` does after a sync):
    to-device messages, this device's keys, the keys of devices that changed, one-time keys to
    claim. A failure is logged once (``said``), not at every sync."""
    if client.olm is None:
        return
    answers = [*await client.send_to_device_messages()]
    if client.should_upload_keys:
        answers.append(await client.keys_upload())
    if client.should_query_keys:  # nio gives the rooms of someone whose devices changed a new room key
        answers.append(await client.keys_query())
    if client.should_claim_keys:
        answers.append(await client.keys_claim(client.get_users_for_key_claiming()))
    for failed in answers:
        if isinstance(failed, ErrorResponse) and str(failed) not in said:
            said.add(str(failed))
            log.warning("matrix: a key exchange failed: %s", failed)


def opened(sealed: dict[str, Any], ciphertext: bytes) -> bytes:
    """An encrypted attachment's bytes; ValueError when its key, IV or hash do not fit them."""
    try:
        return decrypt_attachment(ciphertext, sealed["key"]["k"], sealed["hashes"]["sha256"], sealed["iv"])
    except (EncryptionError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"an encrypted file that does not open ({type(exc).__name__})") from None


def sealed_content(content: dict[str, Any], content_uri: str, keys: dict[str, Any] | None) -> dict[str, Any]:
    """A file message: ``url`` in a plain room; ``file`` (the URL with its key, IV and hash) in an
    encrypted one, where the event itself is encrypted too."""
    if keys is None:
        return {**content, "url": content_uri}
    return {**content, "file": {**keys, "url": content_uri}}
