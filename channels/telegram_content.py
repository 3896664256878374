"""What a Telegram message says, for the model: its text or caption, a short note for media
it cannot open (voice, video, documents, …), photos as `data:` URLs (size-capped), and the
message it replies to as context."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiogram import Bot
from aiogram.types import Message, PhotoSize

from .base import Attachment

log = logging.getLogger("channels.telegram")

QUOTE_CHARS = 500


class MessageReader:
    """Turns messages into the text and images the model gets."""

    def __init__(
        self,
        max_image_bytes: int,
        api: Callable[[], AbstractAsyncContextManager[Bot]],
        scrub: Callable[[Any], str],
    ) -> None:
        self.max_image_bytes = max_image_bytes
        self._api = api
        self._scrub = scrub

    def reply_context(self, message: Message, bot_id: int | None) -> str:
        """The message replied to (or the quoted part of it), as context for the model."""
        reply = message.reply_to_message
        if reply is not None and reply.forum_topic_created is not None:
            reply = None
        quoted = message.quote.text if message.quote else ""
        if not quoted and reply is not None:
            quoted = reply.text or reply.caption or placeholder(reply) or ""
        if not quoted:
            return ""
        who = "someone"
        origin = reply.from_user if reply is not None else None
        if origin is not None:
            who = "you" if origin.id == bot_id else origin.full_name
        if len(quoted) > QUOTE_CHARS:
            quoted = quoted[:QUOTE_CHARS] + "…"
        return f"[In reply to {who}: {quoted}]"

    async def content(self, message: Message) -> tuple[str, list[str]]:
        """The message's text (caption) with a placeholder for media that is not fetched;
        photos and files are attachments (`attachments`), fetched in the turn."""
        caption = message.text or message.caption or ""
        note = ""
        if message.photo:
            if self.photo(message.photo) is None:
                note = self._photo_note(message.photo)
        elif not attachments(message):
            note = placeholder(message) or ""
        return "\n".join(p for p in (note, caption) if p), []

    def photo(self, sizes: list[PhotoSize]) -> Attachment | None:
        """The largest size of a photo the model may see (BUB_TELEGRAM_MAX_IMAGE_BYTES)."""
        cap = self.max_image_bytes
        if cap <= 0:
            return None
        ordered = sorted(sizes, key=lambda p: p.width * p.height, reverse=True)
        for size in ordered:
            if size.file_size is None or size.file_size <= cap:
                return Attachment(
                    kind="image",
                    ref={"file_id": size.file_id},
                    name="photo",
                    mime="image/jpeg",
                    size=size.file_size,
                )
        return None

    def _photo_note(self, sizes: list[PhotoSize]) -> str:
        if self.max_image_bytes <= 0:
            return "[photo]"
        largest = max(sizes, key=lambda p: p.width * p.height).file_size if sizes else None
        return f"[photo, too large to show: {_bytes(largest)}]" if largest else "[photo]"


BOT_DOWNLOAD_LIMIT = 20 * 1024 * 1024
"""The Bot API's getFile refuses files over 20 MB (a local Bot API server does not)."""


def attachments(message: Message, limit: int | None = BOT_DOWNLOAD_LIMIT) -> list[Attachment]:
    """The files of a message the runtime fetches in the turn (nothing downloaded here):
    documents, audio, voice notes and round videos. Photos stay on their own path."""
    found: list[Attachment] = []
    if message.document:
        d = message.document
        found.append(_attachment("file", d.file_id, d.file_name, d.mime_type, d.file_size, None))
    if message.audio:
        a = message.audio
        name = a.file_name or " - ".join(p for p in (a.performer, a.title) if p)
        found.append(_attachment("audio", a.file_id, name, a.mime_type, a.file_size, a.duration))
    if message.voice:
        v = message.voice
        found.append(_attachment("voice", v.file_id, "", v.mime_type, v.file_size, v.duration))
    if message.video_note:
        v = message.video_note
        found.append(_attachment("video", v.file_id, "round-video", None, v.file_size, v.duration))
    if limit is not None:
        found = [
            a
            if (a.size or 0) <= limit
            else Attachment(
                a.kind,
                a.ref,
                a.name,
                a.mime,
                a.size,
                a.duration,
                error=f"not downloaded: {_bytes(a.size)}, and Telegram bots cannot download"
                " files over 20 MB (send a smaller file or a link)",
            )
            for a in found
        ]
    return found


def _attachment(
    kind: str,
    file_id: str,
    name: str | None,
    mime: str | None,
    size: int | None,
    duration: int | None,
) -> Attachment:
    return Attachment(
        kind=kind,
        ref={"file_id": file_id},
        name=name or "",
        mime=mime or "",
        size=size,
        duration=float(duration) if duration is not None else None,
    )


def has_content(message: Message) -> bool:
    return bool(message.text or message.caption or message.photo or placeholder(message))


def _bytes(size: int | None) -> str:
    if not size:
        return ""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / 1024 / 1024:.1f} MB"


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds // 60}:{seconds % 60:02d}"


def placeholder(message: Message) -> str | None:
    """A short description of a non-text message so the model knows what was sent."""

    def fmt(kind: str, *details: str | None) -> str:
        parts = [d for d in details if d]
        return f"[{kind}: {', '.join(parts)}]" if parts else f"[{kind}]"

    if message.photo:
        return "[photo]"
    if message.voice:
        v = message.voice
        return fmt("voice message", _duration(v.duration), _bytes(v.file_size))
    if message.video_note:
        v = message.video_note
        return fmt("round video message", _duration(v.duration), _bytes(v.file_size))
    if message.video:
        v = message.video
        return fmt("video", v.file_name, _duration(v.duration), _bytes(v.file_size))
    if message.animation:
        a = message.animation
        return fmt("animation", a.file_name, _duration(a.duration), _bytes(a.file_size))
    if message.audio:
        a = message.audio
        title = " - ".join(p for p in (a.performer, a.title) if p) or a.file_name
        return fmt("audio", title, _duration(a.duration), _bytes(a.file_size))
    if message.document:
        d = message.document
        return fmt("document", d.file_name, d.mime_type, _bytes(d.file_size))
    if message.sticker:
        return fmt("sticker", message.sticker.emoji)
    if message.location:
        loc = message.location
        return fmt("location", f"{loc.latitude:.5f}, {loc.longitude:.5f}")
    if message.poll:
        return fmt("poll", message.poll.question)
    return None
