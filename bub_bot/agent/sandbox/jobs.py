"""Background commands: each belongs to the session (tape) that started it and is recorded on
that tape (`bash.job` events: started, then how it ended). Output is kept in memory while the
bot runs; after a restart the tape still says what happened (stopped by the restart)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .run import Outcome, Running

if TYPE_CHECKING:
    from ...tape import Tape

log = logging.getLogger("bub_bot.sandbox")

JOB_EVENT = "bash.job"
KEEP_FINISHED = 200
"""Finished jobs kept in memory (their output readable); older ones answer from the tape."""
TAIL_ON_TAPE = 2000
"""Characters of a finished job's output recorded on the tape (the end of it)."""


@dataclass
class Job:
    """One background command."""

    id: str
    tape: Tape
    session_id: str
    cmd: str
    running: Running
    started: float = field(default_factory=time.time)
    buffer: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    state: str = "running"
    exit_code: int | None = None
    task: asyncio.Task[Any] | None = None

    def summary(self) -> dict[str, Any]:
        """What /status and the model see of it."""
        found: dict[str, Any] = {"job_id": self.id, "state": self.state, "cmd": self.cmd[:200]}
        if self.exit_code is not None:
            found["exit_code"] = self.exit_code
        found["seconds"] = round(time.time() - self.started, 1)
        return found


class JobTable:
    """The running and finished background jobs of this process, by id."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self.jobs: dict[str, Job] = {}

    def _prune(self) -> None:
        finished = [j for j in self.jobs.values() if j.state != "running"]
        for job in finished[: max(len(finished) - KEEP_FINISHED, 0)]:
            del self.jobs[job.id]

    def of(self, tape_name: str) -> list[Job]:
        """The jobs of one tape (session), oldest first."""
        return [j for j in self.jobs.values() if j.tape.name == tape_name]

    def running(self, tape_name: str) -> int:
        return sum(1 for j in self.of(tape_name) if j.state == "running")

    async def add(
        self, tape: Tape, session_id: str, cmd: str, running: Running, timeout: float
    ) -> Job:
        """Record a started job on its tape and follow it to its end."""
        job = Job(secrets.token_hex(6), tape, session_id, cmd, running)
        self._prune()
        self.jobs[job.id] = job

        def keep(data: bytes) -> None:
            room = self.keep_bytes - len(job.buffer)
            if room > 0:
                job.buffer += data[:room]
            job.dropped += max(len(data) - max(room, 0), 0)

        running.on_output = keep
        await tape.append(_event(job, "running"))
        job.task = asyncio.create_task(self._follow(job, timeout))
        log.info("bash.job.start session=%s job=%s", session_id, job.id)
        return job

    async def _follow(self, job: Job, timeout: float) -> None:
        try:
            outcome = await job.running.wait(timeout)
        except asyncio.CancelledError:
            job.state = "stopped_by_shutdown"
            await _record_end(job, None)
            raise
        if job.state == "running":
            job.state = "timed_out" if outcome.timed_out else "exited"
        job.exit_code = outcome.exit_code
        await _record_end(job, outcome)

    async def kill(self, job: Job, state: str = "killed") -> None:
        """Stop a job and its whole tree; its end is recorded by the follower."""
        if job.state == "running":
            job.state = state
            await job.running.kill()
        if job.task is not None:
            await asyncio.gather(job.task, return_exceptions=True)

    async def close(self) -> None:
        """Shutdown: kill every running job, recorded on its tape as stopped by the shutdown."""
        running = [j for j in self.jobs.values() if j.state == "running"]
        await asyncio.gather(*(self.kill(j, "stopped_by_shutdown") for j in running))


def _event(job: Job, state: str, **data: Any) -> Any:
    from ...tape import TapeEntry

    payload = {"job_id": job.id, "cmd": job.cmd, "state": state, **data}
    return TapeEntry.event(JOB_EVENT, payload, context=False)


async def _record_end(job: Job, outcome: Outcome | None) -> None:
    text = job.buffer.decode("utf-8", "replace")
    data: dict[str, Any] = {"output_tail": text[-TAIL_ON_TAPE:], "output_bytes": len(job.buffer)}
    if outcome is not None:
        data["exit_code"] = outcome.exit_code
    try:
        await job.tape.append(_event(job, job.state, **data))
    except Exception:  # the store may be closing: the log still has it
        log.exception("bash.job.record_failed session=%s job=%s", job.session_id, job.id)
    log.info(
        "bash.job.end session=%s job=%s state=%s exit=%s",
        job.session_id,
        job.id,
        job.state,
        job.exit_code,
    )


async def recorded(tape: Tape, job_id: str) -> dict[str, Any] | None:
    """The newest `bash.job` record of `job_id` on `tape` (a job of an earlier process)."""
    found = await tape.query(kinds=["event"], names=[JOB_EVENT], newest_first=True, limit=500)
    for entry in found:
        data = entry.payload.get("data") or {}
        if data.get("job_id") == job_id:
            return dict(data)
    return None
