"""The session worker's ways other than a turn or a command: finish delivering a reply that was
computed before a crash, answer messages that waited too long with one note, and close an
entry whose handling failed. Each ends with an `inbound.done`, so the queue always moves on.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from ..approvals.requests import REQUEST, is_decision
from ..config import Settings
from ..tape import TapeEntry
from .delivery import Delivery
from .facts import age_seconds, covered, head_through, is_pending, unhandled_replies
from .session import Session
from .turns import FAILED_NOTE

log = logging.getLogger("bub_bot.runtime")

EXPIRED_NOTE = (
    "Sorry, I was offline and your earlier message{s} expired before I could answer."
    " Please send {it} again."
)


class Recovery:
    """Pending replies, expired messages and failed entries of a session's queue."""

    def __init__(self, settings: Settings, delivery: Delivery) -> None:
        self.settings = settings
        self.delivery = delivery
        self.started_at = datetime.now(UTC).isoformat(timespec="microseconds")
        """When this process started: a message stored before it was found on resume."""

    async def finish_reply(self, session: Session, items: list[TapeEntry]) -> bool:
        """Finish delivering an answer that was computed but not fully sent (after a crash,
        or the /reset reply written with the reset); False: there is none. A piece another
        process may have sent is waited for first (`Delivery.finish`, "at least once, and once
        whenever it can be known")."""
        replies = unhandled_replies(items)
        if not replies:
            return False
        reply = replies[-1]
        pending = [e for e in items if is_pending(e) and e.id < reply.id]
        through = max(covered(pending, reply), session.cursor or 0)
        if _decided_request(reply, items):
            # A crash after the request was posted, before that was recorded, and someone
            # pressed its buttons since: posting it again would only show stale buttons.
            await self.delivery.mark_done(session, through, reply=reply.id, decided=True)
            return True
        source = next((e for e in reversed(pending) if e.id <= through), None)
        if source is None and "reply_target" in reply.meta:
            source = reply  # a reply that carries its own target (the /reset reply)
        if source is None:
            await self.delivery.mark_done(session, through, reply=reply.id)  # closes it: no loop
            return True
        log.info("reply.pending session=%s entry=%d", session.id, reply.id)
        try:
            await self.delivery.finish(session, source, reply, through, fresh=False, resumed=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reply.resume_failed session=%s entry=%d", session.id, reply.id)
            await self.delivery.mark_done(session, through, reply=reply.id, failed=True)
        return True

    def expired(self, entry: TapeEntry) -> bool:
        """A message expires when it is older than the resume window and was either stored
        before this process started (found on resume) or sent long before the platform
        delivered it (a backlog after downtime: the platform's own time says so)."""
        window = self.settings.resume_window_seconds
        if is_decision(entry):
            return False  # a decision always settles its request (its calls wait for it)
        if window <= 0 or (entry.date >= self.started_at and "sent_at" not in entry.meta):
            return False
        return age_seconds(entry) > window

    async def expire(self, session: Session, expired: list[TapeEntry]) -> None:
        """Old messages found after a restart: record them and send one note per session."""
        last = expired[-1]
        log.warning("inbound.expired session=%s count=%d", session.id, len(expired))
        many = len(expired) > 1
        text = EXPIRED_NOTE.format(s="s" if many else "", it="them" if many else "it")
        note = await session.tape.append(
            TapeEntry.event(
                "inbound.expired", {"ids": [e.id for e in expired], "text": text}, context=False
            )
        )
        await self.delivery.send(session, last, text, note.id)
        await self.delivery.mark_done(session, last.id, expired=True)

    async def give_up(self, session: Session, pending: list[TapeEntry], exc: Exception) -> None:
        """Close the head of `pending` (a command, or the messages before the first command)
        after an unexpected failure: an `error` entry, a short note to the user, done."""
        through = head_through(pending)
        log.exception("session.failed session=%s entry=%d", session.id, pending[0].id)
        written = await session.tape.append_many(
            [
                TapeEntry.error("runtime", f"{type(exc).__name__}: {exc}"),
                TapeEntry.event(
                    "turn.notice", {"status": "error", "text": FAILED_NOTE}, context=False
                ),
            ]
        )
        source = next(e for e in reversed(pending) if e.id <= through)
        try:
            await self.delivery.finish(session, source, written[-1], through, fresh=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Even the note could not go out (e.g. the channel cannot format it): still done.
            log.exception("reply.failed session=%s entry=%d", session.id, written[-1].id)
            await self.delivery.mark_done(session, through, reply=written[-1].id, failed=True)


def _decided_request(reply: TapeEntry, items: list[TapeEntry]) -> bool:
    """`reply` is an approval request that a stored decision already answers."""
    if reply.kind != "event" or reply.payload.get("name") != REQUEST:
        return False
    rid = reply.payload["data"].get("id")
    return any(is_decision(e) and e.payload["data"].get("request") == rid for e in items)
