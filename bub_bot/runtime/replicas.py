"""This process among the replicas on one database: the session worker's side of the leases
(take a session's lease before reading its queue, stop when it is lost, give it back and look
once more, adopt a session another replica handed over or left to lapse), jobs led by one
replica, and broadcasts. The rules that make leases safe are in `leases.py`; with SQLite (one
process) every lease is granted at once and nothing here waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from channels.base import Channel

from ..tape import Tape, TapeEntry
from .facts import channel_of, is_pending, read_cursor, read_queue, unhandled_replies
from .leases import Leadership, LeaseKeeper, LeaseKey
from .session import Session, Sessions

log = logging.getLogger("bub_bot.runtime")


class Replicas:
    """Takes, loses, gives back and adopts session leases for the session worker."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        sessions: Sessions,
        channels: dict[str, Channel],
        wake: Callable[[Session], None],
        emit: Callable[..., None],
    ) -> None:
        self.keeper = keeper
        self.leases = keeper.leases
        self.sessions = sessions
        self.channels = channels
        self.wake = wake
        """Starts a session's worker (`SessionWorker.wake`)."""
        self._emit = emit
        self._not_here: set[str] = set()
        """Sessions adopted by their lease whose channel this process does not run."""

    @property
    def shared(self) -> bool:
        """Whether other replicas may run sessions of this database."""
        return self.leases.shared

    async def start(self) -> None:
        """Take handovers and sweep for lapsed leases (with shared leases)."""
        if not self.leases.shared:
            return
        await self.keeper.listen(self.adopt)
        self.keeper.start(
            lambda key: self.adopt(key, "takeover"), channels=lambda: list(self.channels)
        )

    # -- a session's lease, around its worker ---------------------------------------------------
    async def claim(self, session: Session) -> None:
        """Wake the session after something was stored for it. With shared leases, return
        only after its lease was tried (so the platform is acknowledged once the message has
        an owner: this replica, or a holder that looks again after releasing); while shutting
        down, hand the session to the other replicas instead."""
        self.wake(session)
        if not self.leases.shared:
            return
        if self.sessions.closing and not session.running:
            try:
                await self.keeper.hand_over(LeaseKey(session.tape.name, session.id))
            except Exception as exc:
                log.warning("lease.handover_failed session=%s: %s", session.id, exc)
            return
        await session.claimed.wait()
        if session.claim_error is not None:
            # Stored, but nobody may run it: not acknowledged, so the platform delivers it
            # again and the re-delivery (a duplicate) tries the lease again.
            raise RuntimeError(f"the session's lease could not be taken: {session.claim_error}")

    async def take(self, session: Session, key: LeaseKey) -> bool:
        """Take the session's lease before reading its queue; False: another replica has
        it (and will see what was stored: a holder looks at the queue after releasing)."""
        if not self.leases.shared:
            session.claimed.set()
            return True
        try:
            while True:
                session.dirty = False
                if await self.keeper.take(key, lambda: self.lost(session)):
                    break
                # A message stored here during the attempt may have come after it: again.
                if not session.dirty or self.sessions.closing:
                    log.info("lease.busy session=%s", session.id)
                    self.sessions.forget(session)
                    return False
        finally:
            session.claimed.set()
        session.leased = True
        # Another replica may have answered messages since this process last held it.
        session.cursor = None
        self._emit("lease", outcome=session.adopted or "acquired")
        if session.adopted:
            log.info("lease.%s session=%s", session.adopted, session.id)
        return True

    def lost(self, session: Session) -> None:
        """The session's lease is no longer ours: stop its work here at once."""
        session.leased = False
        if session.task is not None and not session.task.done():
            session.task.cancel()

    async def serves(self, session: Session, key: LeaseKey, items: list[TapeEntry]) -> bool:
        """Whether this process runs the channel the session's work is for (as `resume`
        decides); a session adopted by its lease alone may belong to `bub-bot run`. If not,
        its lease is left lapsed for a replica that runs its channel (its sweep takes it);
        this process never adopts it again (its channels do not change)."""
        if not session.adopted:
            return True
        channel = channel_of(items)
        if channel is None or channel in self.channels:
            return True
        log.info("lease.skipped session=%s: its channel does not run here", session.id)
        session.leased = False
        if len(self._not_here) < 100_000:
            self._not_here.add(session.id)
        await self.keeper.give_back(key, lapse=True)
        session.dirty = False
        return False

    async def give_back(self, session: Session, key: LeaseKey) -> None:
        """Release the lease; then look at the queue once more, since a message another
        replica stored while we held the lease is ours to answer."""
        session.leased = False
        try:
            closing = self.sessions.closing
            # Our cursor is the tape's: nobody else moved it while we held the lease (if
            # another replica moves it from now on, at worst a worker looks once for nothing).
            cursor = session.cursor
            if closing or session.dirty or cursor is None:
                await self.keeper.give_back(key, handover=closing)
                if closing or session.dirty:
                    return  # dirty: stored here meanwhile, the next worker takes the lease
                cursor = await read_cursor(session.tape)
                items = await read_queue(session.tape, cursor)
            else:
                # The release and the read in one statement (see `Leases.release_reading`).
                found = await self.keeper.give_back_reading(key, cursor)
                items = found if found is not None else await read_queue(session.tape, cursor)
            if any(is_pending(e) for e in items) or unhandled_replies(items):
                session.dirty = True
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("lease.release_failed session=%s", session.id)

    def adopt(self, key: LeaseKey, how: str = "handover") -> None:
        """Wake a session known only by its lease: `how` is "handover" (another replica
        handed it over) or "takeover" (its lease lapsed: the replica died)."""
        if self.sessions.closing or key.session_id in self._not_here:
            return
        session = self.sessions.get(key.session_id)
        if session is None:
            tape = Tape(self.sessions.store, key.tape, key.session_id)
            session = self.sessions.add(
                Session(key.session_id, tape, self.sessions.workspace, needs_workspace=True)
            )
        if not session.running:
            session.adopted = how
        self.wake(session)

    # -- jobs and broadcasts ----------------------------------------------------------------------
    def leader(self, name: str) -> Leadership:
        """Leadership of job `name` across replicas (see `channels.base.Leadership`)."""
        return Leadership(self.keeper, name)

    async def broadcast(self, topic: str, data: str) -> None:
        """Tell the other replicas `data` under `topic`; best effort: a failure is logged."""
        try:
            await self.leases.broadcast(topic, data)
        except Exception as exc:
            log.warning("broadcast.failed topic=%s: %s", topic, exc)

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        """Call `callback(data)` for every broadcast of `topic` by another replica."""
        self.leases.subscribe(topic, callback)
