"""The `schedule.*` tools: the model adds, lists and removes this conversation's prompt jobs
(`bub_bot/schedules`). A job fires into the conversation whose turn created it; the model
sees and removes only that conversation's `prompt` jobs."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from ..schedules.book import Place, ScheduleBook, job_summary
from ..schedules.times import ScheduleError
from .tools import ToolContext, ToolError, ToolRegistry


def _place(ctx: ToolContext) -> Place:
    origin = ctx.origin
    return Place(
        session_id=origin.session_id or ctx.tape.session_id or "",
        tape=ctx.tape.name,
        workspace=str(ctx.workspace),
        channel=origin.channel,
        reply_target=origin.reply_target,
        sender=origin.sender,
        scheduled=origin.via == "schedule",
    )


def register_schedule_tools(registry: ToolRegistry, book: ScheduleBook) -> None:
    """Add schedule.add, schedule.list and schedule.remove to `registry`, using `book`."""

    @registry.tool("schedule.add")
    async def schedule_add(
        ctx: ToolContext,
        prompt: Annotated[str, Field(description="What to do at the time, as an instruction")],
        at: Annotated[
            str | None,
            Field(description="ISO 8601 time, e.g. 2030-05-01T09:00:00+02:00 (no offset: tz)"),
        ] = None,
        in_seconds: Annotated[float | None, Field(description="Seconds from now")] = None,
        cron: Annotated[
            str | None,
            Field(description="Five-field cron (minute hour day month weekday), repeating"),
        ] = None,
        tz: Annotated[
            str | None, Field(description="IANA time zone, e.g. Europe/Berlin (default: the bot's)")
        ] = None,
    ) -> dict[str, Any]:
        """Schedule work in this conversation: at the time, `prompt` comes back to you as a
        scheduled message here and your answer is posted in this chat. Give exactly one of
        `at` (once), `in_seconds` (once, from now) or `cron` (repeating; e.g. "0 9 * * 1-5"
        is 09:00 on weekdays in `tz`). Returns the job's id and next run."""
        try:
            job = await book.add(
                _place(ctx), prompt, at=at, in_seconds=in_seconds, cron=cron, tz=tz
            )
        except ScheduleError as exc:
            raise ToolError(f"{exc}; nothing was scheduled") from None
        return job_summary(job)

    @registry.tool("schedule.list")
    async def schedule_list(ctx: ToolContext) -> dict[str, Any]:
        """This conversation's scheduled jobs, soonest first, with their ids and next runs."""
        jobs = await book.list(_place(ctx).session_id)
        return {"jobs": [job_summary(job) for job in jobs]}

    @registry.tool("schedule.remove")
    async def schedule_remove(
        ctx: ToolContext, id: Annotated[str, Field(description="The job's id")]
    ) -> dict[str, Any]:
        """Remove one of this conversation's scheduled jobs by its id."""
        removed = await book.remove(_place(ctx).session_id, id)
        if removed is None:
            raise ToolError(f"this conversation has no scheduled job {id!r} (see schedule.list)")
        return {"removed": job_summary(removed)}
