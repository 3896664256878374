"""Background subagents: started by the `subagent` tool, run durably, and their result enters
the conversation like an inbound message (stored, deduplicated, leased), exactly once.

- **Start**: the call is stored as a job of kind `subagent` (its data is the whole call),
  due at its deadline (`BUB_SUBAGENT_TIMEOUT_SECONDS` plus a grace), counted against
  `BUB_SUBAGENT_MAX_CONCURRENT` in the same transaction, then run here under the job's lease.
- **End**: the result (or the failure) becomes a user message marked `origin: subagent` on
  the parent session's tape through `Ingress.enter`, with the dedupe key
  `subagent:<id>:result`; the session's worker answers it as a turn of its own (the model
  writes the message from the result), delivered where the parent turn's answer went. Then
  the job is removed.
- **Crash**: the job stays. On start (and every lease period, for a dead replica's) each
  stored job whose lease this process gets runs again from its prompt (its interrupted fork
  or temp tape is archived), and the result says it was restarted. A result already stored
  (the crash came after it) is not run again.
- **Watchdog**: if the job is still there at its due time (nobody could run it), the timer
  fires it: a failure message with the same dedupe key, so whichever is stored first wins.
- `/stop [id]` cancels (the conversation is told); `/status` lists what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..agent.subagent import SubagentCall, SubagentOutcome, Subagents
from ..agent.tools import ToolError
from ..config import Settings
from ..schedules.kinds import Due, Occurrence
from ..tape import TapeEntry, TapeStore, utc_now
from ..tape.jobs import Job
from ..tape.leases import LeaseKey, Leases
from .ingress import Arrival, Ingress

log = logging.getLogger("bub_bot.runtime")

KIND = "subagent"
GRACE_SECONDS = 60.0
"""After its deadline, how long a run has to report before the watchdog speaks for it."""


def result_key(subagent_id: str) -> str:
    """The dedupe key of a background subagent's one result message."""
    return f"subagent:{subagent_id}:result"


def result_entry(
    call: SubagentCall, status: str, text: str, *, restarted: bool = False
) -> TapeEntry:
    """The message a background result enters its conversation as."""
    origin = call.origin
    if status == "ok":
        head = f"[Background subagent {call.id} finished"
        tail = "Tell the person what it found."
    elif status == "stopped":
        head = f"[Background subagent {call.id} was stopped"
        tail = "Tell the person it was stopped."
    else:
        head = f"[Background subagent {call.id} failed ({status})"
        tail = "Tell the person it failed and why; nobody has its result."
    if restarted:
        head += "; it was restarted after the bot was interrupted"
    content = f"{head}. Its task: {call.prompt[:200]}]\n{text}\n\n({tail})"
    key = result_key(call.id)
    return TapeEntry.message(
        {"role": "user", "content": content},
        inbound=True,
        origin="subagent",
        channel=origin.get("channel") or "",
        reply_target=origin.get("reply_target") or {},
        sender=origin.get("sender") or {},
        delivery_key=key,
        message_id="",
        subagent=call.id,
        status=status,
    )


class SubagentWatchdog:
    """The `subagent` job kind: at its due time the run never reported; say so."""

    name = KIND

    def entry(self, job: Job, occurrence: Occurrence) -> Due:
        """A failure message (the run's own result, if stored first, wins by its key)."""
        call = SubagentCall.from_json(job.data["call"])
        text = "It did not report back in time (the bot may have been down meanwhile)."
        return Due(result_entry(call, "lost", text), (result_key(call.id),))


