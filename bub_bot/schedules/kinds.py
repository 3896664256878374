"""Kinds of job: what a durable timer does when it is due.

The timer (`bub_bot/runtime/timer.py`) fires every job the same way: it claims the job in
the database, works out which due time this firing stands for (`Occurrence`: a recurring job
that missed several runs while the bot was down runs once, for the latest), asks the job's
kind for the entry, writes it on the job's session tape with the dedupe key
`job:<id>:<due time>` in the transaction that advances the job, and wakes the session the
way an inbound message does (its lease decides which replica runs it). The timer knows
nothing else about a kind.

A kind plugs in with three things:

1. **A name** (`JobKind.name`, the row's `kind`), registered on the runtime
   (`runtime.timer.kinds[name] = kind`). A replica fires only the kinds it knows, so a
   replica of an older release leaves a newer kind's jobs alone during a rolling deploy.
2. **What it stores**: a `Job` row (`bub_bot/tape/jobs.py`) with the session, its tape and
   workspace, the channel (only a replica running it fires the job), the due time, a cron
   expression and zone for a recurring job, and `data`, the kind's own JSON (a prompt; an
   approval request's id and where to tell the people). Add it with `store.add_job(job)`,
   then `runtime.timer.added(job)` so every replica's timer looks again.
3. **The entry it makes when due** (`JobKind.entry`): an inbound entry the session worker
   handles like a message (`meta.inbound`, a user message or a command event) or a reply
   that carries its own `channel`/`reply_target` (delivered as it is, no model call), plus
   extra dedupe keys. It runs inside the claiming transaction: compute only, no I/O.
   A kind that must not fire once something else happened shares a dedupe key with that
   thing. An approval's expiry ("at T, if the request is still open, an expiry enters the
   session") is a one-off job whose entry is the `approval.decision` event `expired` with
   the key `approval:<id>:decision` that a person's click records too: whichever is stored
   first wins, and the other is a duplicate that writes nothing (the job still finishes).

The model lists and removes only the kinds it may (`schedule.*` tools: `prompt` jobs of its
own conversation); other kinds are the runtime's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..tape.entries import TapeEntry
from ..tape.jobs import Job
from .times import utc_iso


def job_key(job_id: str, due: float) -> str:
    """The dedupe key the timer gives every firing: one due time of a job fires once."""
    return f"job:{job_id}:{utc_iso(due)}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One firing of a job: the due time it stands for, when it fires, and what else."""

    due: float
    """The due time this firing is for (a recurring job after downtime: the latest passed)."""
    now: float
    """When it fires."""
    missed: int = 0
    """Earlier due times of a recurring job folded into this firing (the bot was down)."""
    next_due: float | None = None
    """When the job is due again (None: it is finished)."""

    @property
    def late(self) -> float:
        """Seconds after its due time that it fires."""
        return max(0.0, self.now - self.due)


@dataclass(frozen=True, slots=True)
class Due:
    """What a kind makes of an occurrence: the entry (None: nothing enters the session) and
    dedupe keys of its own besides the timer's `job:<id>:<due>`."""

    entry: TapeEntry | None
    keys: tuple[str, ...] = ()


class JobKind(Protocol):
    """A kind of job (see the module docstring)."""

    name: str

    def entry(self, job: Job, occurrence: Occurrence) -> Due:
        """The entry `job` makes for `occurrence`; runs in the claiming transaction."""
        ...
