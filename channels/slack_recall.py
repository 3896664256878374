"""Asking Slack whether a reply piece is in the thread already (`channels.base.Recalls`).

Every piece the bot posts carries a delivery key in its message `metadata`
(`event_type` `bub_bot_delivery`, `event_payload` `{"key": …}`). When the runtime resumes a
piece whose `reply.sent` was never recorded (its sender lost the database, or died, after
Slack took the post), it asks once: `conversations.replies` of the thread (or
`conversations.history` of a DM without threads) from the message answered on, with
`include_all_metadata`. Found: the piece is recorded as sent, not posted again.

`conversations.replies` and `conversations.history` are Tier 3 (about 50 calls a minute per
workspace for internal apps; Marketplace-less commercially distributed apps get 1 a minute,
see PLATFORM_NOTES): the lookups are paced to `RATE` for the whole bot, and a lookup that Slack
refuses or that fails counts as "could not be asked" (the piece is posted again: at least once,
as before). A lookup happens only on a resume after an outage or a crash, never on the way of
a plain answer. Only the bot's own messages count (its `bot_id`, or its bot user): anyone in
the thread could post a message carrying a key, and the piece would then never be posted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from .pacing import Pacer, Rate

log = logging.getLogger("channels.slack")

EVENT_TYPE = "bub_bot_delivery"
RATE = "50/min"
"""Lookups for the whole bot (Slack's Tier 3)."""
LOOKBACK = 100
"""Messages of the thread read from the answered message on (one page)."""


def metadata(key: str) -> dict[str, Any]:
    """The `metadata` of a posted piece: its delivery key."""
    return {"event_type": EVENT_TYPE, "event_payload": {"key": key}}


class SlackRecall:
    """Finds a posted piece by its delivery key, paced under the methods' limit."""

    def __init__(
        self, client: AsyncWebClient, me: Callable[[], tuple[str, str]], rate: str = RATE
    ) -> None:
        self.client = client
        self.me = me
        """The bot's (`bot_id`, bot user id), known once the channel started."""
        self.pacer = Pacer(overall=Rate.parse(rate), name="slack.recall")

    async def find(self, target: dict[str, Any], key: str) -> list[str] | None:
        """The ts of the message posted with `key` in the target's conversation; [] when it
        is not there; None when Slack could not be asked."""
        channel = target.get("channel")
        if target.get("ephemeral") or not channel:
            return None  # an ephemeral reply cannot be read back
        params: dict[str, Any] = {
            "channel": channel,
            "include_all_metadata": True,
            "limit": LOOKBACK,
        }
        if target.get("ts"):
            params["oldest"] = target["ts"]  # the piece came after the message it answers
        thread = target.get("thread_ts")
        try:
            async with self.pacer.turn(""):
                if thread:
                    answer = await self.client.conversations_replies(ts=thread, **params)
                else:
                    answer = await self.client.conversations_history(**params)
        except Exception as exc:
            log.warning("slack.recall_failed channel=%s: %s", channel, exc)
            return None
        bot_id, bot_user = self.me()
        for message in answer.get("messages") or []:
            by_us = (bot_id and message.get("bot_id") == bot_id) or (
                bot_user and message.get("user") == bot_user
            )
            if not by_us:
                continue  # a key in someone else's message proves nothing
            found = message.get("metadata") or {}
            payload = found.get("event_payload") or {}
            if found.get("event_type") == EVENT_TYPE and payload.get("key") == key:
                return [str(message.get("ts") or "")]
        return []