class BackgroundSubagents:
    """Runs background subagents and brings their results into their conversations."""

    def __init__(
        self,
        settings: Settings,
        store: TapeStore,
        subagents: Subagents,
        ingress: Ingress,
        leases: Leases,
        added: Callable[[Job], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.subagents = subagents
        self.ingress = ingress
        self.leases = leases
        self.added = added
        self.clock = clock
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    # -- what the tool calls -------------------------------------------------------------------
    async def start(self, call: SubagentCall, running_here: int) -> str:
        """Store `call` as a job and start it here (see the module docstring)."""
        conversation = call.origin.get("session_id") or call.parent_session
        limit = self.settings.subagent_max_concurrent
        job = Job(
            id=call.id,
            kind=KIND,
            session_id=conversation,
            tape=call.parent_tape,
            workspace=call.workspace,
            channel=str(call.origin.get("channel") or ""),
            due=self.clock() + self.settings.subagent_timeout_seconds + GRACE_SECONDS,
            data={"call": call.to_json(), "started": utc_now()},
            created=utc_now(),
        )
        if not await self.store.add_job(job, limit=max(limit - running_here, 0)):
            raise ToolError(
                f"this conversation runs the most subagents allowed at once"
                f" (BUB_SUBAGENT_MAX_CONCURRENT={limit}); wait for one to finish"
            )
        self.added(job)
        self._launch(job, restarted=False)
        return (
            f"Started background subagent {call.id}. Its result will come into this"
            " conversation as a new message when it is done; answer the person now."
        )

    async def running(self, session_id: str) -> int:
        """Background subagents of a conversation not finished yet (every replica's)."""
        return len(await self.store.jobs(session_id=session_id, kinds=[KIND]))

    async def listed(self, session_id: str) -> list[Job]:
        """A conversation's background subagents, for /status."""
        return await self.store.jobs(session_id=session_id, kinds=[KIND])

    async def stop(self, session_id: str, subagent_id: str | None = None) -> list[str]:
        """Cancel one (or every) background subagent of a conversation; each one's
        conversation gets a "stopped" message. Returns the ids stopped."""
        stopped = []
        for job in await self.store.jobs(session_id=session_id, kinds=[KIND]):
            if subagent_id is not None and job.id != subagent_id:
                continue
            task = self.tasks.pop(job.id, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            call = SubagentCall.from_json(job.data["call"])
            await self._report(job, call, "stopped", "Stopped on request (/stop).")
            stopped.append(job.id)
        return stopped

    # -- lifecycle -----------------------------------------------------------------------------
    async def resume(self) -> int:
        """Run every stored job whose lease this process gets and that is not running here
        (after a crash or a dead replica); returns how many were started."""
        started = 0
        for job in await self.store.jobs(kinds=[KIND]):
            if job.id in self.tasks:
                continue
            if await self.leases.acquire(LeaseKey.job(f"{KIND}:{job.id}")):
                self._launch(job, restarted=True)
                started += 1
        if started:
            log.info("subagent.resume jobs=%d", started)
        return started

    def start_sweeping(self) -> None:
        """Resume now and, with several replicas, every lease period (a dead one's jobs)."""

        async def sweep() -> None:
            while True:
                try:
                    await self.resume()
                except Exception as exc:  # a database hiccup: try at the next period
                    log.warning("subagent.sweep_failed: %s", exc)
                if not self.leases.shared:
                    return
                await asyncio.sleep(self.settings.lease_seconds)

        self._sweeper = asyncio.get_running_loop().create_task(sweep(), name="subagent-sweep")

    async def close(self) -> None:
        """Cancel the runs here; their jobs stay and run again on the next start."""
        tasks = [t for t in [self._sweeper, *self.tasks.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()

    # -- running -------------------------------------------------------------------------------
    def _launch(self, job: Job, *, restarted: bool) -> None:
        task = asyncio.get_running_loop().create_task(
            self._drive(job, restarted), name=f"subagent-{job.id}"
        )
        self.tasks[job.id] = task
        task.add_done_callback(lambda _: self._forget(job.id, task))

    def _forget(self, job_id: str, task: asyncio.Task[None]) -> None:
        if self.tasks.get(job_id) is task:
            del self.tasks[job_id]

    async def _drive(self, job: Job, restarted: bool) -> None:
        key = LeaseKey.job(f"{KIND}:{job.id}")
        if not await self.leases.acquire(key):
            return  # another replica runs it
        keeper = asyncio.get_running_loop().create_task(self._keep(key))
        try:
            call = SubagentCall.from_json(job.data["call"])
            if await self.store.is_duplicate(result_key(call.id)):
                await self.store.remove_job(job.id)  # its result is in: the crash came after
                return
            left = job.due - GRACE_SECONDS - self.clock()
            outcome: SubagentOutcome = await self.subagents.run(
                self.store, call, restarted=restarted, seconds=max(left, 0.001)
            )
            await self._report(job, call, outcome.status, outcome.text, restarted=restarted)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("subagent.background_failed session=%s id=%s", job.session_id, job.id)
            with contextlib.suppress(Exception):
                call = SubagentCall.from_json(job.data["call"])
                await self._report(job, call, "error", f"{type(exc).__name__}: {exc}")
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            with contextlib.suppress(Exception):
                await self.leases.release(key)

    async def _keep(self, key: LeaseKey) -> None:
        if not self.leases.shared:
            return
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            with contextlib.suppress(Exception):
                await self.leases.renew([key])

    async def _report(
        self, job: Job, call: SubagentCall, status: str, text: str, *, restarted: bool = False
    ) -> None:
        """The result into the conversation (once: its key), then the job is done."""
        entry = result_entry(call, status, text, restarted=restarted)
        arrival = Arrival(
            session_id=job.session_id,
            workspace=Path(job.workspace),
            channel=job.channel or "subagent",
            entry=entry,
            keys=(result_key(call.id),),
        )
        received = await self.ingress.enter(arrival)
        await self.store.remove_job(job.id)
        log.info(
            "subagent.reported session=%s id=%s status=%s new=%s",
            job.session_id,
            call.id,
            status,
            received.new,
        )


def status_lines(jobs: list[Job]) -> list[str]:
    """/status lines for running background subagents."""
    lines = []
    for job in jobs:
        call: dict[str, Any] = job.data.get("call", {})
        prompt = str(call.get("prompt", ""))
        short = prompt if len(prompt) <= 60 else prompt[:57] + "…"
        lines.append(f"• {job.id} ({call.get('session', 'temp')}): {short}")
    return lines
