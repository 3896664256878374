"""Telegram delivery: every message the bot posts or edits, within Telegram's send limits.

Telegram allows a bot about 30 messages a second overall, about one a second in one chat and
20 a minute in one group, and answers 429 `retry_after` past them. Every request that posts
or edits something (`sendMessage` now; `editMessageText` and `sendMessageDraft` of streaming
go through `call` the same way) takes its turn from one `Pacer`: the limits are
`BUB_TELEGRAM_RATE_GLOBAL`, `BUB_TELEGRAM_RATE_CHAT` and `BUB_TELEGRAM_RATE_GROUP` (chat ids
below zero are groups), chats take turns fairly, and a 429 that comes anyway pauses its chat
(or, when several chats get one at once, every send) for `retry_after` before the piece waits
for its turn again.

Answers come first: a piece of an answer is a *final* request, a streamed draft or edit a
*partial* one (`partial=<the stream>`), which the pacer lets go only from budget no answer
needs and drops when its answer is ready (channels/pacing.py). A partial that gets a 429 is
not queued again (`Dropped`: the next update brings newer text). `sendChatAction` (typing)
is not counted (it is not a message) but goes only when a partial request could
(`Pacer.spare`): while answers wait for the budget that beat is skipped. Its 429s only pause
the chats they name.

`call` takes a function of the Bot that builds the request when the turn comes, so a
streaming edit sends the newest text at that moment rather than a stale one.

Each piece: Telegram HTML first; if Telegram cannot parse it, its original Markdown as plain
text. A connection lost after the request may have reached Telegram is `DeliveryUnknown` and
is never re-sent (aiogram itself never retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, TypeVar

import aiohttp
from aiogram import Bot
from aiogram.exceptions import (
    AiogramError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramEntityTooLarge,
    TelegramMigrateToChat,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.types import ReplyParameters

from bub_bot.config import Settings

from .base import DeliveryError, DeliveryUnknown, request_leaving, request_refused
from .pacing import Dropped, Pacer, Rate
from .telegram_format import LIMIT, html_to_text, split_markdown

log = logging.getLogger("channels.telegram")

T = TypeVar("T")
GENERAL_TOPIC = 1
MAX_SEND_ATTEMPTS = 8
MAX_RETRY_AFTER = 300
SOURCES_KEPT = 512
SPARE_RETRY = 1.0
"""Seconds before typing is tried again when a beat found no spare budget."""


def telegram_pacer(settings: Settings) -> Pacer:
    """The pacer for Telegram's limits as configured."""
    return Pacer(
        overall=Rate.parse(settings.telegram_rate_global),
        per_key=Rate.parse(settings.telegram_rate_chat),
        per_group=Rate.parse(settings.telegram_rate_group),
        name="telegram",
    )


