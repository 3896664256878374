"""Jobs: durable timers, rows in the tape database (`jobs` in SQLite, `bub_jobs` in PostgreSQL).

A job says: at `due`, something enters session `session_id` (its tape `tape`, started in
`workspace`), for a replica that runs `channel`. What enters is decided by the job's `kind`
when it is due (`bub_bot/schedules/kinds.py`); this layer only stores rows and fires them:

- `TapeStore.fire_jobs(now, decide, …)` claims the due rows of the given kinds and channels
  (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so replicas firing at once take disjoint rows) and,
  in the same transaction, for each one writes the entry `decide(job)` makes on the job's
  tape with its dedupe keys (and the bootstrap anchor on a new tape), then moves the job to
  its next due time or deletes it. A due time therefore fires once: a crash before the commit
  fires it on the next start, a crash after it does not fire it again, and the dedupe keys
  (the timer's include the job id and the due time) make a second write impossible even if
  two transactions got that far.
- `decide` runs inside the transaction (on SQLite's database thread): it computes, never
  waits or does I/O, and should not raise (a job it fails on is finished without an entry).

`due` is UNIX seconds (UTC); `cron`/`tz` are the job's schedule as given (None: once);
`data` is the kind's own (JSON); `fired` counts the times it fired.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .entries import TapeEntry, dumps, safe_text


@dataclass(frozen=True, slots=True)
class Job:
    """A durable timer: at `due`, its kind makes an entry for session `session_id`."""

    id: str
    kind: str
    session_id: str
    tape: str
    workspace: str
    channel: str
    due: float
    cron: str | None = None
    tz: str = "UTC"
    data: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    fired: int = 0


@dataclass(frozen=True, slots=True)
class Firing:
    """What one due job does in the claiming transaction: write `entry` (None: nothing) with
    `keys` and `bootstrap` (the anchor a new tape starts with), then move to `next_due`
    (None: the job is finished and deleted)."""

    entry: TapeEntry | None
    keys: tuple[str, ...] = ()
    bootstrap: TapeEntry | None = None
    next_due: float | None = None


@dataclass(frozen=True, slots=True)
class Fired:
    """A job the transaction fired: what it decided, and its entry as written (with its id;
    None when there was none, or a dedupe key was recorded already)."""

    job: Job
    firing: Firing
    entry: TapeEntry | None


Decide = Callable[[Job], Firing]

JobRow = tuple[str, str, str, str, str, str, float, str | None, str, str, str, int]
"""A job as stored: id, kind, session_id, tape, workspace, channel, due, cron, tz, data,
created, fired."""

COLUMNS = "id, kind, session_id, tape, workspace, channel, due, cron, tz, data, created, fired"


def job_row(job: Job) -> JobRow:
    """A job as a stored row; fails (PayloadError) before any write."""
    return (
        safe_text(job.id),
        safe_text(job.kind),
        safe_text(job.session_id),
        job.tape,
        safe_text(job.workspace),
        safe_text(job.channel),
        float(job.due),
        safe_text(job.cron) if job.cron is not None else None,
        safe_text(job.tz),
        dumps(job.data, "job data"),
        job.created,
        job.fired,
    )


def row_job(row: Any) -> Job:
    """A stored row back as a job."""
    id_, kind, session_id, tape, workspace, channel, due, cron, tz, data, created, fired = row
    return Job(
        id_,
        kind,
        session_id,
        tape,
        workspace,
        channel,
        float(due),
        cron,
        tz,
        json.loads(data),
        created,
        int(fired),
    )
