"""A conversation's prompt jobs: adding one (checked, within the operator's limits), listing
and removing them. The `schedule.*` tools and the `/schedules` and `/unschedule` commands
both use it; it sees `prompt` jobs of the conversation it is asked about, nothing else."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..tape.entries import utc_now
from ..tape.jobs import Job
from .prompts import PROMPT
from .times import Schedule, ScheduleError, local_time, parse_schedule, span, utc_iso

if TYPE_CHECKING:
    from ..config import Settings
    from ..tape.store import TapeStore

log = logging.getLogger("bub_bot.schedules")

MAX_PROMPT = 4000
"""Characters of a job's prompt."""


@dataclass(frozen=True, slots=True)
class Place:
    """The conversation a job belongs to and posts into: the turn that creates it."""

    session_id: str
    tape: str
    workspace: str
    channel: str
    reply_target: dict[str, Any] = field(default_factory=dict)
    sender: dict[str, Any] = field(default_factory=dict)
    scheduled: bool = False
    """That turn is itself a job's: a one-off job it makes must be as far ahead as a
    recurring job's runs are apart (no chain of jobs firing each other every second)."""


class ScheduleBook:
    """Adds, lists and removes the prompt jobs of a conversation."""

    def __init__(
        self, store: TapeStore, settings: Settings, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.added: Callable[[Job], None] = lambda job: None
        """Called with each new job (the runtime wakes the timers of every replica)."""

    async def add(
        self,
        place: Place,
        prompt: str,
        *,
        at: str | None = None,
        in_seconds: float | None = None,
        cron: str | None = None,
        tz: str | None = None,
    ) -> Job:
        """Check and store a job; ScheduleError says what is wrong (nothing is stored)."""
        settings = self.settings
        if not place.session_id or not place.channel:
            raise ScheduleError("this turn has no conversation to post into")
        prompt = prompt.strip()
        if not prompt:
            raise ScheduleError("prompt is empty: say what should happen at the time")
        if len(prompt) > MAX_PROMPT:
            raise ScheduleError(f"prompt has {len(prompt)} characters; at most {MAX_PROMPT}")
        limit = settings.schedule_max_per_session
        if limit == 0:
            raise ScheduleError("scheduled jobs are turned off on this bot")
        now = self.clock()
        gap = settings.schedule_min_interval_seconds
        schedule, due = parse_schedule(
            at=at,
            in_seconds=in_seconds,
            cron=cron,
            tz=tz,
            now=now,
            default_tz=settings.timezone,
            min_interval=gap,
        )
        if place.scheduled and not schedule.recurring and due - now < gap:
            raise ScheduleError(
                f"a scheduled run may schedule a one-off job at least {span(gap)} ahead"
                f" (this one is {span(due - now)} ahead)"
            )
        job = Job(
            id=secrets.token_hex(4),
            kind=PROMPT,
            session_id=place.session_id,
            tape=place.tape,
            workspace=place.workspace,
            channel=place.channel,
            due=due,
            cron=schedule.cron,
            tz=schedule.tz,
            data={"prompt": prompt, "reply_target": place.reply_target, "sender": place.sender},
            created=utc_now(),
        )
        if not await self.store.add_job(job, limit=limit):
            raise ScheduleError(
                f"this conversation has {limit} scheduled jobs already (the most it may have);"
                " remove one first"
            )
        log.info(
            "schedule.added session=%s job=%s due=%s cron=%s",
            place.session_id,
            job.id,
            utc_iso(due),
            job.cron or "-",
        )
        self.added(job)
        return job

    async def list(self, session_id: str) -> list[Job]:
        """The conversation's prompt jobs, soonest first."""
        return await self.store.jobs(session_id=session_id, kinds=[PROMPT])

    async def remove(self, session_id: str, job_id: str) -> Job | None:
        """Remove one of the conversation's prompt jobs; None: it has no such job."""
        removed = await self.store.remove_job(job_id.strip(), session_id=session_id, kinds=[PROMPT])
        if removed is not None:
            log.info("schedule.removed session=%s job=%s", session_id, removed.id)
        return removed


def job_summary(job: Job) -> dict[str, Any]:
    """A job as the tools and the viewer show it."""
    schedule = Schedule(tz=job.tz, cron=job.cron)
    return {
        "id": job.id,
        "prompt": job.data.get("prompt", ""),
        "schedule": schedule.describe(),
        "tz": job.tz,
        "next_run": local_time(job.due, job.tz),
        "next_run_utc": utc_iso(job.due),
        "runs_so_far": job.fired,
    }


def jobs_text(jobs: list[Job]) -> str:
    """The /schedules reply."""
    if not jobs:
        return "No scheduled jobs in this conversation."
    lines = [f"Scheduled jobs ({len(jobs)}), next run in each job's time zone:"]
    for job in jobs:
        summary = job_summary(job)
        prompt = summary["prompt"]
        if len(prompt) > 80:
            prompt = prompt[:79] + "…"
        lines.append(f"- {job.id}: {summary['next_run']} — {summary['schedule']} — {prompt}")
    lines.append("Remove one with /unschedule <id>.")
    return "\n".join(lines)
