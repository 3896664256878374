"""Telegram (aiogram 3): long polling or a webhook, groups and forum topics, safe delivery.

Inbound: an update becomes an `Inbound` and is handed to `runtime.receive`; only after that
returned is Telegram acknowledged (the next `getUpdates` offset, or the webhook's 200). The
polling loop is our own rather than aiogram's Dispatcher, because the Dispatcher confirms an
offset before its handlers finish. Re-deliveries are recognised by `<chat_id>:<message_id>`
(update ids restart after long gaps and webhook switches; message ids never repeat in a chat).
Every update, polled or posted, is first checked in `telegram_updates`; a malformed one is
acknowledged, counted as "malformed" and dropped, and never holds up the updates after it.

Outbound (`telegram_outbox`): the model's Markdown becomes Telegram HTML, cut at 4096 UTF-16
units, and every message is paced within Telegram's send limits, fairly across chats. A piece
Telegram cannot parse is re-sent as its original Markdown; a 429 pauses the chat and re-sends
only that piece; a connection lost after the request may have reached Telegram is reported as
`DeliveryUnknown` and never re-sent blindly (aiogram itself never retries). Streaming
(`telegram_stream`): a draft in private chats, a message edited in place in groups, paced the
same way.

The token is part of every Bot API URL, so nothing here logs URLs or raw aiohttp errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlparse

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    AiogramError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramUnauthorizedError,
)
from aiogram.types import BotCommand, Update
from aiohttp import web

from bub_bot import commands
from bub_bot.config import ConfigError, Settings

from .base import DeliveryError, RuntimeLike
from .telegram_approvals import TelegramApprovals
from .telegram_content import MessageReader
from .telegram_early import POLL_TIMEOUT, FirstPoll
from .telegram_files import TelegramFiles
from .telegram_inbound import TelegramInbound
from .telegram_outbox import TelegramOutbox
from .telegram_polling import ALLOWED_UPDATES, Poller
from .telegram_stream import Drafts, TelegramStream
from .telegram_updates import Malformed, parse_body, read_update

log = logging.getLogger("channels.telegram")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")


class TelegramChannel:
    """The Telegram channel. `poll_timeout`, `retry_base` and `typing_interval` are seconds."""

    name = "telegram"

    def __init__(
        self,
        settings: Settings,
        *,
        poll_timeout: int = POLL_TIMEOUT,
        retry_base: float = 1.0,
        typing_interval: float = 4.0,
        first_poll: FirstPoll | None = None,
    ) -> None:
        if not settings.telegram_token:
            raise ConfigError("BUB_TELEGRAM_TOKEN is not set")
        self.settings = settings
        self.poll_timeout = poll_timeout
        self.retry_base = retry_base
        self.typing_interval = typing_interval
        self.webhook_url = settings.telegram_webhook_url or None
        self.webhook_path = (urlparse(self.webhook_url).path or "/") if self.webhook_url else None
        if self.webhook_url and not _SECRET_RE.fullmatch(settings.telegram_webhook_secret or ""):
            raise ConfigError(
                "BUB_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Za-z0-9_- in webhook mode"
            )
        self.first_poll = first_poll
        """The first long poll, sent by `serve` before this module loaded (telegram_early)."""
        self._token = settings.telegram_token
        self._bot: Bot | None = None
        self._runtime: RuntimeLike | None = None
        self._poller: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._stopped = False
        self._inflight = 0
        self._closing: asyncio.Future[None] | None = None
        self._migrated: dict[int, int] = {}
        self.reader = MessageReader(settings.telegram_max_image_bytes, self._api, self._scrub)
        self._background: set[asyncio.Task[None]] = set()
        """Moves learned while sending (kept referenced until they finish)."""
        self._outbox = TelegramOutbox(
            settings,
            api=self._api,
            scrub=self._scrub,
            route=self._route,
            moved=self._moved,
            retry_base=retry_base,
            typing_interval=typing_interval,
        )
        self.messages = TelegramInbound(
            self.name, settings, self.reader, self._outbox, self._migrated, self._scrub
        )
        """Messages -> `Inbound`: what is for us, who may talk (channels/telegram_inbound.py)."""
        self._drafts = Drafts()
        self._approvals = TelegramApprovals(self._outbox, self._route, self._api, self.name)
        """Approval requests with an inline keyboard (channels/telegram_approvals.py)."""
        self.files = TelegramFiles(self._api, self._outbox, self._scrub)
        """Files of messages (fetched in the turn) and files the bot sends."""

    @property
    def username(self) -> str:
        """The bot's username (known once started)."""
        return self.messages.username

    @property
    def bot_id(self) -> int:
        """The bot's user id (known once started)."""
        return self.messages.bot_id

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self, runtime: RuntimeLike) -> None:
        self._runtime = runtime
        base = self.settings.telegram_api_base
        session = (
            AiohttpSession(api=TelegramAPIServer.from_base(base)) if base else AiohttpSession()
        )
        self._bot = Bot(self._token, session=session)
        where = base or "https://api.telegram.org"
        first, self.first_poll = self.first_poll, None
        if first is not None and not self.webhook_url:
            # The token worked and the webhook is gone already: polling is on its way.
            self.messages.username, self.messages.bot_id = first.username, first.bot_id
            self._start_polling(runtime, first)
            await self._register_commands()
            return
        if first is not None:
            await first.close()
        try:
            me = await self._bot.get_me()
        except TelegramUnauthorizedError:
            raise ConfigError(
                "BUB_TELEGRAM_TOKEN was rejected by the Bot API (401 Unauthorized)"
            ) from None
        except (TelegramAPIError, AiogramError) as exc:
            raise ConnectionError(
                f"cannot reach the Telegram Bot API at {where}: {self._scrub(exc)}"
            ) from None
        self.messages.username, self.messages.bot_id = me.username or "", me.id
        await self._register_commands()
        if self.webhook_url:
            try:
                await self._bot.set_webhook(
                    self.webhook_url,
                    secret_token=self.settings.telegram_webhook_secret,
                    allowed_updates=ALLOWED_UPDATES,
                    drop_pending_updates=False,
                )
            except TelegramBadRequest as exc:
                raise ConfigError(
                    f"BUB_TELEGRAM_WEBHOOK_URL: Telegram refused the webhook: {exc.message}"
                ) from None
            log.info(
                "telegram.started mode=webhook bot=@%s path=%s", self.username, self.webhook_path
            )
        else:
            # A webhook left over from webhook mode would make getUpdates fail; keep its backlog.
            await self._bot.delete_webhook(drop_pending_updates=False)
            self._start_polling(runtime)

    def _start_polling(self, runtime: RuntimeLike, first: FirstPoll | None = None) -> None:
        assert self._bot is not None
        poller = Poller(
            self._bot,
            runtime,
            self.bot_id,
            self._stopping,
            self._handle,
            self._malformed,
            self._scrub,
            self.poll_timeout,
            self.retry_base,
            first,
        )
        self._poller = asyncio.create_task(poller.run(), name="telegram-poll")
        log.info("telegram.started mode=polling bot=@%s", self.username)

    async def stop(self) -> None:
        """Stop receiving. Sends still work (the runtime may finish running turns); the HTTP
        session is closed whenever no request is in flight."""
        self._stopping.set()
        if self._poller is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._poller), 15)
            except TimeoutError:
                self._poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._poller
            except Exception:
                log.exception("telegram.poll loop failed")
            self._poller = None
        self._stopped = True
        if self._inflight == 0:
            await self._close_session()

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[Any]]]]:
        if self.webhook_path is None:
            return []
        return [("POST", self.webhook_path, self._webhook)]

    async def _register_commands(self) -> None:
        assert self._bot is not None
        menu = [
            BotCommand(command=name, description=_describe(usage))
            for name, usage in commands.USAGE.items()
        ]
        try:
            await self._bot.set_my_commands(menu)
        except (TelegramAPIError, AiogramError) as exc:
            log.warning("telegram.set_my_commands failed: %s", self._scrub(exc))

    def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """A file of a message (`FetchesFiles`): getFile, then the file download path."""
        return self.files.fetch(ref, max_bytes)

    @contextlib.asynccontextmanager
    async def _api(self) -> AsyncIterator[Bot]:
        """Use the bot for one request; after `stop()` the session closes when the last ends."""
        if self._bot is None:
            raise DeliveryError("the Telegram channel is not started")
        if self._closing is not None and not self._closing.done():
            await asyncio.shield(self._closing)  # a fresh HTTP session opens after it
        self._inflight += 1
        try:
            yield self._bot
        finally:
            self._inflight -= 1
            if self._stopped and self._inflight == 0:
                await self._close_session()

    async def _close_session(self) -> None:
        if self._bot is None:
            return
        if self._closing is None or self._closing.done():
            self._closing = asyncio.ensure_future(self._bot.session.close())
        with contextlib.suppress(Exception):
            await asyncio.shield(self._closing)

    # -- webhook -------------------------------------------------------------------------------
    async def _webhook(self, request: web.Request) -> web.StreamResponse:
        expected = (self.settings.telegram_webhook_secret or "").encode()
        # surrogatepass: aiohttp decodes bytes that are not UTF-8 to lone surrogates.
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogatepass")
        if not expected or not hmac.compare_digest(given, expected):
            log.warning("telegram.webhook rejected: wrong or missing secret token")
            if self._runtime is not None:
                self._runtime.note_inbound(self.name, "unauthorized")
            return web.Response(status=401, text="unauthorized")
        if self._runtime is None or self._bot is None or self._stopping.is_set():
            return web.Response(status=503, text="not ready")
        try:
            update = read_update(parse_body(await request.read()), self._bot)
        except Malformed as exc:
            self._malformed(exc, "webhook")
            # 400: not an update at all. An unusable update gets an empty 200, so Telegram
            # does not retry it (a JSON body would be read as a method call).
            text = exc.reason if exc.status != 200 else None
            return web.Response(status=exc.status, text=text)
        try:
            await self._handle(update)
        except Exception as exc:
            log.error("telegram.receive failed update=%d: %s", update.update_id, self._scrub(exc))
            # Not acknowledged (the store or the lease failed): Telegram sends it again, and a
            # copy that was stored after all is recognised by its message id.
            return web.Response(status=500, text="not acknowledged; retry")
        # An empty body: a JSON body would be read by Telegram as a method call.
        return web.Response(status=200)

    # -- inbound -------------------------------------------------------------------------------
    def _malformed(self, exc: Malformed, via: str) -> None:
        log.warning(
            "telegram.update.malformed via=%s update=%s: %s", via, exc.update_id, exc.reason
        )
        if self._runtime is not None:
            self._runtime.note_inbound(self.name, "malformed")

    async def _handle(self, update: Update) -> None:
        """Store one update's message (if it is for us); raises only when storing failed."""
        runtime = self._runtime
        if runtime is None:
            return
        if update.callback_query is not None:
            await self._approvals.press(update.callback_query, runtime)
            return
        if update.message is None:
            return  # edited messages, channel posts, anything else we did not subscribe to
        await self.messages.handle(update.message, update.update_id, runtime)

    # -- outbound (telegram_outbox) ----------------------------------------------------------
    def split(self, text: str) -> list[str]:
        return self._outbox.split(text)

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        return await self._outbox.send(target, piece)

    async def send_file(
        self, target: dict[str, Any], name: str, data: bytes, mime: str, caption: str | None
    ) -> list[str]:
        """Post a file (`SendsFiles`): sendPhoto for a photo Telegram shows, else sendDocument."""
        return await self.files.send(
            self._route(int(target["chat_id"])), target, name, data, mime, caption
        )

    def working(self, target: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[None]:
        return self._outbox.working(target)

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        """An approval request with an inline keyboard (channels.base.Approvals)."""
        return await self._approvals.ask(target, request)

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text: str
    ) -> None:
        """The request was decided: the keyboard gives way to who decided what."""
        await self._approvals.settle(target, ids, request, text)

    def stream(
        self, target: dict[str, Any], shown: Sequence[str | None] = ()
    ) -> TelegramStream | None:
        """The reply shown while it is written: a draft in private chats, a message edited
        in place in groups (channels/telegram_stream.py)."""
        if "chat_id" not in target:
            return None
        return TelegramStream(
            self._outbox,
            target,
            shown,
            route=self._route,
            drafts=self._drafts,
            scrub=self._scrub,
            retry_base=self.retry_base,
        )

    def _route(self, chat_id: int) -> int:
        seen = {chat_id}
        while chat_id in self._migrated:
            chat_id = self._migrated[chat_id]
            if chat_id in seen:
                break
            seen.add(chat_id)
        return chat_id

    def _moved(self, old: int, new: int) -> None:
        """A send learned that group `old` is supergroup `new` now: later sends go there, and
        the supergroup's messages continue the group's conversation."""
        log.info("telegram.chat_migrated from=%d to=%d", old, new)
        self._migrated[old] = new
        if self._runtime is not None:
            task = asyncio.get_running_loop().create_task(
                self._runtime.move_session(f"{self.name}:{old}", f"{self.name}:{new}")
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # -- helpers -------------------------------------------------------------------------------
    def _scrub(self, exc: BaseException | str) -> str:
        """An error message without the token (aiohttp errors can contain request URLs)."""
        text = str(exc)
        token = self._token or ""
        for secret in (token, token.partition(":")[2]):
            if len(secret) >= 6:
                text = text.replace(secret, "[token]")
        return text


def _describe(usage: str) -> str:
    """The menu text of a command from its usage line ("/x — does y" -> "does y")."""
    _, _, text = usage.partition(" — ")
    return (text or usage)[:256]
