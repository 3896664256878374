"""The operations of both stores that are one statement (dedupe keys, a session's tapes,
jobs: tape/jobs.py), written once.

The statements come from the store's `Dialect` (tape/query.py); what differs between the
databases is only how a statement runs (`_rows`) and the two job operations whose
transaction is the point (`_insert_job`, `_claim_jobs`: a count under a lock, a claim with
writes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .entries import safe_text
from .jobs import Decide, Fired, Job, JobRow, job_row, row_job
from .query import Dialect
from .store import DedupeRecord


class Statements:
    """`is_duplicate`, `dedupe_records`, `session_tapes` and the job operations of the
    TapeStore interface, on top of a few database-specific methods."""

    dialect: Dialect

    async def _rows(self, sql: str, args: list[Any], *, write: bool = False) -> list[Any]:
        """The rows of one statement (`write`: it changes rows, in a write transaction)."""
        raise NotImplementedError

    async def _insert_job(self, row: JobRow, limit: int | None) -> bool:
        """Insert the row (with `limit`: only while its session has fewer of its kind)."""
        raise NotImplementedError

    async def _claim_jobs(
        self, now: float, decide: Decide, kinds: list[str], channels: list[str], limit: int
    ) -> list[Fired]:
        """Fire the due jobs (`Dialect.due_jobs`) in one transaction (see TapeStore)."""
        raise NotImplementedError

    async def is_duplicate(self, key: str) -> bool:
        """Whether a dedupe key has been recorded."""
        return bool(await self._rows(*self.dialect.is_duplicate(safe_text(key))))

    async def dedupe_records(self, *, after: str = "", limit: int = 1000) -> list[DedupeRecord]:
        """Recorded dedupe keys greater than `after`, in key order."""
        return [DedupeRecord(*r) for r in await self._rows(*self.dialect.dedupe(after, limit))]

    async def session_tapes(self, session_id: str) -> list[str]:
        """The live tapes of a session id (one per workspace it was used in)."""
        rows = await self._rows(*self.dialect.session_tapes(safe_text(session_id)))
        return [row[0] for row in rows]

    async def add_job(self, job: Job, *, limit: int | None = None) -> bool:
        """Store a new job (with `limit`: only while its session has fewer of its kind)."""
        return await self._insert_job(job_row(job), limit)

    async def jobs(
        self,
        *,
        session_id: str | None = None,
        kinds: Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[Job]:
        """Jobs soonest first: all, or a session's, or of `kinds`."""
        return [row_job(r) for r in await self._rows(*self.dialect.jobs(session_id, kinds, limit))]

    async def remove_job(
        self, job_id: str, *, session_id: str | None = None, kinds: Sequence[str] | None = None
    ) -> Job | None:
        """Delete a job (only a session's or of `kinds` when given); returns it."""
        sql, args = self.dialect.remove_job(job_id, session_id, kinds)
        rows = await self._rows(sql, args, write=True)
        return row_job(rows[0]) if rows else None

    async def next_due(self, *, kinds: Sequence[str], channels: Sequence[str]) -> float | None:
        """The soonest due time of the jobs of `kinds` for `channels`."""
        if not kinds or not channels:
            return None
        rows = await self._rows(*self.dialect.next_due(kinds, channels))
        return rows[0][0] if rows else None

    async def fire_jobs(
        self,
        now: float,
        decide: Decide,
        *,
        kinds: Sequence[str],
        channels: Sequence[str],
        limit: int = 100,
    ) -> list[Fired]:
        """Fire the due jobs of `kinds` for `channels` in one transaction (see TapeStore):
        on PostgreSQL, rows another replica is firing are skipped (`FOR UPDATE SKIP LOCKED`)."""
        if not kinds or not channels:
            return []
        return await self._claim_jobs(now, decide, list(kinds), list(channels), limit)
