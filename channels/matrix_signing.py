"""Cross-signing: the bot's device signed by its account, so Element does not mark each of its
encrypted messages "sent from a device not verified by its owner" (and clients that leave out
such devices' messages still show them).

At the first start with encryption the account gets a master key and a self-signing key (made
here, kept in the device's keys folder; Synapse takes an account's first cross-signing keys
without asking for the password again, other servers may ask: the password login answers), and
the self-signing key signs the device; at every later start the device's signature is checked.
Keys lost with the folder are made again with the password (the server asks for it to replace
them), as Element resets an identity: the new device is signed, and people who verified the
bot are told its identity changed, as it did. An account whose cross-signing keys another
client made (the owner set them up in Element; the store notes which master key this home
made) is left as it is: its device can be verified from there. Who wrote a message stays the
user id the homeserver vouches for; this only lets people's clients see the bot's device as
its account's own.

The keys are two ed25519 key pairs, held as vodozemac accounts used only for signing (the Olm
library matrix-nio already brings; its pickles stay in the folder, readable by this user only).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
from nio import AsyncClient
from vodozemac import Account, PickleException

from nanobot.channel_plugin import ChannelStore
from nanobot.config import write_private

log = logging.getLogger(__name__)

PICKLE_KEY = bytes(32)  # the folder's permissions protect the keys, as they protect the device's own
KEPT = "cross_signing.json"


def canonical(signed: dict[str, Any]) -> bytes:
    """Matrix's canonical JSON of an object, without what a signature never covers."""
    whole = {k: v for k, v in signed.items() if k not in ("signatures", "unsigned")}
    return json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class CrossSigning:
    """Signs the device once a run, once its keys are up (``after_upload``)."""

    def __init__(self, keys: Path | None, password: str, store: ChannelStore) -> None:
        self.kept = keys / KEPT if keys else None  # None: no encryption, nothing to sign
        self.password = password
        self.store = store  # which master key this home made (it outlives a lost keys folder)
        self.done = False

    async def after_upload(self, client: AsyncClient) -> None:
        if self.done or self.kept is None or client.olm is None or not client.olm.account.shared:
            return
        self.done = True  # once a run: a failure is said, and the next start tries again
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                         headers={"Authorization": f"Bearer {client.access_token}"}) as http:
            try:
                await self._sign(_Api(http, client.homeserver), client.user_id, client.device_id)
            except (aiohttp.ClientError, OSError, TimeoutError, KeyError, TypeError, ValueError) as exc:
                log.warning("matrix: the device %s is not cross-signed (%s: %s); Element marks its messages as "
                            "from an unverified device", client.device_id, type(exc).__name__, exc)

    async def _sign(self, api: _Api, user_id: str, device_id: str) -> None:
        found = await api.post("keys/query", {"device_keys": {user_id: [device_id]}})
        master, device = found.get("master_keys", {}).get(user_id), found["device_keys"][user_id][device_id]
        keys, made_here = self._load(), f"matrix cross-signing {user_id}"
        lost = keys is None and master is not None and _key_of(master) == await self.store.position(made_here)
        if master is None or (lost and self.password):  # none yet, or ours lost: made, kept, then uploaded
            keys = (Account(), Account())
            self._keep(keys)
            await api.upload_keys(_public(keys, user_id), user_id, self.password)
            await self.store.keep_position(made_here, keys[0].ed25519_key.to_base64())
            log.info("matrix: cross-signing keys made for %s", user_id)
        elif keys is None or _key_of(master) != keys[0].ed25519_key.to_base64():
            log.warning("matrix: %s's cross-signing keys are another client's: verify the device %s from there "
                        "(until then Element marks the bot's messages as from an unverified device)",
                        user_id, device_id)
            return
        signer = keys[1].ed25519_key.to_base64()
        if f"ed25519:{signer}" in device.get("signatures", {}).get(user_id, {}):
            return
        signature = {user_id: {f"ed25519:{signer}": keys[1].sign(canonical(device)).to_base64()}}
        signed = {**json.loads(canonical(device)), "signatures": signature}
        answer = await api.post("keys/signatures/upload", {user_id: {device_id: signed}})
        if answer.get("failures"):
            raise ValueError(f"the signature was refused: {answer['failures']}")

    def _load(self) -> tuple[Account, Account] | None:
        assert self.kept is not None
        try:
            kept = json.loads(self.kept.read_text())
            return tuple(Account.from_pickle(kept[name], PICKLE_KEY) for name in ("master", "self_signing"))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, PickleException) as exc:
            raise ValueError(f"{self.kept} does not hold cross-signing keys ({exc})") from None

    def _keep(self, keys: tuple[Account, Account]) -> None:
        assert self.kept is not None
        pickles = (key.pickle(PICKLE_KEY) for key in keys)
        write_private(self.kept, json.dumps(dict(zip(("master", "self_signing"), pickles))))


def _public(keys: tuple[Account, Account], user_id: str) -> dict[str, Any]:
    """The master key and the self-signing key (signed by the master key), as the server takes them."""
    master, signing = (key.ed25519_key.to_base64() for key in keys)
    master_key = {"user_id": user_id, "usage": ["master"], "keys": {f"ed25519:{master}": master}}
    self_signing = {"user_id": user_id, "usage": ["self_signing"], "keys": {f"ed25519:{signing}": signing}}
    self_signing["signatures"] = {user_id: {f"ed25519:{master}": keys[0].sign(canonical(self_signing)).to_base64()}}
    return {"master_key": master_key, "self_signing_key": self_signing}


def _key_of(cross_signing_key: dict[str, Any]) -> str:
    return next(iter(cross_signing_key["keys"].values()))


class _Api:
    def __init__(self, http: aiohttp.ClientSession, homeserver: str) -> None:
        self.http, self.base = http, f"{homeserver}/_matrix/client/v3"

    async def post(self, path: str, body: dict[str, Any], *, may_ask: bool = False) -> dict[str, Any]:
        async with self.http.post(f"{self.base}/{path}", json=body) as answer:
            said = await answer.json()
            if answer.status == 401 and may_ask and "session" in said:
                return said
            if answer.status != 200:
                raise ValueError(f"{path}: HTTP {answer.status} {said.get('errcode', '')} {said.get('error', '')}")
            return said

    async def upload_keys(self, keys: dict[str, Any], user_id: str, password: str) -> None:
        """Uploaded, with the password if the server asks for it (user-interactive auth)."""
        asked = await self.post("keys/device_signing/upload", keys, may_ask=bool(password))
        if "session" in asked:
            auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user_id},
                    "password": password, "session": asked["session"]}
            await self.post("keys/device_signing/upload", {**keys, "auth": auth})
