"""The Runtime: builds the runtime's parts and is what channels, the server and the CLI call
(`receive`, `start`, `resume`, `shutdown`, a session's tape, leadership and broadcasts)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from channels.base import ApprovalClick, Channel, Inbound, Received

from ..agent import Agent
from ..agent.subagent import Subagents
from ..approvals.expiry import ExpiryKind
from ..budgets import Budgets
from ..config import Settings
from ..schedules.book import ScheduleBook
from ..schedules.prompts import PromptKind
from ..tape import Tape, TapeStore
from .approvals import ApprovalDesk
from .command_runner import CommandRunner
from .delivery import Delivery
from .ingress import Ingress, inbound_arrival
from .leases import Leadership, LeaseKeeper, Leases, LocalLeases
from .observers import Observers
from .placement import MOVED_TOPIC, Placement
from .recovery import Recovery
from .resume import resume_sessions
from .session import Sessions
from .subagents import BackgroundSubagents, SubagentWatchdog
from .timer import Timer
from .turns import TurnRunner
from .worker import SessionWorker

log = logging.getLogger("bub_bot.runtime")


class Runtime:
    """Sessions, ordering, delivery and resume; knows channels only through their contract."""

    def __init__(
        self,
        settings: Settings,
        store: TapeStore,
        agent: Agent,
        channels: dict[str, Channel] | None = None,
        leases: Leases | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        """UNIX seconds now: when jobs are due (tests move it instead of waiting)."""
        self.observers = Observers()
        """Called with (event, data) for metrics: inbound, turn, reply, lease, ..."""
        emit = self.observers.emit
        self.leases: Leases = leases or LocalLeases()
        self.lease_keeper = LeaseKeeper(self.leases, settings.lease_seconds, emit)
        self.store = store
        self.agent = agent
        self.channels: dict[str, Channel] = dict(channels or {})
        self.budgets = Budgets.for_settings(store, settings, clock)
        """Rate limits and budgets (bub_bot/budgets): counters in the store."""
        agent.budgets = self.budgets
        self.sessions = Sessions(store, settings.workspace)
        self.placement = Placement(settings, store, shared=self.leases.shared)
        # A takeover waits a lease period for the record of a piece its sender may have sent.
        wait = settings.lease_seconds if self.leases.shared else 0.0
        self.delivery = Delivery(self.channels, emit, settings, takeover_wait=wait)
        self.schedules = ScheduleBook(store, settings, clock)
        """A conversation's prompt jobs (the `schedule.*` tools, /schedules)."""
        self.commands = CommandRunner(
            settings, agent, self.delivery, emit, schedules=self.schedules
        )
        slots = asyncio.Semaphore(settings.max_concurrent_turns)
        self.turns = TurnRunner(settings, store, agent, self.channels, self.delivery, slots, emit)
        self.worker = SessionWorker(
            self.sessions,
            self.placement,
            self.lease_keeper,
            self.channels,
            Recovery(settings, self.delivery),
            self.commands,
            self.turns,
            slots,
            emit,
        )
        self.replicas = self.worker.replicas
        # Moves recorded on one replica are heard by the others at once (placement.py).
        self.placement.announce = self.replicas.broadcast
        self.replicas.subscribe(MOVED_TOPIC, self.placement.heard_move)
        self.ingress = Ingress(
            store, self.placement, self.sessions, self.replicas, emit, self.budgets
        )
        self.timer = Timer(
            store, self.ingress, self.replicas, partial(list, self.channels), clock, emit
        )
        """Fires due jobs into their sessions (runtime/timer.py); kinds register on it."""
        prompts = PromptKind(settings.schedule_grace_seconds, settings.schedule_drop_seconds)
        self.timer.kinds[prompts.name] = prompts
        self.schedules.added = self.timer.added
        expiry = ExpiryKind()
        self.timer.kinds[expiry.name] = expiry
        self.approvals = ApprovalDesk(
            store, agent, self.ingress, self.placement, self.timer.added, clock
        )
        """Approval decisions (presses, /approve, /deny) and request expiry jobs."""
        self.subagents = Subagents(agent)
        """Subagent runs (the `subagent` tool, registered by whoever builds the tools)."""
        self.background = BackgroundSubagents(
            settings, store, self.subagents, self.ingress, self.leases, self.timer.added, clock
        )
        self.subagents.background = self.background
        self.commands.background = self.background
        watchdog = SubagentWatchdog()
        self.timer.kinds[watchdog.name] = watchdog

    # -- observation ---------------------------------------------------------------------------
    @property
    def running_turns(self) -> int:
        return self.sessions.running

    @property
    def last_inbound(self) -> dict[str, float]:
        """Channel -> when a message last arrived from it (monotonic)."""
        return self.ingress.last_inbound

    def note_inbound(self, channel: str, outcome: str) -> None:
        """Count a platform message a channel did not store ("ignored" or "denied")."""
        self.observers.emit("inbound", channel=channel, outcome=outcome)

    # -- ingress -------------------------------------------------------------------------------
    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel

    async def receive(self, inbound: Inbound) -> Received:
        """Store an inbound message durably (deduplicated) and schedule its session's work.

        Returns once the message is on disk (with several replicas: and its session's lease
        was tried, see leases.py); a re-delivery returns `Received(new=False)` and changes
        nothing. The way on: `ingress` -> `worker` -> `turns` or `command_runner` ->
        `delivery`.
        """
        if "/approve" in inbound.text or "/deny" in inbound.text:
            outcome = await self.approvals.command(inbound)
            if outcome in ("approve", "deny"):
                return Received(new=True)
        return await self.ingress.enter(inbound_arrival(inbound))

    async def decide(self, click: ApprovalClick) -> str:
        """Store a press of an approval request's button (see `channels.base.Approvals`)."""
        return await self.approvals.decide(click)

    async def wait_idle(self, session_id: str, timeout: float | None = None) -> None:
        """Wait until the session has no work (for `bub-bot run`, tests and shutdown)."""
        session = self.sessions.get(session_id)
        if session is not None:
            await asyncio.wait_for(session.idle.wait(), timeout)

    # -- where sessions live -------------------------------------------------------------------
    async def session_known(self, session_id: str, workspace: Path | None = None) -> bool:
        """Whether this session's tape has anything on it (e.g. the bot answered there)."""
        tape = await self.session_tape(session_id, workspace)
        return bool(await self.store.query(tape.name, limit=1))

    async def session_tape(self, session_id: str, workspace: Path | None = None) -> Tape:
        """The tape `receive` stores this session's messages on (its workspace's, or the one
        it continues after a move), for channels that read a conversation back. Only looks:
        a session not seen yet gets no workspace decided or directory created."""
        return await self.placement.session_tape(session_id, workspace)

    async def tape_workspace(self, tape: Tape) -> Path:
        """The workspace a tape's session works in: the one its `session/start` anchor
        recorded (else BUB_WORKSPACE), as a resumed session does."""
        return await self.placement.recorded_workspace(tape)

    async def move_session(self, old: str, new: str, workspace: Path | None = None) -> None:
        """From now on, messages for session `new` continue the tape of `old` (a Telegram
        group that became a supergroup has a new chat id but is the same conversation);
        recorded on the tapes, so it survives restarts and holds on every replica."""
        await self.placement.move(old, new, workspace)

    # -- replicas (several processes on one database: replicas.py, leases.py) ------------------
    def leader(self, name: str) -> Leadership:
        """Leadership of job `name` across replicas (see `channels.base.Leadership`)."""
        return self.replicas.leader(name)

    async def broadcast(self, topic: str, data: str) -> None:
        """Tell the other replicas on this database `data` under `topic` (see
        `channels.base.RuntimeLike.broadcast`); best effort: a failure is logged, not raised."""
        await self.replicas.broadcast(topic, data)

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        """Call `callback(data)` for every broadcast of `topic` by another replica."""
        self.replicas.subscribe(topic, callback)

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Begin serving: with shared leases, take handovers and sweep for lapsed leases;
        then resume every session with unfinished work, and fire due jobs from now on."""
        await self.replicas.start()
        await self.resume()
        self.timer.start()
        self.background.start_sweeping()  # background subagents a crash interrupted

    async def resume(self, sessions: set[str] | None = None) -> int:
        """After a start: wake every session (or just `sessions`) with unfinished inbound work.

        Returns how many were woken. Sessions whose channel is not running stay as they are.
        """
        return await resume_sessions(
            self.store, self.sessions, self.placement, self.worker, self.channels, sessions
        )

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop taking work; let running turns finish for `grace` seconds, then cancel them."""
        await self.timer.stop()  # a job due from now on fires on a replica that stays
        await self.background.close()  # their jobs stay: they run again on a start
        self.sessions.closing = True
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        tasks = [s.task for s in self.sessions if s.task and not s.task.done()]
        if tasks:
            log.info("shutdown waiting for %d running sessions (grace %.0fs)", len(tasks), grace)
            _, still = await asyncio.wait(tasks, timeout=grace)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=5)
                log.warning(
                    "shutdown cancelled %d unfinished turns; they resume on next start", len(still)
                )
        await self.delivery.records.close()  # facts of delivery still waiting for the database
        await self.lease_keeper.close()
