"""Telegram long polling: one replica at a time polls (a leader lease across replicas), each
update is handed to the channel and confirmed (the next offset) only after it was stored,
conflicts and flood control back off, a malformed update is skipped (and confirmed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiogram import Bot
from aiogram.exceptions import (
    TelegramConflictError,
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.types import Update

from .base import RuntimeLike
from .telegram_early import ALLOWED_UPDATES, FirstPoll
from .telegram_updates import Malformed, RawGetUpdates, read_update, update_id

__all__ = ["ALLOWED_UPDATES", "Poller"]

log = logging.getLogger("channels.telegram")


class Poller:
    """Polls the Bot API for one channel until `stopping` is set."""

    def __init__(
        self,
        bot: Bot,
        runtime: RuntimeLike,
        bot_id: int,
        stopping: asyncio.Event,
        handle: Callable[[Update], Awaitable[None]],
        malformed: Callable[[Malformed, str], None],
        scrub: Callable[[Any], str],
        poll_timeout: int,
        retry_base: float,
        first: FirstPoll | None = None,
    ) -> None:
        self.bot = bot
        self.first = first
        """The poll `serve` sent before the channel loaded (telegram_early.py): the first."""
        self.runtime = runtime
        self.bot_id = bot_id
        self.stopping = stopping
        self.handle = handle
        self.malformed = malformed
        self.scrub = scrub
        self.poll_timeout = poll_timeout
        self.retry_base = retry_base
        self.offset: int | None = None
        """The next update id to ask for: everything before it is stored (or skipped)."""

    async def _wait(self, seconds: float) -> bool:
        """Sleep unless stopping; True when stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    async def run(self) -> None:
        """Poll until stopped, on one replica at a time: with several replicas on one
        database the poller holds a job lease (`telegram:poller:<bot id>`); the others stand
        by and one takes over when the leader stops or dies. A single process always leads.
        The offset is confirmed before the lead is handed over, so the next leader starts
        after it."""
        assert self.runtime is not None
        leader = getattr(self.runtime, "leader", None)
        if leader is None:  # a stand-in runtime without leases (benchmarks): poll alone
            await self._poll_loop()
            await self._confirm_offset()
            return
        lead = leader(f"telegram:poller:{self.bot_id}")
        while not self.stopping.is_set():
            entering = asyncio.ensure_future(lead.__aenter__())
            if not await self._unless_stopping(entering):
                return
            try:
                await self._poll_loop(lead.lost)
                if not lead.lost.is_set():
                    await self._confirm_offset()
            finally:
                await lead.__aexit__(None, None, None)
            if lead.lost.is_set() and not self.stopping.is_set():
                log.warning("telegram.poll another replica took over polling; standing by")

    async def _unless_stopping(
        self, task: asyncio.Future[Any], lost: asyncio.Event | None = None
    ) -> bool:
        """Wait for `task`; if `stop()` (or `lost`) comes first, cancel it and return False."""
        waits = {asyncio.ensure_future(self.stopping.wait())}
        if lost is not None:
            waits.add(asyncio.ensure_future(lost.wait()))
        try:
            await asyncio.wait({task, *waits}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return False

    async def _get_updates(self, lost: asyncio.Event | None = None) -> list[Any] | None:
        """One long poll (the updates as JSON values); None when `stop()` interrupted it or
        the polling lead was `lost`."""
        assert self.bot is not None
        first, self.first = self.first, None
        if first is not None:
            try:
                if not await self._unless_stopping(first.updates, lost):
                    return None
                found = first.updates.result()
            finally:
                await first.close()
            if found is not None:
                return found
        method = RawGetUpdates(
            offset=self.offset, timeout=self.poll_timeout, allowed_updates=ALLOWED_UPDATES
        )
        poll = asyncio.ensure_future(self.bot(method, request_timeout=self.poll_timeout + 15))
        if not await self._unless_stopping(poll, lost):
            return None
        return poll.result()

    async def _poll_loop(self, lost: asyncio.Event | None = None) -> None:
        """Poll until `stop()` or until the polling lead is `lost`."""
        failures = 0
        while not self.stopping.is_set() and not (lost is not None and lost.is_set()):
            delay = min(self.retry_base * 2**failures, 30.0)
            try:
                updates = await self._get_updates(lost)
            except TelegramConflictError as exc:
                failures += 1
                log.warning(
                    "telegram.poll conflict (another instance polling, or a webhook is set);"
                    " retrying in %.1fs: %s",
                    delay,
                    exc.message,
                )
                await self._wait(delay)
                continue
            except TelegramRetryAfter as exc:
                log.warning("telegram.poll flood control: waiting %ss", exc.retry_after)
                await self._wait(exc.retry_after)
                continue
            except TelegramUnauthorizedError:
                failures += 1
                log.error("telegram.poll the Bot API rejects BUB_TELEGRAM_TOKEN (401); retrying")
                await self._wait(max(delay, 30.0))
                continue
            except Exception as exc:
                failures += 1
                log.warning("telegram.poll failed; retrying in %.1fs: %s", delay, self.scrub(exc))
                await self._wait(delay)
                continue
            if updates is None:
                return
            failures = 0
            for raw in updates:
                uid = update_id(raw)
                if uid is not None and self.offset is not None and uid < self.offset:
                    continue
                try:
                    update = read_update(raw, self.bot)
                except Malformed as exc:
                    self.malformed(exc, "polling")
                    if uid is not None:
                        self.offset = uid + 1  # confirmed: Telegram need not send it again
                    continue
                while True:
                    try:
                        await self.handle(update)
                        break
                    except Exception as exc:
                        # Not stored: do not confirm it; try again (the store may recover).
                        failures += 1
                        delay = min(self.retry_base * 2**failures, 30.0)
                        log.error(
                            "telegram.receive failed update=%d; retrying in %.1fs: %s",
                            update.update_id,
                            delay,
                            self.scrub(exc),
                        )
                        if await self._wait(delay):
                            return
                failures = 0
                self.offset = update.update_id + 1

    async def _confirm_offset(self) -> None:
        """Tell Telegram about the updates handled since the last poll (saves re-deliveries)."""
        if self.offset is None or self.bot is None:
            return
        with contextlib.suppress(Exception):
            await self.bot.get_updates(
                offset=self.offset, limit=1, timeout=0, allowed_updates=ALLOWED_UPDATES,
                request_timeout=5,
            )  # fmt: skip
