"""Telegram streaming: a reply shown while the model writes it (the `ReplyStream` contract).

Private chats: the piece being written is a draft (`sendMessageDraft`, one draft id per reply,
updated as the text grows); the final answer is then sent with `sendMessage`, as without
streaming. Groups and forum topics (drafts are for private chats), and a Bot API without
drafts: the first piece is posted as a message once the text is `FIRST_DELAY` seconds old (an
answer that is complete by then is simply sent, as without streaming), then edited in place
(`editMessageText`); the final edit carries the formatted piece. An answer longer than one message continues in new
messages (in a private chat the pieces before the one being written are messages too).

Every request goes through the outbox's pacer, in the chat's turn, like `sendMessage`, but as
a *partial* one (channels/pacing.py): it takes only budget no answer needs, so under a backlog
of answers a draft waits while the text grows (fewer, larger steps) and the answers go at the
full rate; `final_ready()` (the runtime calls it when the answer is complete) drops a partial
update that has not gone out yet, so the answer never waits behind it. The runtime's interval
(1 s in private chats, 3 s in groups: Telegram counts edits against a group's 20 messages a
minute) is on top of it. Text is cut by the same splitter as the final
answer, so every partial render is valid HTML (no cut inside a tag, an entity or a UTF-16
pair, a code block left open is closed). "message is not modified" is success; HTML Telegram
cannot parse goes as its Markdown; a 429 skips a partial update (the next one brings newer
text) and is waited out for the final edit; an edit may be repeated (it is idempotent), a
post whose fate is unknown is never repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from aiogram.exceptions import (
    AiogramError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramMigrateToChat,
    TelegramNetworkError,
    TelegramNotFound,
    TelegramRetryAfter,
    TelegramServerError,
)

from .base import DeliveryError, DeliveryUnknown
from .pacing import Dropped
from .telegram_format import escape
from .telegram_outbox import GENERAL_TOPIC, MAX_RETRY_AFTER, TelegramOutbox

try:
    from aiogram.methods import SendMessageDraft
except ImportError:  # aiogram < 3.26: the same request, declared here
    from aiogram.methods.base import TelegramMethod

    class SendMessageDraft(TelegramMethod[bool]):  # type: ignore[no-redef]
        __returning__ = bool
        __api_method__ = "sendMessageDraft"

        chat_id: int
        draft_id: int
        message_thread_id: int | None = None
        text: str | None = None
        parse_mode: str | None = None


log = logging.getLogger("channels.telegram")

PRIVATE_INTERVAL = 1.0
"""Seconds between updates in a private chat (Telegram: about one message a second)."""
GROUP_INTERVAL = 3.0
"""Seconds between edits in a group (Telegram: 20 messages a minute per group)."""
FIRST_DELAY = 0.8
"""A group's first partial message waits until the text is this many seconds old: a quick
answer is just sent (no message posted and then edited at once)."""
EDIT_ATTEMPTS = 4
GONE = ("message to edit not found", "message can't be edited", "message_id_invalid")

Edited = Literal["ok", "skipped", "gone"]


class Drafts:
    """Whether this bot can send drafts (a Bot API without them says so once)."""

    def __init__(self) -> None:
        self.ok = True

    def refuse(self, why: str) -> None:
        if self.ok:
            log.info("telegram.drafts_unavailable (edits instead): %s", why)
        self.ok = False


class TelegramStream:
    """One reply to `target` shown while it is written (see the module)."""

    def __init__(
        self,
        outbox: TelegramOutbox,
        target: dict[str, Any],
        shown: Sequence[str | None],
        *,
        route: Callable[[int], int],
        drafts: Drafts,
        scrub: Callable[[BaseException | str], str],
        retry_base: float = 1.0,
    ) -> None:
        self.outbox = outbox
        self.target = target
        self._route = route
        self._drafts = drafts
        self._scrub = scrub
        self.retry_base = retry_base
        chat_id = int(target["chat_id"])
        kind = target.get("chat_type")
        self.private = kind == "private" or (kind is None and chat_id > 0)
        thread = target.get("thread_id")
        self.thread = None if thread in (None, GENERAL_TOPIC) else int(thread)
        self.interval = PRIVATE_INTERVAL if self.private else GROUP_INTERVAL
        self.shown: list[str | None] = list(shown)
        self._html: list[str | None] = [None] * len(self.shown)
        """What each message shows now (None: unknown, e.g. taken over after a crash)."""
        self._draft_id = random.randint(1, 2**31 - 1)
        self._draft: str | None = None
        self._born: float | None = None
        self._lost = False
        """A post of ours may exist unseen (its outcome was unknown): post nothing more."""
        self._final = False
        """The answer is ready: partial updates are over."""

    @property
    def chat_id(self) -> int:
        return self._route(int(self.target["chat_id"]))

    # -- ReplyStream -------------------------------------------------------------------------
    def final_ready(self) -> None:
        """The answer is complete: a partial update still waiting for its turn is dropped (one
        in flight finishes), so the answer does not wait behind it."""
        self._final = True
        self.outbox.pacer.drop(self)

    async def update(self, text: str) -> bool:
        if self._lost or self._final:
            return True
        try:
            return await self._update(text)
        except Dropped:
            return False  # nothing went out; newer text comes (or the answer)

    async def _update(self, text: str) -> bool:
        if self._use_drafts():
            pieces = self.outbox.split(text)
            await self._fill(pieces[:-1])
            await self._trim(len(pieces) - 1)
            if not pieces or await self._send_draft(pieces[-1]):
                return True
            # Drafts turned out unavailable: show it as messages instead.
        if not any(self.shown):
            now = time.monotonic()
            self._born = self._born or now
            if now - self._born < FIRST_DELAY:
                return False
        pieces = self.outbox.split(text)
        await self._fill(pieces)
        await self._trim(len(pieces))
        return True

    async def status(self, text: str) -> None:
        if self._final:
            return
        with contextlib.suppress(Dropped):
            await self._status(text)

    async def _status(self, text: str) -> None:
        html = f"<i>{escape(text)}</i>"
        if self._use_drafts():
            await self._trim(0)
            if await self._send_draft(html):
                return
        if any(self.shown) and not self._lost:
            await self._fill([html])
            await self._trim(1)

    async def reset(self) -> None:
        if self._use_drafts() and self._draft and not self._final:
            with contextlib.suppress(Dropped):
                await self._send_draft("")  # "Thinking…" until the new text comes

    async def deliver(self, index: int, piece: str) -> list[str] | None:
        message = self.shown[index] if index < len(self.shown) else None
        if message is None:
            return None
        if self._html[index] == piece:
            return [message]  # it already shows exactly this piece
        outcome = await self._edit(index, piece, final=True)
        if outcome == "gone":
            self.shown[index] = None
            return None
        return [message]

    async def end(self, pieces: int) -> list[str]:
        removed = []
        for index in range(pieces, len(self.shown)):
            message = self.shown[index]
            if message is not None:
                await self._delete(message)
                removed.append(message)
                self.shown[index] = None
        return removed

    # -- drafts --------------------------------------------------------------------------------
    def _use_drafts(self) -> bool:
        return self.private and self._drafts.ok

    async def _send_draft(self, html: str) -> bool:
        """Show `html` as the draft; False when this bot cannot send drafts."""
        if html == self._draft:
            return True
        chat_id = self.chat_id
        text, mode = html, "HTML"
        for _ in range(2):
            try:
                await self.outbox.call(
                    chat_id,
                    lambda bot, text=text, mode=mode: bot(
                        SendMessageDraft(
                            chat_id=chat_id,
                            draft_id=self._draft_id,
                            text=text,
                            parse_mode=mode,
                            message_thread_id=self.thread,
                        )
                    ),
                    partial=self,
                )
                self._draft = html
                return True
            except TelegramRetryAfter:
                return True  # the pacer holds the chat; a later update brings newer text
            except TelegramNotFound as exc:
                self._drafts.refuse(self._scrub(exc))
                return False
            except TelegramBadRequest as exc:
                desc = exc.message.lower()
                if "can't parse entities" in desc and mode is not None:
                    text, mode = self.outbox.plain(html), None
                    continue
                if "not modified" in desc:
                    self._draft = html
                    return True
                if "draft" in desc or "private" in desc or "method" in desc:
                    self._drafts.refuse(self._scrub(exc))
                    return False
                raise DeliveryError(self._scrub(exc)) from None
            except (TelegramAPIError, AiogramError) as exc:
                raise DeliveryError(self._scrub(exc)) from None
        return True

    # -- messages ------------------------------------------------------------------------------
    async def _fill(self, pieces: list[str]) -> None:
        """Make messages 0..n-1 show `pieces` (posting the ones that do not exist yet)."""
        for index, html in enumerate(pieces):
            if index < len(self.shown) and self.shown[index] is not None:
                if self._html[index] != html:
                    await self._edit(index, html, final=False)
                continue
            if self._lost:
                return
            try:
                ids = await self.outbox.send(self.target, html, partial=self)
            except DeliveryUnknown:
                self._lost = True
                raise
            if not ids:
                return
            if index < len(self.shown):
                self.shown[index], self._html[index] = ids[0], html
            else:
                self.shown.append(ids[0])
                self._html.append(html)

    async def _trim(self, count: int) -> None:
        """A new step needs fewer messages than the last one showed: delete the rest."""
        for index in range(count, len(self.shown)):
            message = self.shown[index]
            if message is not None:
                await self._delete(message, partial=True)
        del self.shown[count:]
        del self._html[count:]

    async def _edit(self, index: int, html: str, *, final: bool) -> Edited:
        """Edit message `index` to show `html`. A partial update gives up on a 429 or a lost
        connection (the next one brings newer text); the final one waits and repeats."""
        message = self.shown[index]
        assert message is not None
        text, mode = html, "HTML"
        chat_id = self.chat_id
        for attempt in range(1, EDIT_ATTEMPTS + 1):
            try:
                await self.outbox.call(
                    chat_id,
                    lambda bot, text=text, mode=mode: bot.edit_message_text(
                        text=text, chat_id=chat_id, message_id=int(message), parse_mode=mode
                    ),
                    partial=None if final else self,
                )
                self._html[index] = html
                return "ok"
            except TelegramRetryAfter as exc:
                if not final:
                    return "skipped"
                if exc.retry_after > MAX_RETRY_AFTER:
                    raise DeliveryError(f"flood control: retry after {exc.retry_after}s") from None
            except TelegramBadRequest as exc:
                desc = exc.message.lower()
                if "message is not modified" in desc:
                    self._html[index] = html
                    return "ok"
                if "can't parse entities" in desc and mode is not None:
                    log.warning("telegram.edit HTML refused, sending plain text: %s", exc.message)
                    text, mode = self.outbox.plain(html), None
                    continue
                if any(g in desc for g in GONE):
                    return "gone"
                raise DeliveryError(self._scrub(exc)) from None
            except TelegramMigrateToChat:
                return "gone"  # the old group is read-only now; the answer goes to the new one
            except (TelegramNetworkError, TelegramServerError) as exc:
                if not final:
                    return "skipped"
                if attempt == EDIT_ATTEMPTS:
                    raise DeliveryUnknown(self._scrub(exc)) from None
                await asyncio.sleep(self.retry_base * attempt)  # an edit may be repeated
            except (TelegramAPIError, AiogramError) as exc:
                raise DeliveryError(self._scrub(exc)) from None
        if final:
            raise DeliveryError(f"edit gave up after {EDIT_ATTEMPTS} attempts")
        return "skipped"

    async def _delete(self, message: str, *, partial: bool = False) -> None:
        chat_id = self.chat_id
        with contextlib.suppress(TelegramAPIError, AiogramError, DeliveryError):
            await self.outbox.call(
                chat_id,
                lambda bot: bot.delete_message(chat_id=chat_id, message_id=int(message)),
                partial=self if partial else None,
            )
