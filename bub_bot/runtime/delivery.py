"""Outbound: send a reply piece by piece through its channel, recording every piece.

The last piece's `reply.sent` and whatever must follow it (the `inbound.done` marker) are one
write, so a restart resumes delivery at the first piece not yet recorded and never re-sends a
piece whose fate is unknown.

A streamed reply's pieces go through its `ReplyStream` first (the partial message becomes the
piece); a delivery without one takes over the partial messages a crashed stream left in the
session (`streaming.leftover`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from channels.base import (
    Approvals,
    Channel,
    DeliveryError,
    DeliveryUnknown,
    ReplyStream,
    Streams,
)

from ..approvals.requests import REQUEST
from ..config import Settings
from ..tape import TapeEntry
from .facts import DONE, REPLY_SENT, REPLY_UNKNOWN, reply_text
from .session import Session
from .streaming import STREAM_EVENTS, closed_event, leftover, open_stream

log = logging.getLogger("bub_bot.runtime")


class Delivery:
    """Sends replies through the running channels and records what happened to each piece."""

    def __init__(
        self,
        channels: dict[str, Channel],
        emit: Callable[..., None],
        settings: Settings,
    ) -> None:
        self.channels = channels
        self._emit = emit
        self.settings = settings

    async def finish(
        self,
        session: Session,
        source: TapeEntry,
        reply: TapeEntry,
        through: int,
        *,
        fresh: bool,
        stream: ReplyStream | None = None,
        on_sent: Callable[[], None] | None = None,
        adopt: bool = True,
        **data: Any,
    ) -> None:
        """Deliver `reply` and mark the inbound entries up to `through` as handled.

        A `fresh` reply has no pieces sent yet; otherwise the pieces already recorded are
        skipped. `stream`, `on_sent` and `adopt` are as for `send`.
        """
        done: set[int] = set()
        if not fresh:
            sent = await session.tape.query(
                after_id=reply.id, kinds=["event"], names=[REPLY_SENT, REPLY_UNKNOWN]
            )
            done = {
                e.payload["data"].get("chunk")
                for e in sent
                if e.payload["data"].get("reply") == reply.id
            }
        marker = TapeEntry.event(
            DONE, {"through": through, "reply": reply.id, **data}, context=False
        )
        asks = reply.kind == "event" and reply.payload.get("name") == REQUEST
        await self.send(
            session,
            source,
            reply_text(reply),
            reply.id,
            skip=done,
            then=[marker],
            stream=stream,
            on_sent=on_sent,
            adopt=adopt,
            ask=reply.payload["data"] if asks else None,
        )
        session.cursor = through

    async def send(
        self,
        session: Session,
        source: TapeEntry,
        text: str,
        reply_id: int | None,
        skip: set[int] | None = None,
        then: list[TapeEntry] | None = None,
        stream: ReplyStream | None = None,
        on_sent: Callable[[], None] | None = None,
        adopt: bool = True,
        ask: dict[str, Any] | None = None,
    ) -> None:
        """Send `text` piece by piece, recording each; `then` is written with the last
        piece's record (or after the last attempt when that piece was not sent).

        `ask`: the reply is an approval request (its data): a channel with buttons
        (`Approvals`) posts it as one message with them; others get the text.

        `stream`: the reply's stream, which delivers the pieces it shows; without one (and
        with `adopt`) partial messages a crashed stream left are taken over. `on_sent` is
        called once the first piece is out."""
        then = list(then or [])
        channel_name = source.meta.get("channel", "")
        channel = self.channels.get(channel_name)
        target = source.meta.get("reply_target") or {}
        if not text.strip():
            text = "(no answer)"
        if channel is None:
            log.error(
                "reply.failed session=%s: channel %r is not running", session.id, channel_name
            )
            await session.tape.append_many(
                [
                    TapeEntry.event(
                        "reply.failed",
                        {"reply": reply_id, "error": f"channel {channel_name!r} not running"},
                        context=False,
                    ),
                    *then,
                ]
            )
            return
        buttons = ask is not None and isinstance(channel, Approvals)
        pieces = [text] if buttons else channel.split(text)
        if stream is None and adopt and isinstance(channel, Streams):
            stream = await self._adopt(session, channel, target)
        for index, piece in enumerate(pieces):
            if skip and index in skip:
                continue
            last = index == len(pieces) - 1
            held: list[str] = []
            try:
                ids = None
                if buttons:
                    assert ask is not None and isinstance(channel, Approvals)
                    ids = await channel.ask(target, ask)
                elif stream is not None:
                    slot = stream.shown[index] if index < len(stream.shown) else None
                    held = [slot] if slot else []
                    ids = await stream.deliver(index, piece)
                if ids is None:
                    ids = await channel.send(target, piece)
            except DeliveryUnknown as exc:
                # It may have been posted: record it and never post it again.
                log.warning("reply.unknown session=%s chunk=%d: %s", session.id, index, exc)
                record = TapeEntry.event(
                    REPLY_UNKNOWN,
                    {"reply": reply_id, "chunk": index, "error": str(exc), "ids": held},
                    context=False,
                )
                self._emit("reply", channel=channel_name, outcome="unknown")
            except (DeliveryError, Exception) as exc:
                log.error("reply.failed session=%s chunk=%d: %s", session.id, index, exc)
                await session.tape.append_many(
                    [
                        TapeEntry.event(
                            "reply.failed",
                            {"reply": reply_id, "chunk": index, "error": str(exc)},
                            context=False,
                        ),
                        *then,
                    ]
                )
                self._emit("reply", channel=channel_name, outcome="failed")
                return
            else:
                record = TapeEntry.event(
                    REPLY_SENT,
                    {"reply": reply_id, "chunk": index, "of": len(pieces), "ids": list(ids)},
                    context=False,
                )
                self._emit("reply", channel=channel_name, outcome="sent")
                if on_sent is not None:
                    on_sent()
                    on_sent = None
            extra: list[TapeEntry] = []
            if last:
                shown = 0 if buttons else len(pieces)  # the buttons' message is no stream's
                extra = [*await self._end(session, stream, shown, reply_id), *then]
                then = []
            await session.tape.append_many([record, *extra])
        if then:
            await session.tape.append_many(
                [*await self._end(session, stream, len(pieces), reply_id), *then]
            )

    async def _adopt(
        self, session: Session, channel: Channel, target: dict[str, Any]
    ) -> ReplyStream | None:
        """A stream over the partial messages a crashed stream left in this session."""
        found = await session.tape.query(
            after_id=session.cursor or 0, kinds=["event"], names=STREAM_EVENTS
        )
        if not leftover(found):
            return None
        return open_stream(channel, target, self.settings, found)

    async def _end(
        self, session: Session, stream: ReplyStream | None, pieces: int, reply_id: int | None
    ) -> list[TapeEntry]:
        """Take away what the stream still shows beyond the answer; the record of it."""
        if stream is None:
            return []
        try:
            removed = await stream.end(pieces)
        except Exception as exc:
            log.warning("stream.end_failed session=%s: %s", session.id, exc)
            return []
        return [closed_event(reply_id, removed)] if removed else []

    async def mark_done(self, session: Session, through: int, **data: Any) -> None:
        """Mark the inbound entries up to `through` as handled (no reply to deliver)."""
        await session.tape.append(
            TapeEntry.event(DONE, {"through": through, **data}, context=False)
        )
        session.cursor = through
