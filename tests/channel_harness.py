"""What the platform channel tests (Slack, Telegram) share: reading back what a bot stored."""

from __future__ import annotations

from typing import Any

from bub_bot.server import Bot
from bub_bot.tape import Tape, TapeEntry
from tests.runtime_channel import inbound_users


class StoredTapes:
    """Mixin for a channel test harness with a started `bot`: its tapes, read back."""

    bot: Bot

    def tape(self, session_id: str) -> Tape:
        return Tape.for_session(self.bot.store, session_id, self.bot.settings.workspace)

    async def entries(self, session_id: str) -> list[TapeEntry]:
        return await self.tape(session_id).query()

    async def user_messages(self, session_id: str) -> list[Any]:
        """The content of each user message as it was received (no copies after an anchor)."""
        return [e.payload["content"] for e in await inbound_users(self.tape(session_id))]

    async def stored_nothing(self) -> bool:
        """No tape at all has an entry (archived ones included)."""
        return await self.bot.store.list_tapes(include_all=True) == []

    def inbound_count(self, channel: str, outcome: str) -> float:
        """`bub_inbound_messages_total{channel, outcome}` as GET /metrics shows it."""
        labels = {"channel": channel, "outcome": outcome}
        value = self.bot.metrics.registry.get_sample_value("bub_inbound_messages_total", labels)
        return value or 0.0
