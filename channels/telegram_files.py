"""Files on Telegram: downloading a message's file (getFile, then the file path, streamed)
and posting one the bot sends (sendPhoto / sendDocument through the paced outbox)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
from aiogram import Bot
from aiogram.exceptions import (
    AiogramError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramNetworkError,
)
from aiogram.types import BufferedInputFile, Message

from .base import DeliveryError, DeliveryUnknown, FetchFailed
from .telegram_outbox import TelegramOutbox

PHOTO_TYPES = ("image/jpeg", "image/png", "image/webp")
PHOTO_MAX = 10_000_000
"""sendPhoto takes at most 10 MB; larger images go as documents."""


class TelegramFiles:
    """Fetches and posts files with the channel's bot."""

    def __init__(
        self,
        api: Callable[[], AbstractAsyncContextManager[Bot]],
        outbox: TelegramOutbox,
        scrub: Callable[[Any], str],
    ) -> None:
        self._api = api
        self._outbox = outbox
        self._scrub = scrub

    async def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """A file of a message (`FetchesFiles`)."""
        file_id = str(ref.get("file_id") or "")
        if not file_id:
            raise FetchFailed("no Telegram file id")
        try:
            async with self._api() as bot:
                info = await bot.get_file(file_id)
                if not info.file_path:
                    raise FetchFailed("Telegram gave no file path")
                if (info.file_size or 0) > max_bytes:
                    raise FetchFailed(f"larger than {max_bytes} bytes")
                url = bot.session.api.file_url(bot.token, info.file_path)
                got = 0
                async for chunk in bot.session.stream_content(url, timeout=120):
                    got += len(chunk)
                    if got > max_bytes:
                        raise FetchFailed(f"larger than {max_bytes} bytes")
                    yield chunk
        except TelegramBadRequest as exc:
            raise FetchFailed(f"Telegram refused it: {self._scrub(exc)}") from exc
        except (TelegramAPIError, AiogramError, aiohttp.ClientError, TimeoutError) as exc:
            # The token is in the file URL: the reason is scrubbed before anyone sees it.
            raise FetchFailed(f"download failed: {self._scrub(exc)}", retry=True) from exc

    async def send(
        self,
        chat_id: int,
        target: dict[str, Any],
        name: str,
        data: bytes,
        mime: str,
        caption: str | None,
    ) -> list[str]:
        """Post `data` to `chat_id` (the target's topic): a photo Telegram shows, else a
        document."""
        thread = target.get("thread_id")
        upload = BufferedInputFile(data, filename=name)
        text = caption[:1024] if caption else None
        photo = mime in PHOTO_TYPES and len(data) <= PHOTO_MAX

        async def post(bot: Bot) -> Message:
            if photo:
                return await bot.send_photo(chat_id, upload, caption=text, message_thread_id=thread)
            return await bot.send_document(chat_id, upload, caption=text, message_thread_id=thread)

        try:
            sent = await self._outbox.call(chat_id, post)
        except (TelegramNetworkError, TimeoutError) as exc:
            raise DeliveryUnknown(self._scrub(exc)) from None
        except (TelegramAPIError, AiogramError) as exc:
            raise DeliveryError(self._scrub(exc)) from None
        return [str(sent.message_id)]
