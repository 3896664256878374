"""After a start (or for `bub-bot run`): find the sessions whose tapes say work is unfinished
(messages not answered, replies not delivered) and wake their workers. The worker then reads
its own cursor and takes the session's lease; this only decides who is worth waking."""

from __future__ import annotations

import logging
from collections.abc import Collection

from ..tape import Tape, TapeStore
from .facts import channel_of, is_pending, read_cursor, read_queue, unhandled_replies
from .placement import Placement
from .session import Session, Sessions
from .worker import SessionWorker

log = logging.getLogger("bub_bot.runtime")


async def resume_sessions(
    store: TapeStore,
    sessions: Sessions,
    placement: Placement,
    worker: SessionWorker,
    channels: Collection[str],
    only: set[str] | None = None,
) -> int:
    """Wake every session (or just those in `only`) with unfinished inbound work whose
    channel runs here (`channels`); returns how many were woken."""
    woken = 0
    for summary in await store.list_tapes():
        if not summary.session_id or (only is not None and summary.session_id not in only):
            continue
        tape = Tape(store, summary.name, summary.session_id)
        items = await read_queue(tape, await read_cursor(tape))
        pending = [e for e in items if is_pending(e)]
        if not pending and not unhandled_replies(items):
            continue
        # A session whose channel is not running now stays as it is.
        if channel_of(items) not in channels:
            continue
        session = sessions.get(summary.session_id)
        if session is None:
            workspace = await placement.recorded_workspace(tape)
            # Checked again: the session may have come alive while we were reading.
            session = sessions.get(summary.session_id)
            if session is None:
                session = sessions.add(Session(summary.session_id, tape, workspace))
        # Never set the cursor here: a live worker may have moved it since we read it, and
        # rewinding it would answer messages twice. The worker reads its own.
        worker.wake(session)
        woken += 1
    if woken:
        log.info("resume sessions=%d", woken)
    return woken
