"""What the tape says about a session's progress: which inbound entries are pending, which
replies are computed but not delivered, how far a reply covers the inbound queue, and where
the handled part of the queue ends (`read_cursor`).

Every step of the runtime leaves one of these facts behind, so after a crash the worker picks
up exactly where the facts stop.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..approvals.requests import DECISION, REQUEST, is_decision
from ..budgets import LIMIT_NOTICE
from ..schedules.prompts import NOTICE
from ..tape import Tape, TapeEntry

DONE = "inbound.done"
REPLY_SENT = "reply.sent"
REPLY_UNKNOWN = "reply.unknown"
"""A piece the platform may or may not have posted: never sent again."""
REPLY_FAILED = "reply.failed"
"""A piece the platform refused: never sent again."""
SHOWN = "stream.shown"
"""The platform ids of the messages a stream shows partial text in (`streaming.py`)."""
REPLY_SENDING = "reply.sending"
"""A reply's first piece is about to go out (`delivery.py`): another replica that takes the
session over waits for its record before sending it again."""


def is_pending(entry: TapeEntry) -> bool:
    """An inbound user message, command or approval decision not yet handled (copies, and
    messages refused over a rate limit, do not count)."""
    if not entry.meta.get("inbound") or entry.meta.get("copy_of") or "refused" in entry.meta:
        return False
    if entry.kind == "message":
        return entry.payload.get("role") == "user"
    return entry.kind == "event" and entry.payload.get("name") in ("command", DECISION)


def is_barrier(entry: TapeEntry) -> bool:
    """A pending entry that ends a turn's messages: a command (a decision is part of the
    turn it continues)."""
    return entry.kind == "event" and not is_decision(entry)


def command_name(entry: TapeEntry) -> str | None:
    """The chat command an inbound `command` entry runs (None: the entry is no command)."""
    if entry.kind != "event" or entry.payload.get("name") != "command":
        return None
    return str(entry.payload.get("data", {}).get("name", ""))


def is_reply(entry: TapeEntry) -> bool:
    """An entry whose text goes to the user: a turn's answer or notice, a command's reply,
    a scheduled job's note (it carries its own target)."""
    if entry.kind == "message":
        return entry.payload.get("role") == "assistant" and "turn" in entry.meta
    return entry.kind == "event" and entry.payload.get("name") in (
        "turn.notice",
        "command.done",
        NOTICE,
        LIMIT_NOTICE,
        REQUEST,
    )


def unhandled_replies(items: list[TapeEntry]) -> list[TapeEntry]:
    """Replies in `items` that no `inbound.done` has closed yet."""
    handled = {
        e.payload["data"].get("reply")
        for e in items
        if e.kind == "event" and e.payload.get("name") == DONE
    }
    return [e for e in items if is_reply(e) and e.id not in handled]


def marks_itself(reply: TapeEntry) -> bool:
    """Whether the reply entry itself says its first piece is being sent: a reply written by
    the worker that delivers it at once (a turn's answer or notice, an approval request, a
    command's reply), so the write that records it carries the mark and the plain path writes
    nothing more. A reply that carries its own target (the /reset reply, a schedule's or a
    limit's notice) is delivered by whoever runs the session's queue next: it gets a
    `reply.sending` of its own before it goes out."""
    return "reply_target" not in reply.meta


def seen_through(reply: TapeEntry) -> int | None:
    """The newest entry the model had seen when it wrote this reply (None: not recorded)."""
    if reply.kind == "message":
        value = reply.meta.get("seen_through")
    else:
        value = reply.payload.get("data", {}).get("seen_through")
    return int(value) if isinstance(value, int) else None


def reply_text(entry: TapeEntry) -> str:
    """The text a reply entry sends to the user."""
    if entry.kind == "message":
        content = entry.payload.get("content")
        return content if isinstance(content, str) else ""
    return str(entry.payload.get("data", {}).get("text", ""))


def covered(pending: list[TapeEntry], reply: TapeEntry, seen: int | None = None) -> int:
    """The newest inbound id a reply answers: a command's own id, or the messages before the
    first command (the turn never saw what queued behind a command) that the model had seen
    (`seen`, else what the reply recorded)."""
    if reply.kind == "event" and reply.payload.get("name") == "command.done":
        return int(reply.payload["data"].get("through", 0))
    limit = seen if seen is not None else seen_through(reply)
    through = 0
    for entry in pending:
        if is_barrier(entry) or (limit is not None and entry.id > limit):
            break
        through = entry.id
    return through


def head_through(pending: list[TapeEntry]) -> int:
    """The newest inbound id the head of `pending` stands for: a command alone, or the
    messages before the first command (what one turn takes); 0 when nothing is pending."""
    if not pending:
        return 0
    head = pending[0]
    if is_barrier(head):
        return head.id
    through = head.id
    for entry in pending:
        if is_barrier(entry):
            break
        through = entry.id
    return through


def channel_of(items: list[TapeEntry]) -> str | None:
    """The channel of the newest entry that names one (an inbound message, or a reply that
    carries its own target like the /reset reply)."""
    return next((e.meta["channel"] for e in reversed(items) if e.meta.get("channel")), None)


def age_seconds(entry: TapeEntry) -> float:
    """How old an inbound entry is: by the platform's message time when the channel gave
    one (a backlog delivered after downtime is old), else by when it was stored."""
    sent_at = entry.meta.get("sent_at")
    if isinstance(sent_at, int | float) and not isinstance(sent_at, bool):
        return datetime.now(UTC).timestamp() - float(sent_at)
    try:
        then = datetime.fromisoformat(entry.date)
    except ValueError:
        return 0.0
    return (datetime.now(UTC) - then).total_seconds()


async def read_cursor(tape: Tape) -> int:
    """The newest inbound id the tape records as handled (its last `inbound.done`); 0: none."""
    done = await tape.query(kinds=["event"], names=[DONE], newest_first=True, limit=1)
    return int(done[0].payload["data"]["through"]) if done else 0


async def read_queue(tape: Tape, cursor: int) -> list[TapeEntry]:
    """The messages and events after `cursor`: the pending inbound entries and what the
    runtime recorded about them (replies, pieces sent, done markers)."""
    return await tape.query(after_id=cursor, kinds=["message", "event"])
