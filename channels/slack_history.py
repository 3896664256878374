"""A Slack thread's earlier messages, read once when the bot is first mentioned in it
(`conversations.replies`, paged, the newest `cap` before the mention).

Slack allows non-Marketplace apps about one `conversations.replies` call a minute: the
reading is bounded in time and gives up (the mention goes on without history) rather than
hold up the acknowledgement, and it happens only for a thread with no tape yet."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slack_sdk.errors import SlackApiError

from .base import HistoryMessage, RuntimeLike

log = logging.getLogger("channels.slack")

TIME_BUDGET = 2.0
"""Seconds the whole read may take: Slack wants the event acknowledged within 3."""
MAX_TEXT = 4000
"""Characters kept of one earlier message."""


async def first_mention_history(
    client: Any,
    runtime: RuntimeLike,
    session_id: str,
    channel: str,
    thread_ts: str,
    before_ts: str,
    cap: int,
    bot_ids: tuple[str, str],
) -> list[HistoryMessage]:
    """The thread's history for a mention in it when the bot has no tape for the thread yet
    (read once, so the answer knows what was said; never again: the tape is the history
    from then on); [] otherwise or with `cap` 0."""
    if cap <= 0 or await runtime.session_known(session_id):
        return []
    return await thread_history(client, channel, thread_ts, before_ts, cap, bot_ids)


async def thread_history(
    client: Any,
    channel: str,
    thread_ts: str,
    before_ts: str,
    cap: int,
    bot_ids: tuple[str, str],
) -> list[HistoryMessage]:
    """The thread's messages before `before_ts`, oldest first, at most `cap` (the newest);
    [] when Slack refuses, rate-limits or is slow."""
    try:
        raw = await asyncio.wait_for(_read(client, channel, thread_ts, before_ts, cap), TIME_BUDGET)
    except (SlackApiError, TimeoutError, OSError) as exc:
        log.warning(
            "slack.thread_history skipped channel=%s thread=%s: %s",
            channel,
            thread_ts,
            type(exc).__name__,
        )
        return []
    found = []
    for m in raw[-cap:]:
        text = str(m.get("text") or "")
        if not text:
            continue
        user = str(m.get("user") or m.get("bot_id") or "someone")
        own = user in bot_ids or m.get("bot_id") in bot_ids
        role = "assistant" if own else "user"
        found.append(HistoryMessage(role=role, author=user, text=text[:MAX_TEXT]))
    return found


async def _read(
    client: Any, channel: str, thread_ts: str, before_ts: str, cap: int
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        kwargs: dict[str, Any] = {"channel": channel, "ts": thread_ts, "limit": min(200, cap + 1)}
        if cursor:
            kwargs["cursor"] = cursor
        page = await client.conversations_replies(**kwargs)
        for m in page.get("messages") or []:
            if isinstance(m, dict) and float(m.get("ts") or 0) < float(before_ts):
                messages.append(m)
        cursor = ((page.get("response_metadata") or {}).get("next_cursor")) or None
        if not cursor:
            return messages
