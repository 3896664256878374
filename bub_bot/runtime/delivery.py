"""Outbound: send a reply piece by piece through its channel, recording every piece.

The last piece's `reply.sent` and whatever must follow it (the `inbound.done` marker) are one
write, so a restart resumes delivery at the first piece not yet recorded and never re-sends a
piece whose fate is unknown.

At least once, and once whenever it can be known. Every piece is marked on the tape before it
goes out: the first by the reply entry itself when a turn wrote it (the turn's last append
carries the mark, no write of its own), else by a `reply.sending`; every later one by its
predecessor's record. What the platform took is a fact and is written once the database is
back (`records.py`: retried with backoff, no lease needed). A process that resumes a marked
piece without a record, sent by another process, waits up to a lease period for that record
before sending the piece again: the old owner reaches the database when we do. A dead owner
never writes it: then the piece goes out again, as after a crash (Slack is asked first where
its channel can: `channels.base.Recalls`). A process knows its own deliveries by their
delivery key (ids restart after a /reset).

A send cancelled (lease lost, shutdown grace over) once its request left (the channel says so:
`channels.base.watch_send`) is recorded as `reply.unknown` in the background; one cancelled
still waiting for its turn records nothing and is resent; a keyed post to a channel that can
be asked records nothing either: the next owner asks.

A streamed reply's pieces go through its `ReplyStream` first (the partial message becomes the
piece); a delivery without one takes over the partial messages a crashed stream left in the
session (`streaming.leftover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from channels.base import (
    Approvals,
    Channel,
    DeliveryError,
    DeliveryUnknown,
    Recalls,
    ReplyStream,
    SendState,
    Streams,
    watch_send,
)

from ..approvals.requests import REQUEST
from ..config import Settings
from ..tape import TapeEntry
from .facts import (
    DONE,
    REPLY_FAILED,
    REPLY_SENDING,
    REPLY_SENT,
    REPLY_UNKNOWN,
    marks_itself,
    reply_text,
)
from .records import PIECE_RECORDS, Records, RecordsFull
from .session import Session
from .streaming import (
    OPENING,
    STREAM_EVENTS,
    await_partial,
    closed_event,
    leftover,
    open_stream,
)

log = logging.getLogger("bub_bot.runtime")

TAKEOVER_POLL = 0.2
"""Seconds between looks at the tape while waiting for another process's record."""


