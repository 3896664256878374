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
from dataclasses import dataclass
from typing import Any

from channels.base import Channel

from ..approvals.requests import REQUESTS_VIEW, is_decision, open_in, open_requests
from ..tape import TapeEntry
from .command_runner import CommandRunner
from .facts import DONE, head_through, is_barrier, is_pending, unhandled_replies
from .leases import LeaseKeeper, LeaseKey
from .placement import Placement
from .recovery import Recovery
from .replicas import Replicas
from .session import Session, Sessions
from .turns import TurnRunner

log = logging.getLogger("bub_bot.runtime")

CURSOR_VIEW: dict[str, Any] = {
    "kinds": ["event"],
    "names": [DONE],
    "newest_first": True,
    "limit": 1,
}
"""The last `inbound.done`: where the handled part of the queue ends (`facts.read_cursor`)."""
CONTEXT_VIEW: dict[str, Any] = {"after_last_anchor": True}


@dataclass(frozen=True, slots=True)
class Queue:
    """What the worker read for its next step, in one round of work: the queue (messages
    and events after the cursor) and, when its head starts a turn, the open approval
    requests' events and the context the turn's first model call reads."""

    items: list[TapeEntry]
    requests: list[TapeEntry] | None = None
    context: list[TapeEntry] | None = None


def _starts_turn(items: list[TapeEntry]) -> bool:
    """Whether the next step of this queue is a turn (the head of its pending entries is a
    message or a decision and no reply waits to be delivered first)."""
    if unhandled_replies(items):
        return False
    head = next((e for e in items if is_pending(e)), None)
    return head is not None and not is_barrier(head)


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
                queue = await self._queue(session)
                if not await self.replicas.serves(session, key, queue.items):
                    break
                session.adopted = None
                step = await self._step(session, queue)
                if step == "drained" or not step:
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

    async def _queue(self, session: Session) -> Queue:
        """What is on the session's tape after its cursor (read from the tape when unknown)
        and what a turn at its head reads first: one round of work with the store."""
        if session.needs_workspace:
            session.workspace = await self.placement.recorded_workspace(session.tape)
            session.needs_workspace = False
        known = session.cursor

        def queue(found: list[list[TapeEntry]]) -> dict[str, Any]:
            # As `facts.read_cursor` and `facts.read_queue`.
            cursor = known if known is not None else _cursor(found[0])
            return {"after_id": cursor, "kinds": ["message", "event"]}

        views: list[Any] = [] if known is not None else [CURSOR_VIEW]
        at = len(views)  # where the queue is in the results
        views += [
            queue,
            lambda found: {**REQUESTS_VIEW, "limit": 50} if _starts_turn(found[at]) else None,
            lambda found: CONTEXT_VIEW if _starts_turn(found[at]) else None,
        ]
        found = await session.tape.query_many(*views)
        if known is None:
            session.cursor = _cursor(found[0])
        items, requests, context = found[at:]
        if not _starts_turn(items):
            return Queue(items)
        return Queue(items, requests, context)

    async def _step(self, session: Session, queue: Queue) -> bool | str:
        """Handle the first unfinished thing in the queue; False: there is none. "drained":
        a turn that left nothing else it knows of to do (nothing stored here meanwhile)."""
        items = queue.items
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
            found = (
                open_in(queue.requests)
                if queue.requests is not None
                else await open_requests(session.tape)
            )
            waiting = [r for r in found if r.decision is None]
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
                await self.turns.run(session, pending, items, queue.context)  # takes a slot
                if self._drained(session, items):
                    return "drained"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Whatever broke, the entry is closed with a note: one bad entry must never block
            # the conversation (or be re-run on every wake and restart).
            await self.recovery.give_up(session, pending, exc)
        return True

    def _drained(self, session: Session, items: list[TapeEntry]) -> bool:
        """After a turn: whether the worker may stop without reading its queue again.

        One process on the database: everything stored for the session went through this
        process's ingress, which marks it dirty; so when it is not, the queue is what was
        read before the turn, and the turn handled all of it. With shared leases another
        replica may have stored a message meanwhile (its claim failed: we held the lease),
        but `Replicas.give_back` reads the queue once the lease is released, for exactly
        that, and starts the worker again: a read before the release would only repeat it.
        """
        if session.dirty or session.cursor is None:
            return False
        cursor = session.cursor
        return not any(is_pending(e) and e.id > cursor for e in items)


def _cursor(done: list[TapeEntry]) -> int:
    """The cursor the `CURSOR_VIEW` result gives (0: nothing handled yet)."""
    return int(done[0].payload["data"]["through"]) if done else 0
