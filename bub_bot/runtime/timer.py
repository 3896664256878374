"""The timer: fires due jobs (durable timers, `bub_bot/tape/jobs.py`) into their sessions.

It sleeps until the soonest due time of the jobs it may fire (the kinds it knows, for the
channels this process runs), and is woken early when a job is added here or on another
replica (a broadcast: NOTIFY on PostgreSQL). When jobs are due it fires them in batches: one
store transaction claims a batch (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so replicas firing at
once split the work and none fires a due time twice), writes each job's entry on its session
tape with the dedupe key `job:<id>:<due time>` (and the bootstrap anchor on a new tape), and
advances or deletes each job. Only then are the sessions woken, the way an inbound message
wakes its session (`Ingress.wake`): the session's lease decides which replica runs the turn.

What enters a session is each kind's business (`bub_bot/schedules/kinds.py`); the timer
works out the occurrence: a recurring job that missed several due times (the bot was down)
runs once, for the latest of them, and goes on at its next time after now.

A lost wake-up notice (a replica's listener reconnecting) costs at most `SAFETY_SECONDS`:
the timer looks at the table that often even when nothing is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..schedules.kinds import JobKind, Occurrence, job_key
from ..schedules.times import Schedule, utc_iso
from ..tape import Tape, TapeStore
from ..tape.jobs import Fired, Firing, Job
from .ingress import Ingress
from .replicas import Replicas

log = logging.getLogger("bub_bot.runtime")

TOPIC = "jobs"
"""The broadcast topic of "a job was added" (the data is its due time)."""
BATCH = 100
"""Jobs per claiming transaction."""
SAFETY_SECONDS = 60.0
"""The longest the timer sleeps without looking (a lost notice from another replica)."""
RETRY_SECONDS = 5.0
"""After a database error."""


class Timer:
    """Fires the due jobs of the kinds it knows, for the channels this process runs."""

    def __init__(
        self,
        store: TapeStore,
        ingress: Ingress,
        replicas: Replicas,
        channels: Callable[[], list[str]],
        clock: Callable[[], float] = time.time,
        emit: Callable[..., None] | None = None,
        batch: int = BATCH,
    ) -> None:
        self.store = store
        self.ingress = ingress
        self.replicas = replicas
        self.channels = channels
        self.clock = clock
        self.batch = batch
        self.kinds: dict[str, JobKind] = {}
        """The kinds this timer fires, by name (`bub_bot/schedules/kinds.py`)."""
        self._emit = emit or (lambda event, **data: None)
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waking: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Begin firing (and hear other replicas' new jobs)."""
        if self._task is not None:
            return
        self.replicas.subscribe(TOPIC, lambda data: self.poke())
        self._task = asyncio.get_running_loop().create_task(self._run(), name="timer")

    async def stop(self) -> None:
        """Stop firing; sessions being woken finish waking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._waking:
            await asyncio.gather(*self._waking, return_exceptions=True)

    def poke(self) -> None:
        """Look at the jobs again now (one was added, or the clock moved)."""
        self._poked.set()

    def added(self, job: Job) -> None:
        """A job was stored: look again here, and tell the other replicas."""
        self.poke()
        if self.replicas.shared:
            task = asyncio.get_running_loop().create_task(
                self.replicas.broadcast(TOPIC, repr(job.due)), name="timer-broadcast"
            )
            self._waking.add(task)
            task.add_done_callback(self._waking.discard)

    # -- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._poked.clear()  # before looking: a job added meanwhile pokes again
            wait = SAFETY_SECONDS
            try:
                await self.fire_due()
                due = await self.store.next_due(kinds=list(self.kinds), channels=self.channels())
                if due is not None:
                    # A hair past the due time, so the look finds it due.
                    wait = min(max(due - self.clock(), 0.0) + 0.001, SAFETY_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("timer.failed: %s", exc)
                wait = RETRY_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), wait)

    async def fire_due(self) -> list[Fired]:
        """Fire every job due now, a batch per transaction; then wake their sessions (after
        the last batch: turns starting meanwhile would slow the firing of the rest)."""
        everything: list[Fired] = []
        try:
            while True:
                now = self.clock()
                fired = await self.store.fire_jobs(
                    now,
                    partial(self._decide, now=now),
                    kinds=list(self.kinds),
                    channels=self.channels(),
                    limit=self.batch,
                )
                committed = self.clock()
                for item in fired:
                    self._fired(item, committed)
                everything += fired
                if len(fired) < self.batch:
                    return everything
        finally:
            self._wake(everything)  # also what was fired before a failure

    def _decide(self, job: Job, now: float) -> Firing:
        """What `job` does now (in the claiming transaction: compute only). A job that
        cannot be worked out is finished without an entry rather than retried forever."""
        try:
            schedule = Schedule(tz=job.tz, cron=job.cron)
            due, missed, following = schedule.catch_up(job.due, now)
            occurrence = Occurrence(due, now, missed, following)
            made = self.kinds[job.kind].entry(job, occurrence)
            keys = (job_key(job.id, due), *made.keys)
            bootstrap = Tape.bootstrap_anchor(Path(job.workspace))
            return Firing(made.entry, keys, bootstrap, following)
        except Exception:
            log.exception("job.failed session=%s job=%s kind=%s", job.session_id, job.id, job.kind)
            return Firing(None)

    def _fired(self, item: Fired, committed: float) -> None:
        job, entry = item.job, item.entry
        delay = committed - job.due
        outcome = "fired" if entry is not None else "skipped"
        if entry is not None and entry.kind != "message":
            outcome = "noted"
        log.info(
            "job.%s session=%s job=%s kind=%s due=%s delay_ms=%.0f%s",
            outcome,
            job.session_id,
            job.id,
            job.kind,
            entry.meta.get("due", utc_iso(job.due)) if entry is not None else utc_iso(job.due),
            delay * 1000,
            f" entry={entry.id}" if entry is not None else "",
        )
        self._emit("job", kind=job.kind, outcome=outcome, delay=delay)

    def _wake(self, fired: list[Fired]) -> None:
        """Wake the sessions that got an entry (in the background: the next batch goes on)."""
        woken = [f for f in fired if f.entry is not None]
        if not woken:
            return

        async def wake_all() -> None:
            results = await asyncio.gather(
                *(
                    self.ingress.wake(f.job.session_id, Path(f.job.workspace), f.entry)
                    for f in woken
                    if f.entry is not None
                ),
                return_exceptions=True,
            )
            for item, result in zip(woken, results, strict=True):
                if isinstance(result, Exception):
                    # Stored all the same: the session's waiting lease (or a restart) runs it.
                    log.warning("job.wake_failed session=%s: %s", item.job.session_id, result)

        task = asyncio.get_running_loop().create_task(wake_all(), name="timer-wake")
        self._waking.add(task)
        task.add_done_callback(self._waking.discard)