class TelegramOutbox:
    """Splits, paces and sends the Telegram channel's messages.

    `api` lends the channel's Bot for one request; `scrub` removes the token from an error;
    `route` maps a chat id to where the chat lives now and `moved(old, new)` records that a
    group became a supergroup. `retry_base` and `typing_interval` are seconds.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        api: Callable[[], contextlib.AbstractAsyncContextManager[Bot]],
        scrub: Callable[[BaseException | str], str],
        route: Callable[[int], int],
        moved: Callable[[int, int], None],
        retry_base: float = 1.0,
        typing_interval: float = 4.0,
    ) -> None:
        self.pacer = telegram_pacer(settings)
        self.retry_base = retry_base
        self.typing_interval = typing_interval
        self._api = api
        self._scrub = scrub
        self._route = route
        self._moved = moved
        self._sources: OrderedDict[str, str] = OrderedDict()

    # -- pieces --------------------------------------------------------------------------------
    def split(self, text: str) -> list[str]:
        """The model's Markdown as Telegram HTML pieces of at most 4096 UTF-16 units."""
        pieces = split_markdown(text, LIMIT)
        for piece in pieces:
            self._sources[piece.html] = piece.markdown
            self._sources.move_to_end(piece.html)
        while len(self._sources) > SOURCES_KEPT:
            self._sources.popitem(last=False)
        return [p.html for p in pieces]

    def plain(self, piece: str) -> str:
        """The Markdown a piece came from (sent as plain text when Telegram rejects the HTML)."""
        return self._sources.get(piece) or html_to_text(piece)

    # -- paced requests ------------------------------------------------------------------------
    async def call(
        self,
        chat_id: int,
        request: Callable[[Bot], Awaitable[T]],
        *,
        partial: Hashable | None = None,
    ) -> T:
        """Run one request that posts or edits something in `chat_id`, in the chat's turn;
        `partial`: a streamed update of this owner (see the module; `Dropped` when it is
        taken out of the queue).

        A 429 pauses the chat (or everything) before `TelegramRetryAfter` reaches the caller,
        so whatever the caller sends next waits for `retry_after`; while that is longer than
        `MAX_RETRY_AFTER` a request fails at once instead of queueing for it."""
        if (paused := self.pacer.paused_for(chat_id)) > MAX_RETRY_AFTER:
            raise DeliveryError(f"flood control: Telegram asked to wait {paused:.0f} s more")
        async with self.pacer.turn(chat_id, group=chat_id < 0, partial=partial):
            request_leaving()  # from here Telegram may have it (channels.base.watch_send)
            try:
                async with self._api() as bot:
                    return await request(bot)
            except TelegramRetryAfter as exc:
                request_refused()
                self.pacer.flood(chat_id, exc.retry_after)
                raise
            except (TelegramNetworkError, TelegramServerError) as exc:
                if isinstance(exc.__cause__, aiohttp.ClientConnectorError):
                    request_refused()  # never connected: Telegram cannot have it
                raise
            except TelegramAPIError:
                request_refused()  # Telegram answered: it posted nothing
                raise

    async def send(
        self, target: dict[str, Any], piece: str, *, partial: Hashable | None = None
    ) -> list[str]:
        """Post one piece as a reply to `target`; returns its message id (see the module).
        `partial`: a stream posts its partial text (`Dropped` instead of waiting a 429 out)."""
        chat_id = self._route(int(target["chat_id"]))
        thread = target.get("thread_id")
        thread = None if thread in (None, GENERAL_TOPIC) else int(thread)
        reply_to = target.get("message_id")
        text, mode = piece, "HTML"
        for attempt in range(1, MAX_SEND_ATTEMPTS + 1):
            kwargs: dict[str, Any] = {"parse_mode": mode}
            if reply_to:
                kwargs["reply_parameters"] = ReplyParameters(
                    message_id=int(reply_to), allow_sending_without_reply=True
                )
            if thread:
                kwargs["message_thread_id"] = thread
            try:
                sent = await self.call(
                    chat_id,
                    lambda bot, chat=chat_id, text=text, kw=kwargs: bot.send_message(
                        chat, text, **kw
                    ),
                    partial=partial,
                )
                return [str(sent.message_id)]
            except TelegramRetryAfter as exc:
                if partial is not None:
                    raise Dropped from None  # not posted; the next update brings newer text
                if exc.retry_after > MAX_RETRY_AFTER:
                    raise DeliveryError(f"flood control: retry after {exc.retry_after}s") from None
                # The pacer holds this chat back for retry_after; the piece queues again.
                log.warning(
                    "telegram.send flood control chat=%d: waiting %ss", chat_id, exc.retry_after
                )
            except TelegramMigrateToChat as exc:
                self._moved(chat_id, exc.migrate_to_chat_id)
                chat_id = exc.migrate_to_chat_id
            except TelegramBadRequest as exc:
                desc = exc.message.lower()
                if "can't parse entities" in desc and mode is not None:
                    log.warning("telegram.send HTML refused, sending plain text: %s", exc.message)
                    text, mode = self.plain(piece), None
                elif "message is not modified" in desc:
                    return []
                elif "thread not found" in desc and thread:
                    thread = None  # the topic is gone: post in the chat instead
                elif "replied not found" in desc or "to be replied not found" in desc:
                    reply_to = None
                else:
                    raise DeliveryError(self._scrub(exc)) from None
            except TelegramEntityTooLarge as exc:
                raise DeliveryError(self._scrub(exc)) from None
            except TelegramNetworkError as exc:
                if isinstance(exc.__cause__, aiohttp.ClientConnectorError) and attempt < 4:
                    # The connection was never made, so Telegram cannot have the message.
                    await asyncio.sleep(self.retry_base * attempt)
                    continue
                raise DeliveryUnknown(self._scrub(exc)) from None
            except TelegramServerError as exc:
                raise DeliveryUnknown(self._scrub(exc)) from None
            except (TelegramAPIError, AiogramError) as exc:
                raise DeliveryError(self._scrub(exc)) from None
        raise DeliveryError(f"gave up after {MAX_SEND_ATTEMPTS} attempts")

    # -- typing --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def working(self, target: dict[str, Any]) -> AsyncIterator[None]:
        """ "typing…" in the target's chat (and topic) until the block exits."""
        task = asyncio.create_task(self._typing(target), name="telegram-typing")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _typing(self, target: dict[str, Any]) -> None:
        thread = target.get("thread_id")
        warned = False
        while True:
            wait = self.typing_interval
            try:
                chat_id = self._route(int(target["chat_id"]))
                if self.pacer.spare():
                    async with self._api() as bot:
                        await bot.send_chat_action(
                            chat_id, "typing", message_thread_id=int(thread) if thread else None
                        )
                else:
                    wait = min(wait, SPARE_RETRY)  # answers use the budget: try again soon
            except asyncio.CancelledError:
                raise
            except TelegramRetryAfter as exc:
                wait = max(wait, float(exc.retry_after))
                self.pacer.pause(chat_id, exc.retry_after)
            except Exception as exc:
                if not warned:
                    log.warning("telegram.typing failed: %s", self._scrub(exc))
                    warned = True
            await asyncio.sleep(wait)
