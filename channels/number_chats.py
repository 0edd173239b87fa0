"""Private chats named by a phone number (Signal, WhatsApp), held to an account.

A carrier gives a number up to a stranger, who registers it as a new account (a new Signal
UUID, a new WhatsApp business-scoped id). So a number's chat is the first account admitted with
the number, and what goes there is sent to that account, not to the number: the chat's history,
the owner's notices and a cron job's output never pass with the number. Whoever holds the number
later talks in a chat of their own account's. Kept with the channel's positions: every worker
and a restart know it.
"""

from __future__ import annotations

from nanobot.bus import Identity
from nanobot.channel_plugin import ChannelStore


class NumberChats:
    def __init__(self, channel: str, store: ChannelStore) -> None:
        self.channel, self.store = channel, store
        self._accounts: dict[str, str] = {}  # a number -> the account first admitted with it

    async def chat_of(self, who: Identity, vouched: Identity) -> str:
        """``who``'s private chat: their number's, unless the number is another account's (the
        config's holder, ``vouched``, or the first admitted with it); then their account's."""
        if not who.handle or vouched.id == who.id and await self.account_of(who.id) in (who.id, who.handle):
            return who.id
        return who.handle

    async def admitted(self, who: Identity, vouched: Identity) -> None:
        """``who`` was let in (anywhere): their number's chat is their account's, if no account had
        it and the config holds the number to nobody else (``vouched``)."""
        if who.handle and vouched.id == who.id and await self.account_of(who.id) == who.id:
            await self.store.keep_position(self._key(who.id), who.handle)
            self._accounts[who.id] = who.handle

    async def account_of(self, chat_id: str) -> str:
        """Whom a message to ``chat_id`` goes to: the account first admitted with that number, else itself."""
        if chat_id not in self._accounts and (account := await self.store.position(self._key(chat_id))):
            self._accounts[chat_id] = account  # for good; none yet is asked again (another worker may admit them)
        return self._accounts.get(chat_id, chat_id)

    def _key(self, number: str) -> str:
        return f"{self.channel} account of {number}"  # in the store's positions: kept until it changes
