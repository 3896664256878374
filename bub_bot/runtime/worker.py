"""The session worker: one task per session with work, which handles the session's queue (what
is on its tape after its cursor) in order, one step at a time, until the queue is empty.

A step is the first thing the tape says is unfinished: a reply computed but not delivered
(after a crash), messages that expired while the bot was down, a command, or the messages
before the first command (one turn). With several replicas the worker holds the session's
lease meanwhile (`replicas.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from channels.base import Channel

from ..approvals.requests import is_decision, open_requests
from ..tape import TapeEntry
from .command_runner import CommandRunner
from .facts import head_through, is_barrier, is_pending, read_cursor, read_queue
from .leases import LeaseKeeper, LeaseKey
from .placement import Placement
from .recovery import Recovery
from .replicas import Replicas
from .session import Session, Sessions
from .turns import TurnRunner

log = logging.getLogger("bub_bot.runtime")


class SessionWorker:
    """Starts a session's worker when something was stored for it and runs its queue."""

    def __init__(
        self,
        sessions: Sessions,
        placement: Placement,
        keeper: LeaseKeeper,
        channels: dict[str, Channel],
        recovery: Recovery,
        commands: CommandRunner,
        turns: TurnRunner,
        slots: asyncio.Semaphore,
        emit: Callable[..., None],
    ) -> None:
        self.sessions = sessions
        self.placement = placement
        self.recovery = recovery
        self.commands = commands
        self.turns = turns
        self.slots = slots
        self.replicas = Replicas(keeper, sessions, channels, self.wake, emit)

    def wake(self, session: Session) -> None:
        """Make sure the session's worker runs (a running one reads the queue once more)."""
        session.dirty = True
        if self.sessions.closing or session.running:
            return
        session.running = True
        session.idle.clear()
        session.claimed.clear()
        session.claim_error = None
        session.task = asyncio.get_running_loop().create_task(
            self._work(session), name=f"session:{session.id}"
        )
        # Also when the task is cancelled before it ran: `receive` must not wait forever.
        session.task.add_done_callback(
            lambda task: session.claimed.set() if session.task is task else None
        )

    async def _work(self, session: Session) -> None:
        """Take the session's lease, run its queue until it is empty, give the lease back
        (and start again at once if something was stored meanwhile)."""
        key = LeaseKey(session.tape.name, session.id)
        try:
            if not await self.replicas.take(session, key):
                return
        except asyncio.CancelledError:
            self.sessions.forget(session)
            raise
        except Exception as exc:
            log.exception("lease.failed session=%s", session.id)
            session.claim_error = exc
            self.sessions.forget(session)
            return
        try:
            while not self.sessions.closing:
                session.dirty = False
                items = await self._queue(session)
                if not await self.replicas.serves(session, key, items):
                    break
                session.adopted = None
                if not await self._step(session, items):
                    if session.dirty:
                        continue
                    break
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug in the runtime itself: the session stays usable, the process stays up.
            log.exception("session worker failed session=%s", session.id)
            session.cursor = None
        finally:
            session.barrier = None
            try:
                if session.leased:
                    # Still `running` meanwhile: a message stored here now only marks the
                    # session dirty, and the next worker takes the lease again.
                    await self.replicas.give_back(session, key)
            finally:
                session.running = False
                session.adopted = None
                session.idle.set()
                closing = self.sessions.closing
                if not closing and not session.dirty:
                    self.sessions.drop(session.id)
                elif session.dirty and not closing:
                    self.wake(session)

    async def _queue(self, session: Session) -> list[TapeEntry]:
        """What is on the session's tape after its cursor (read from the tape when unknown)."""
        if session.needs_workspace:
            session.workspace = await self.placement.recorded_workspace(session.tape)
            session.needs_workspace = False
        if session.cursor is None:
            session.cursor = await read_cursor(session.tape)
        return await read_queue(session.tape, session.cursor)

    async def _step(self, session: Session, items: list[TapeEntry]) -> bool:
        """Handle the first unfinished thing in `items`; False: there is none."""
        if await self.recovery.finish_reply(session, items):
            return True
        pending = [e for e in items if is_pending(e)]
        if not pending:
            return False
        # Everything that expired while we were down (messages and commands alike) gets one
        # note for the session, not one per message or command.
        expired = list(itertools.takewhile(self.recovery.expired, pending))
        if expired:
            await self.recovery.expire(session, expired)
            return True
        if not is_barrier(pending[0]) and not is_decision(pending[0]):
            waiting = [r for r in await open_requests(session.tape) if r.decision is None]
            if waiting:
                # A request waits for a person: these messages stay on the tape (the model
                # reads them after the decision); the session goes on with what follows.
                through = head_through(pending)
                log.info(
                    "approval.held session=%s request=%s through=%d",
                    session.id,
                    waiting[-1].id,
                    through,
                )
                await self.turns.delivery.mark_done(session, through, held=waiting[-1].id)
                return True
        try:
            if is_barrier(pending[0]):
                async with self.slots:
                    await self.commands.run(session, pending[0])
            else:
                await self.turns.run(session, pending, items)  # takes a slot itself
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Whatever broke, the entry is closed with a note: one bad entry must never block
            # the conversation (or be re-run on every wake and restart).
            await self.recovery.give_up(session, pending, exc)
        return True
