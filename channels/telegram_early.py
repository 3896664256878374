"""The first Telegram long poll, sent as soon as `serve` starts: the bot listens while the rest
of it loads.

Importing aiogram takes seconds (its types build hundreds of pydantic models), and the first
`getUpdates` needs none of it: `getMe` (the token works; the bot's id), `deleteWebhook` (a
webhook left over would make polling fail) and the poll itself are three plain HTTP
requests. `FirstPoll.begin` sends them with aiohttp before the channel is imported; the
channel's poller takes the pending poll as its first one (`telegram_polling.Poller`) and
reads its updates as it reads any (`RawGetUpdates`: plain JSON, one update at a time), so
nothing is confirmed before it is stored. Any failure here only means the channel starts as
it always did: it checks the token itself and reports what is wrong.

Only for a single process (SQLite): with several replicas the poll waits for the polling
lease, which needs the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("channels.telegram")

ALLOWED_UPDATES = ["message", "callback_query"]
"""The updates the bot asks for (polling and webhook alike)."""
POLL_TIMEOUT = 30
"""Seconds a long poll waits for updates (the early poll and the channel's alike)."""


@dataclass
class FirstPoll:
    """A bot whose token worked, and its first long poll (pending or answered)."""

    bot_id: int
    username: str
    updates: asyncio.Task[list[Any] | None]
    """The first poll's updates as JSON values; None when it failed (poll again)."""
    session: aiohttp.ClientSession

    @classmethod
    async def begin(
        cls, token: str, api_base: str | None, poll_timeout: int = POLL_TIMEOUT
    ) -> FirstPoll | None:
        """getMe, deleteWebhook, then the first getUpdates (not awaited); None when any
        step fails (the channel's own start then says why)."""
        base = (api_base or "https://api.telegram.org").rstrip("/")
        url = f"{base}/bot{token}/"
        sent = asyncio.Event()
        trace = aiohttp.TraceConfig()

        async def chunk_sent(*_: Any) -> None:
            sent.set()

        trace.on_request_chunk_sent.append(chunk_sent)
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=poll_timeout + 15), trace_configs=[trace]
        )
        try:
            me = await _call(session, url, "getMe", {}, 10)
            await _call(session, url, "deleteWebhook", {"drop_pending_updates": "false"}, 10)
        except Exception as exc:  # the channel's start reports it (without the token)
            log.info("telegram.early_poll skipped: %s", type(exc).__name__)
            await session.close()
            return None
        params = {"timeout": str(poll_timeout), "allowed_updates": json.dumps(ALLOWED_UPDATES)}
        sent.clear()
        poll = asyncio.ensure_future(_poll(session, url, params, poll_timeout + 15))
        # The request must be out before whatever runs next (imports) holds the event loop.
        out = asyncio.ensure_future(sent.wait())
        await asyncio.wait({out, poll}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        out.cancel()
        log.info("telegram.early_poll bot_id=%s", me.get("id"))
        return cls(int(me["id"]), str(me.get("username") or ""), poll, session)

    async def close(self) -> None:
        """Stop the poll if it still runs and close its HTTP session."""
        if not self.updates.done():
            self.updates.cancel()
            with contextlib.suppress(BaseException):
                await self.updates
        await self.session.close()


async def _call(
    session: aiohttp.ClientSession, url: str, method: str, params: dict[str, str], timeout: float
) -> Any:
    async with session.post(
        url + method, data=params, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as resp:
        body = await resp.json(content_type=None)
    if not isinstance(body, dict) or not body.get("ok"):
        raise RuntimeError(f"{method}: HTTP {resp.status}")
    return body.get("result")


async def _poll(
    session: aiohttp.ClientSession, url: str, params: dict[str, str], timeout: float
) -> list[Any] | None:
    try:
        result = await _call(session, url, "getUpdates", params, timeout)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.info("telegram.early_poll failed (polling again): %s", type(exc).__name__)
        return None
    return result if isinstance(result, list) else None
