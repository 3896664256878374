"""Files that came with a turn's messages: fetched through their channel into the session's
`inbox/`, then written on the tape as one user message per inbound message saying what the
model gets (name, type, size, path; text inline; images; a voice note's transcript).

It runs in the turn, before the model is called, so the download is retried on resume after
a crash; the file's name is the same on every attempt and a finished file is reused, and the
message is written once (checked on the tape and by a dedupe key), so nothing doubles."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from channels.base import Attachment, Channel, FetchesFiles, FetchFailed

from ..budgets import Budgets, Payer
from ..config import Settings
from ..files import extract, inbox
from ..files.sniff import is_texty, sniff
from ..files.transcribe import NotTranscribed, Transcriber
from ..tape import TapeEntry, TapeStore
from .session import Session

log = logging.getLogger("bub_bot.runtime")

ATTEMPTS = 3
"""Tries of one download (or transcription) within a turn before the model gets a note."""
RETRY_DELAY = 0.5


def human_size(size: int | None) -> str:
    """`512 B`, `12 KB`, `3.4 MB`."""
    if size is None:
        return "size unknown"
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / 1024 / 1024:.1f} MB"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


class Attachments:
    """Resolves the attachments of a turn's messages (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        store: TapeStore,
        channels: dict[str, Channel],
        transcriber: Transcriber,
        budgets: Callable[[], Budgets | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.channels = channels
        self.transcriber = transcriber
        self.budgets = budgets
        """The budgets a transcription is checked against (it is paid for like a call)."""

    async def resolve(self, session: Session, messages: list[TapeEntry]) -> None:
        """Write the attachment message for each of `messages` that has files and none yet."""
        with_files = [m for m in messages if m.kind == "message" and m.meta.get("attachments")]
        if not with_files:
            return
        later = await session.tape.query(after_id=with_files[0].id - 1, kinds=["message"])
        done = {e.meta.get("attachments_of") for e in later}
        for message in with_files:
            if message.id in done:
                continue
            entry = await self._describe(session, message)
            await self.store.append_many(
                session.tape.name,
                [entry],
                dedupe_keys=[f"attachments:{session.tape.name}:{message.id}"],
                session_id=session.id,
            )

    async def _describe(self, session: Session, message: TapeEntry) -> TapeEntry:
        channel = self.channels.get(str(message.meta.get("channel", "")))
        day = _day(message.date)
        texts: list[str] = []
        images: list[dict[str, Any]] = []
        files: list[dict[str, Any]] = []
        transcribed = False
        for index, raw in enumerate(message.meta["attachments"]):
            att = Attachment.from_json(raw)
            key = f"{session.tape.name}:{message.id}:{index}"
            prefix = inbox.inbox_prefix(key, day, att.name or att.kind)
            try:
                result = await self._one(session.workspace, channel, att, prefix)
            except Exception as exc:  # a bug in a channel must not cost the message
                log.exception("attachment.error session=%s entry=%d", session.id, message.id)
                result = {"name": att.name, "error": f"could not be fetched ({type(exc).__name__})"}
            files.append(result)
            label = _label(att)
            if "error" in result:
                texts.append(f"[{label}: {result['error']}]")
                log.info(
                    "attachment.failed session=%s entry=%d index=%d: %s",
                    session.id,
                    message.id,
                    index,
                    result["error"],
                )
                continue
            log.info(
                "attachment.saved session=%s entry=%d index=%d type=%s bytes=%d reused=%s",
                session.id,
                message.id,
                index,
                result["type"],
                result["size"],
                result.get("reused", False),
            )
            head = (
                f"[{label} — {result['type']}, {human_size(result['size'])},"
                f" saved as {result['path']}]"
            )
            try:
                payer = Payer.of(session.id, message.meta)
                body, image, transcript = await self._content(session.workspace, att, result, payer)
            except Exception as exc:  # an unreadable file must not cost the message
                log.exception("attachment.unreadable session=%s entry=%d", session.id, message.id)
                body, image, transcript = f"(could not be read: {type(exc).__name__})", None, None
            if transcript is not None:
                transcribed = True
                texts.append(f"[{label}, transcribed] {transcript}")
                continue
            texts.append(head + (f"\n{body}" if body else ""))
            if image:
                images.append({"type": "image_url", "image_url": {"url": image}})
        text = "\n\n".join(texts)
        content: Any = text
        if images:
            content = [{"type": "text", "text": text}, *images]
        meta: dict[str, Any] = {"attachments_of": message.id, "files": files}
        if transcribed:
            meta["transcribed"] = True
        return TapeEntry.message({"role": "user", "content": content}, **meta)

    async def _one(
        self, workspace: Path, channel: Channel | None, att: Attachment, prefix: str
    ) -> dict[str, Any]:
        """Fetch and save one file: {name, path, type, size} or {name, error}."""
        cap = self.settings.attachment_max_bytes
        out: dict[str, Any] = {"name": att.name, "kind": att.kind}
        if att.error:
            return out | {"error": att.error}
        if att.size is not None and att.size > cap:
            return out | {"error": f"not downloaded: {_too_large(att.size, cap)}"}
        found = inbox.existing(workspace, prefix)
        saved = found
        if saved is None:
            if not isinstance(channel, FetchesFiles):
                return out | {"error": "could not be fetched: this channel does not fetch files"}
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    saved = await inbox.save(
                        workspace, prefix, _chunks(channel, att.ref, cap), cap, _extension(att)
                    )
                    break
                except inbox.TooLarge:
                    return out | {"error": f"not downloaded: {_too_large(None, cap)}"}
                except inbox.InboxError as exc:
                    return out | {"error": f"could not be saved: {exc}"}
                except FetchFailed as exc:
                    if not exc.retry or attempt == ATTEMPTS:
                        return out | {"error": f"could not be fetched: {exc.reason}"}
                    await asyncio.sleep(RETRY_DELAY * attempt)
        assert saved is not None
        head = inbox.read_head(workspace, saved.relpath, inbox.SNIFF_BYTES)
        mime, _ = sniff(head, att.name)
        out |= {"path": saved.relpath, "type": mime, "size": saved.size}
        if saved.reused:
            out["reused"] = True
        return out

    async def _content(
        self, workspace: Path, att: Attachment, saved: dict[str, Any], payer: Payer
    ) -> tuple[str, str | None, str | None]:
        """(text inline, image data URL, transcript) for a saved file."""
        s = self.settings
        mime, path, size = saved["type"], saved["path"], saved["size"]
        limit = s.attachment_inline_chars
        if mime.startswith("image/"):
            if s.model_images and size <= s.attachment_image_max_bytes:
                return "", extract.data_url(workspace, path, mime, size), None
            return "(the image is not shown to you; it is in the workspace)", None, None
        if mime.startswith("audio/") or att.kind in ("voice", "audio"):
            return await self._transcript(workspace, att, path, size, payer)
        if mime == "application/pdf":
            text, more = await asyncio.to_thread(extract.pdf_text, workspace, path, size, limit)
            if not text:
                return "(no text could be extracted from this PDF)", None, None
            return _cut(text, more, path), None, None
        if is_texty(mime):
            text, more = extract.text_of(workspace, path, limit)
            return _cut(text, more, path), None, None
        return "(not shown inline; read it with the file tools)", None, None

    async def _transcript(
        self, workspace: Path, att: Attachment, path: str, size: int, payer: Payer
    ) -> tuple[str, str | None, str | None]:
        cap = self.settings.transcribe_max_seconds
        if att.duration is not None and att.duration > cap:
            return f"(voice not transcribed: longer than {_duration(cap)})", None, None
        budgets = self.budgets()
        if budgets is not None and self.transcriber.enabled:
            # The provider bills a transcription too: none once the sender's budget is spent
            # (the model is not called for them either).
            spent = await budgets.check(payer)
            if spent is not None:
                log.info("attachment.not_transcribed reason=budget scope=%s", spent.scope)
                return "(voice not transcribed: the budget is used up)", None, None
        for attempt in range(1, ATTEMPTS + 1):
            try:
                text = await self.transcriber.transcribe(workspace, path, size)
                return "", None, text or "(nothing was said)"
            except NotTranscribed as exc:
                if not exc.retry or attempt == ATTEMPTS:
                    return f"({exc.reason})", None, None
                await asyncio.sleep(RETRY_DELAY * attempt)
        return "(voice not transcribed)", None, None


async def _chunks(channel: FetchesFiles, ref: dict[str, Any], cap: int) -> AsyncIterator[bytes]:
    async for chunk in channel.fetch(ref, cap):
        yield chunk


def _extension(att: Attachment):
    def pick(head: bytes) -> str:
        return sniff(head, att.name)[1]

    return pick


def _label(att: Attachment) -> str:
    kind = {"voice": "voice message", "file": "file"}.get(att.kind, att.kind)
    details = [d for d in (att.name if att.kind != "voice" else "", _duration(att.duration)) if d]
    return f"{kind}: {', '.join(details)}" if details else kind


def _too_large(size: int | None, cap: int) -> str:
    got = f" ({human_size(size)})" if size is not None else ""
    return f"too large{got}; the limit is {human_size(cap)} (BUB_ATTACHMENT_MAX_BYTES)"


def _cut(text: str, more: bool, path: str) -> str:
    if more:
        return f"{text}\n[… cut here; the rest is in {path}: read it with fs.read]"
    return text


def _day(date: str) -> str:
    try:
        return datetime.fromisoformat(date).strftime("%Y%m%d")
    except ValueError:
        return "file"