class Delivery:
    """Sends replies through the running channels and records what happened to each piece."""

    def __init__(
        self,
        channels: dict[str, Channel],
        emit: Callable[..., None],
        settings: Settings,
        *,
        takeover_wait: float = 0.0,
        records: Records | None = None,
    ) -> None:
        self.channels = channels
        self._emit = emit
        self.settings = settings
        self.takeover_wait = takeover_wait
        """Seconds a resumed piece another process may be sending waits for its record (a
        lease period with shared leases; 0 with one process: the sender is dead)."""
        self.records = records or Records()
        """Where the facts of delivery are written, retried through database outages."""

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
        marked = marks_itself(reply)
        unsure: int | None = None
        if not fresh:
            found = await self._resume_point(session, reply)
            if found is None:
                session.cursor = None  # closed meanwhile (by its sender): read the tape's
                return
            done, marked = found
            if marked:
                # Its fate is unknown: a platform that can be asked is asked first.
                unsure = next(i for i in range(len(done) + 1) if i not in done)
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
            marked=marked,
            key=delivery_key(session.tape.name, reply),
            unsure=unsure,
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
        marked: bool = True,
        key: str | None = None,
        unsure: int | None = None,
    ) -> None:
        """Send `text` piece by piece, recording each; `then` is written with the last
        piece's record (or after the last attempt when that piece was not sent).

        `ask`: the reply is an approval request (its data): a channel with buttons
        (`Approvals`) posts it as one message with them; others get the text.

        `stream`: the reply's stream, which delivers the pieces it shows; without one (and
        with `adopt`) partial messages a crashed stream left are taken over. `on_sent` is
        called once the first piece is out.

        `marked`: the tape already says the first piece is being sent (the reply entry of a
        turn, or a resumed piece's mark); otherwise a `reply.sending` is written before it
        goes out. Every later piece is marked by its predecessor's record."""
        then = list(then or [])
        # By the delivery key, not the id: ids restart after a /reset (an unkeyed send, the
        # expiry note, is never resumed).
        self.records.began(session.tape.name, key)
        channel_name = source.meta.get("channel", "")
        channel = self.channels.get(channel_name)
        target = source.meta.get("reply_target") or {}
        if not text.strip():
            text = "(no answer)"
        if channel is None:
            log.error(
                "reply.failed session=%s: channel %r is not running", session.id, channel_name
            )
            await self.records.write(
                session.tape,
                [
                    TapeEntry.event(
                        REPLY_FAILED,
                        {"reply": reply_id, "error": f"channel {channel_name!r} not running"},
                        context=False,
                    ),
                    *then,
                ],
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
            if index == 0 and not marked:
                mark = {"reply": reply_id, "chunk": 0}
                await self.records.write(
                    session.tape, [TapeEntry.event(REPLY_SENDING, mark, context=False)]
                )
            held: list[str] = []
            try:
                with watch_send() as sending:
                    keyed = False  # posted with its key: the platform can be asked
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
                            keyed = key is not None and isinstance(channel, Recalls)
                            ids = await self._post(
                                session, channel, target, piece, index, key, unsure
                            )
                    except asyncio.CancelledError:
                        fate = (index, len(pieces), held, keyed)
                        self._cancelled(session, reply_id, fate, sending)
                        raise
            except DeliveryUnknown as exc:
                # It may have been posted: record it and never post it again.
                log.warning("reply.unknown session=%s chunk=%d: %s", session.id, index, exc)
                record = TapeEntry.event(
                    REPLY_UNKNOWN,
                    {
                        "reply": reply_id,
                        "chunk": index,
                        "of": len(pieces),
                        "error": str(exc),
                        "ids": held,
                    },
                    context=False,
                )
                self._emit("reply", channel=channel_name, outcome="unknown")
            except (DeliveryError, Exception) as exc:
                log.error("reply.failed session=%s chunk=%d: %s", session.id, index, exc)
                await self.records.write(
                    session.tape,
                    [
                        TapeEntry.event(
                            REPLY_FAILED,
                            {"reply": reply_id, "chunk": index, "error": str(exc)},
                            context=False,
                        ),
                        *then,
                    ],
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
            # A fact once the platform answered: written once the database takes it.
            await self.records.write(session.tape, [record, *extra])
        if then:
            await self.records.write(
                session.tape, [*await self._end(session, stream, len(pieces), reply_id), *then]
            )

    def _cancelled(
        self,
        session: Session,
        reply_id: int | None,
        fate: tuple[int, int, list[str], bool],
        sending: SendState,
    ) -> None:
        """A send cancelled (lease lost, shutdown grace over): one whose request had left may
        be posted, so it is recorded as unknown (in the background: no lease needed, and the
        next owner waits for it); one still waiting for its turn records nothing: resent.
        `fate`: the piece's index, the number of pieces, the stream's message it was to
        edit, and whether it was posted with its key to a platform that can be asked (then
        nothing is recorded either: the next owner asks, `Recalls`, and posts it only when
        it is not there)."""
        index, of, held, keyed = fate
        if not sending.left or keyed:
            unsent = "unsent" if not sending.left else "in_flight"
            log.info("reply.cancelled_%s session=%s chunk=%d", unsent, session.id, index)
            return
        log.warning("reply.unknown session=%s chunk=%d: cancelled in flight", session.id, index)
        data = {"reply": reply_id, "chunk": index, "of": of, "error": "cancelled", "ids": held}
        with contextlib.suppress(RecordsFull):
            self.records.write_later(
                session.tape, [TapeEntry.event(REPLY_UNKNOWN, data, context=False)]
            )

    async def _post(
        self,
        session: Session,
        channel: Channel,
        target: dict[str, Any],
        piece: str,
        index: int,
        key: str | None,
        unsure: int | None,
    ) -> list[str]:
        """Post one piece, with its delivery key where the channel keeps one; a piece whose
        fate is unknown is looked for first (once) and not posted again when found."""
        if key is None or not isinstance(channel, Recalls):
            return await channel.send(target, piece)
        piece_key = f"{key}.{index}"
        if index == unsure:
            found = await channel.recall(target, piece_key)
            if found:
                log.info("reply.recalled session=%s chunk=%d ids=%s", session.id, index, found)
                return found
        return await channel.send_keyed(target, piece, piece_key)

    async def _resume_point(
        self, session: Session, reply: TapeEntry
    ) -> tuple[set[int], bool] | None:
        """Where a resumed delivery of `reply` starts: the pieces already recorded and
        whether the next one is marked as being sent; None: the reply was closed meanwhile.

        A marked piece without a record may be out already, sent by a process that could not
        record it yet (its database connection broke after the platform answered). Records
        of this process are its own: they are waited for here. Another process's are waited
        for up to `takeover_wait` seconds (it writes them as soon as it reaches the database,
        which is when we do); if none comes, the sender is dead and the piece goes out
        again, as after a crash."""
        await self.records.settled(session.tape.name)
        deadline = time.monotonic() + self.takeover_wait
        waited = False
        while True:
            found = await session.tape.query(
                after_id=reply.id,
                kinds=["event"],
                names=[*PIECE_RECORDS, REPLY_SENDING, DONE],
            )
            mine = [e for e in found if e.payload["data"].get("reply") == reply.id]
            if any(e.payload["name"] == DONE for e in mine):
                if waited:
                    log.info("reply.recorded_by_sender session=%s entry=%d", session.id, reply.id)
                return None
            done = {
                e.payload["data"].get("chunk")
                for e in mine
                if e.payload["name"] in (REPLY_SENT, REPLY_UNKNOWN)
            }
            first = next(i for i in range(len(done) + 1) if i not in done)
            of = max((int(e.payload["data"].get("of") or 0) for e in mine), default=0)
            if of and first >= of:  # every piece is recorded (the last as unknown): no wait
                if waited:
                    log.info("reply.recorded_by_sender session=%s entry=%d", session.id, reply.id)
                return done, True
            marked = first > 0 or marks_itself(reply)
            marked = marked or any(
                e.payload["name"] == REPLY_SENDING and e.payload["data"].get("chunk") == first
                for e in mine
            )
            own = self.records.began_here(session.tape.name, delivery_key(session.tape.name, reply))
            if not marked or own or time.monotonic() >= deadline:
                if waited:
                    log.warning(
                        "reply.resend session=%s entry=%d chunk=%d: its sender never recorded it",
                        session.id,
                        reply.id,
                        first,
                    )
                return done, marked
            if not waited:
                log.info(
                    "reply.waiting session=%s entry=%d chunk=%d wait=%.1fs",
                    session.id,
                    reply.id,
                    first,
                    self.takeover_wait,
                )
                waited = True
            await asyncio.sleep(min(TAKEOVER_POLL, max(0.0, deadline - time.monotonic())))

    async def _adopt(
        self, session: Session, channel: Channel, target: dict[str, Any]
    ) -> ReplyStream | None:
        """A stream over the partial messages a crashed stream left in this session."""

        def read() -> Awaitable[list[TapeEntry]]:
            names = [*STREAM_EVENTS, OPENING, DONE]
            return session.tape.query(after_id=session.cursor or 0, kinds=["event"], names=names)

        found = await await_partial(
            session.tape, await read(), self.takeover_wait, self.records, read
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


def delivery_key(tape: str, reply: TapeEntry) -> str:
    """A reply's delivery key: the same in every process, never reused by another reply (the
    entry's date tells a reply from one with its id after a /reset)."""
    digest = hashlib.sha256(f"{tape}|{reply.id}|{reply.date}".encode()).hexdigest()
    return digest[:20]
