"""Outbound: send a reply piece by piece through its channel, recording every piece.

The last piece's `reply.sent` and whatever must follow it (the `inbound.done` marker) are one
write, so a restart resumes delivery at the first piece not yet recorded and never re-sends a
piece whose fate is unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from channels.base import Channel, DeliveryError, DeliveryUnknown

from ..tape import TapeEntry
from .facts import DONE, REPLY_SENT, reply_text
from .session import Session

log = logging.getLogger("bub_bot.runtime")


class Delivery:
    """Sends replies through the running channels and records what happened to each piece."""

    def __init__(self, channels: dict[str, Channel], emit: Callable[..., None]) -> None:
        self.channels = channels
        self._emit = emit

    async def finish(
        self,
        session: Session,
        source: TapeEntry,
        reply: TapeEntry,
        through: int,
        *,
        fresh: bool,
        **data: Any,
    ) -> None:
        """Deliver `reply` and mark the inbound entries up to `through` as handled.

        A `fresh` reply has no pieces sent yet; otherwise the pieces already recorded are
        skipped.
        """
        done: set[int] = set()
        if not fresh:
            sent = await session.tape.query(
                after_id=reply.id, kinds=["event"], names=[REPLY_SENT, "reply.unknown"]
            )
            done = {
                e.payload["data"].get("chunk")
                for e in sent
                if e.payload["data"].get("reply") == reply.id
            }
        marker = TapeEntry.event(
            DONE, {"through": through, "reply": reply.id, **data}, context=False
        )
        await self.send(session, source, reply_text(reply), reply.id, skip=done, then=[marker])
        session.cursor = through

    async def send(
        self,
        session: Session,
        source: TapeEntry,
        text: str,
        reply_id: int | None,
        skip: set[int] | None = None,
        then: list[TapeEntry] | None = None,
    ) -> None:
        """Send `text` piece by piece, recording each; `then` is written with the last
        piece's record (or after the last attempt when that piece was not sent)."""
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
        pieces = channel.split(text)
        for index, piece in enumerate(pieces):
            if skip and index in skip:
                continue
            last = index == len(pieces) - 1
            try:
                ids = await channel.send(target, piece)
            except DeliveryUnknown as exc:
                # It may have been posted: record it and never post it again.
                log.warning("reply.unknown session=%s chunk=%d: %s", session.id, index, exc)
                record = TapeEntry.event(
                    "reply.unknown",
                    {"reply": reply_id, "chunk": index, "error": str(exc)},
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
            await session.tape.append_many([record, *(then if last else [])])
            if last:
                then = []
        if then:
            await session.tape.append_many(then)
