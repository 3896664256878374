"""Facts of delivery that must reach the tape: a piece the platform took, a partial message a
stream shows, the `inbound.done` that follows the last piece.

Such a fact is true whatever happens to the database, so it is written once the database is
back instead of being lost with the connection (a lost `reply.sent` made the replica that took
the session over post the answer again). `Records.write` appends at once; when the store
fails, it keeps the entries in memory and retries with backoff until they are written, in
order per tape, whether or not the caller still waits (a worker cancelled because its lease
was lost does not cancel its records: a record of a fact needs no lease). Entries are kept
only as long as the process lives, and bounded (`limit` writes waiting, `keep_seconds` each).

A retry first looks at the tape, since another replica may have moved on meanwhile: a record
already there (the failed attempt had committed after all) is not written twice, and an
`inbound.done` or `stream.shown` is dropped once someone else wrote an `inbound.done` after
ours failed (a late marker must never move the session's cursor back, a late partial must
never be taken over by the next answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ..tape import Tape, TapeEntry
from ..tape.entries import utc_now
from .facts import DONE, REPLY_FAILED, REPLY_SENT, REPLY_UNKNOWN, SHOWN

log = logging.getLogger("bub_bot.runtime")

PIECE_RECORDS = (REPLY_SENT, REPLY_UNKNOWN, REPLY_FAILED)
"""Records that settle one piece of a reply (`reply`, `chunk`)."""
RETRY_FIRST = 0.05
RETRY_MAX = 1.0
"""Seconds between attempts: doubling from the first to the last; short at the top, since a
replica taking the session over waits for the record (see `delivery.py`)."""
STARTED_LIMIT = 10_000


@dataclass
class _Write:
    tape: Tape
    entries: list[TapeEntry]
    done: asyncio.Future[list[TapeEntry]]
    since: str = field(default_factory=utc_now)
    born: float = field(default_factory=time.monotonic)
    tries: int = 0


class RecordsFull(RuntimeError):
    """Too many records wait for the database already: this one is not kept."""


class Records:
    """Writes delivery facts to their tapes, retrying until the database takes them."""

    def __init__(self, *, limit: int = 10_000, keep_seconds: float = 3600.0) -> None:
        self.limit = limit
        self.keep_seconds = keep_seconds
        self._queues: dict[str, deque[_Write]] = {}
        self._writers: dict[str, asyncio.Task[None]] = {}
        self._started: OrderedDict[tuple[str, str], None] = OrderedDict()

    @property
    def waiting(self) -> int:
        """How many writes wait for the database now."""
        return sum(len(q) for q in self._queues.values())

    async def write(self, tape: Tape, entries: list[TapeEntry]) -> list[TapeEntry]:
        """Append `entries` (one transaction); if that fails, retry until written or given
        up (then the last error is raised). Cancelling the caller leaves the write going."""
        return await asyncio.shield(self.write_later(tape, entries))

    def write_later(self, tape: Tape, entries: list[TapeEntry]) -> asyncio.Future[list[TapeEntry]]:
        """`write` without waiting: queued at once (also from a task being cancelled, which
        cannot await any more); the future is done once written or given up."""
        if self.waiting >= self.limit:
            log.error("record.full session=%s waiting=%d", tape.session_id, self.waiting)
            raise RecordsFull(f"{self.waiting} records wait for the database")
        job = _Write(tape, list(entries), asyncio.get_running_loop().create_future())
        # A caller that stopped waiting never reads a lost record's error (logged already).
        job.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queues.setdefault(tape.name, deque()).append(job)
        if tape.name not in self._writers:
            self._writers[tape.name] = asyncio.get_running_loop().create_task(
                self._drain(tape.name), name=f"records:{tape.name}"
            )
        return job.done

    def pending(self, tape_name: str) -> bool:
        """Whether records of this tape still wait to be written."""
        return bool(self._queues.get(tape_name))

    async def settled(self, tape_name: str) -> None:
        """Wait until this tape's records written so far are on the tape (or given up)."""
        queue = self._queues.get(tape_name)
        if queue:
            with contextlib.suppress(Exception):
                await asyncio.shield(queue[-1].done)

    # -- deliveries this process started (so it knows no one else may record them) --------------
    # Keyed by a key never reused by another delivery under the same tape name (a reply's
    # delivery key includes its date, a turn's id is random): a /reset restarts the tape's ids,
    # and an id this process used before the reset must not make another's reply its own.
    def began(self, tape_name: str, key: str | None) -> None:
        """This process is about to send pieces of the delivery `key` (None: not resumable)."""
        if key is None:
            return
        self._started[(tape_name, key)] = None
        self._started.move_to_end((tape_name, key))
        while len(self._started) > STARTED_LIMIT:
            self._started.popitem(last=False)

    def began_here(self, tape_name: str, key: str) -> bool:
        """Whether this process started the delivery `key` (its records are its own)."""
        return (tape_name, key) in self._started

    # -- the writer, one per tape ----------------------------------------------------------------
    async def _drain(self, name: str) -> None:
        queue = self._queues[name]
        try:
            while queue:
                job = queue[0]
                await self._settle(job)
                queue.popleft()
        finally:
            self._writers.pop(name, None)
            while queue:  # cancelled (shutdown): whoever still waits learns it now
                left = queue.popleft()
                if not left.done.done():
                    left.done.cancel()
            self._queues.pop(name, None)

    async def _settle(self, job: _Write) -> None:
        delay = RETRY_FIRST
        while True:
            job.tries += 1
            try:
                entries = job.entries if job.tries == 1 else await self._still_needed(job)
                written = await job.tape.append_many(entries) if entries else []
            except asyncio.CancelledError:
                job.done.cancel()
                raise
            except Exception as exc:
                if time.monotonic() - job.born > self.keep_seconds:
                    log.error(
                        "record.lost session=%s entries=%d tries=%d: %s",
                        job.tape.session_id,
                        len(job.entries),
                        job.tries,
                        exc,
                    )
                    job.done.set_exception(exc)
                    return
                if job.tries == 1:
                    log.warning(
                        "record.retry session=%s entries=%d: %s",
                        job.tape.session_id,
                        len(job.entries),
                        exc,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if job.tries > 1:
                log.info(
                    "record.written session=%s entries=%d tries=%d",
                    job.tape.session_id,
                    len(written),
                    job.tries,
                )
            job.done.set_result(written)
            return

    async def _still_needed(self, job: _Write) -> list[TapeEntry]:
        """The entries of a retried write that the tape does not have yet (see the module)."""
        names = [*PIECE_RECORDS, DONE]
        recent = await job.tape.query(kinds=["event"], names=names, newest_first=True, limit=200)
        pieces = {
            (_data(e).get("reply"), _data(e).get("chunk"))
            for e in recent
            if e.payload.get("name") in PIECE_RECORDS
        }
        later_done = any(e.payload.get("name") == DONE and e.date > job.since for e in recent)
        newest_through = max(
            (int(_data(e).get("through") or 0) for e in recent if e.payload.get("name") == DONE),
            default=0,
        )
        kept: list[TapeEntry] = []
        for entry in job.entries:
            name = entry.payload.get("name") if entry.kind == "event" else None
            data = _data(entry)
            if name in PIECE_RECORDS and (data.get("reply"), data.get("chunk")) in pieces:
                continue
            if name == DONE and (later_done or int(data.get("through") or 0) <= newest_through):
                continue
            if name == SHOWN and later_done:
                continue
            kept.append(entry)
        return kept

    async def close(self, timeout: float = 5.0) -> None:
        """At shutdown: give waiting records `timeout` seconds more, then log what is lost."""
        writers = list(self._writers.values())
        if writers:
            _, still = await asyncio.wait(writers, timeout=timeout)
            lost = self.waiting
            if lost:
                log.error("record.lost_at_shutdown records=%d", lost)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=1)


def _data(entry: TapeEntry) -> dict[str, Any]:
    data = entry.payload.get("data") if entry.kind == "event" else None
    return data if isinstance(data, dict) else {}
