"""The Runtime: ingress, the per-session worker, turns, resume and shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from channels.base import Channel, Inbound, Received

from .. import commands
from ..agent import Agent
from ..config import Settings
from ..tape import Tape, TapeEntry, TapeStore
from .command_runner import CommandRunner
from .delivery import Delivery
from .facts import (
    DONE,
    age_seconds,
    channel_of,
    covered,
    head_through,
    is_pending,
    unhandled_replies,
)
from .leases import Leadership, LeaseKeeper, LeaseKey, Leases, LocalLeases
from .placement import Placement
from .session import Session
from .turns import FAILED_NOTE, TurnRunner

log = logging.getLogger("bub_bot.runtime")

EXPIRED_NOTE = (
    "Sorry, I was offline and your earlier message{s} expired before I could answer."
    " Please send {it} again."
)


class Runtime:
    """Sessions, ordering, delivery and resume; knows channels only through their contract."""

    def __init__(
        self,
        settings: Settings,
        store: TapeStore,
        agent: Agent,
        channels: dict[str, Channel] | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.settings = settings
        self.leases: Leases = leases or LocalLeases()
        self.lease_keeper = LeaseKeeper(self.leases, settings.lease_seconds, self._emit)
        self.store = store
        self.agent = agent
        self.channels: dict[str, Channel] = dict(channels or {})
        self._sessions: dict[str, Session] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrent_turns)
        self._closing = False
        self.observers: list[Callable[[str, dict[str, Any]], None]] = []
        """Called with (event, data) for metrics: inbound, turn, reply."""
        self.last_inbound: dict[str, float] = {}
        self._started_at = datetime.now(UTC).isoformat(timespec="microseconds")
        self.placement = Placement(settings, store)
        self._not_here: set[str] = set()
        """Sessions adopted by their lease whose channel this process does not run."""
        self.delivery = Delivery(self.channels, self._emit, settings)
        self.commands = CommandRunner(settings, agent, self.delivery, self._emit)
        self.turns = TurnRunner(
            settings, store, agent, self.channels, self.delivery, self._slots, self._emit
        )

    # -- observation ---------------------------------------------------------------------------
    def _emit(self, event: str, **data: Any) -> None:
        for observer in self.observers:
            try:
                observer(event, data)
            except Exception:
                log.exception("runtime observer failed on %s", event)

    @property
    def running_turns(self) -> int:
        return sum(1 for s in self._sessions.values() if s.running)

    # -- ingress -------------------------------------------------------------------------------
    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel

    def _session(self, session_id: str, workspace: Path | None) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            ws = workspace or self.settings.workspace
            session = Session(session_id, Tape.for_session(self.store, session_id, ws), ws)
            session.idle.set()
            self._sessions[session_id] = session
        return session

    async def receive(self, inbound: Inbound) -> Received:
        """Store an inbound message durably (deduplicated) and schedule its session's work.

        Returns once the message is on disk (with several replicas: and its session's lease
        was tried, see leases.py); a re-delivery returns `Received(new=False)` and changes
        nothing.
        """
        session_id, workspace = await self.placement.locate(inbound.session_id, inbound.workspace)
        if (session_id, workspace) != (inbound.session_id, inbound.workspace):
            inbound = dataclasses.replace(inbound, session_id=session_id, workspace=workspace)
        # Only look the session up here: a duplicate must not leave a Session behind.
        known = self._sessions.get(inbound.session_id)
        tape = (
            known.tape if known is not None else Tape.for_session(self.store, session_id, workspace)
        )
        command = commands.parse(inbound.text, inbound.bot_names)
        meta: dict[str, Any] = {
            "inbound": True,
            "channel": inbound.channel,
            "delivery_key": inbound.delivery_key,
            "message_id": inbound.message_id,
            "sender": {"id": inbound.sender.id, "name": inbound.sender.name},
            "reply_target": inbound.reply_target,
        }
        if inbound.meta:
            meta["platform"] = inbound.meta
        if inbound.sent_at is not None:
            meta["sent_at"] = inbound.sent_at
        if command is not None:
            data = {**command.to_json(), "text": inbound.text, "bot_names": list(inbound.bot_names)}
            entry = TapeEntry.event("command", data, **meta)
        else:
            content: Any = inbound.text
            if inbound.images:
                content = [{"type": "text", "text": inbound.text or "(image)"}]
                content += [{"type": "image_url", "image_url": {"url": u}} for u in inbound.images]
            entry = TapeEntry.message({"role": "user", "content": content}, **meta)
        keys = [f"{inbound.channel}:{inbound.delivery_key}"]
        keys += [f"{inbound.channel}:{k}" for k in inbound.extra_keys]
        written = await self.store.append_many(
            tape.name,
            [entry],
            dedupe_keys=keys,
            bootstrap=Tape.bootstrap_anchor(workspace),
            session_id=inbound.session_id,
        )
        self.last_inbound[inbound.channel] = time.monotonic()
        if written is None:
            log.info("inbound.duplicate session=%s key=%s", inbound.session_id, keys[0])
            self._emit("inbound", channel=inbound.channel, outcome="duplicate")
            if self.leases.shared and not self._closing:
                # The replica that stored it may have died before taking the lease (it never
                # acknowledged, so this is the platform's re-delivery): look at the session.
                await self._claim(self._session(inbound.session_id, inbound.workspace))
            return Received(new=False)
        # The worker may have finished (and forgotten this session) while we were writing.
        session = self._session(inbound.session_id, inbound.workspace)
        entry_id = written[0].id
        log.info(
            "inbound.new session=%s channel=%s entry=%d%s",
            inbound.session_id,
            inbound.channel,
            entry_id,
            f" command=/{command.name}" if command else "",
        )
        self._emit("inbound", channel=inbound.channel, outcome="new")
        if command is not None and session.running:
            barrier = session.barrier
            if barrier is None or barrier <= (session.cursor or 0):  # none, or one handled
                session.barrier = entry_id
        await self._claim(session)
        return Received(new=True, entry_id=entry_id)

    def note_inbound(self, channel: str, outcome: str) -> None:
        """Count a platform message a channel did not store ("ignored" or "denied")."""
        self._emit("inbound", channel=channel, outcome=outcome)

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

    async def _claim(self, session: Session) -> None:
        """Wake the session after something was stored for it. With shared leases, return
        only after its lease was tried (so the platform is acknowledged once the message has
        an owner: this replica, or a holder that looks again after releasing); while shutting
        down, hand the session to the other replicas instead."""
        self._wake(session)
        if not self.leases.shared:
            return
        if self._closing and not session.running:
            try:
                await self.lease_keeper.hand_over(LeaseKey(session.tape.name, session.id))
            except Exception as exc:
                log.warning("lease.handover_failed session=%s: %s", session.id, exc)
            return
        await session.claimed.wait()
        if session.claim_error is not None:
            # Stored, but nobody may run it: not acknowledged, so the platform delivers it
            # again and the re-delivery (a duplicate) tries the lease again.
            raise RuntimeError(f"the session's lease could not be taken: {session.claim_error}")

    def _wake(self, session: Session) -> None:
        session.dirty = True
        if self._closing or session.running:
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

    async def wait_idle(self, session_id: str, timeout: float | None = None) -> None:
        """Wait until the session has no work (for `bub-bot run`, tests and shutdown)."""
        session = self._sessions.get(session_id)
        if session is not None:
            await asyncio.wait_for(session.idle.wait(), timeout)

    # -- the session worker ------------------------------------------------------------------
    async def _work(self, session: Session) -> None:
        key = LeaseKey(session.tape.name, session.id)
        try:
            if not await self._take_lease(session, key):
                return
        except asyncio.CancelledError:
            self._forget(session)
            raise
        except Exception as exc:
            log.exception("lease.failed session=%s", session.id)
            session.claim_error = exc
            self._forget(session)
            return
        try:
            while not self._closing:
                session.dirty = False
                if session.needs_workspace:
                    session.workspace = await self.placement.recorded_workspace(session.tape)
                    session.needs_workspace = False
                if session.cursor is None:
                    session.cursor = await self._read_cursor(session.tape)
                items = await session.tape.query(
                    after_id=session.cursor, kinds=["message", "event"]
                )
                if session.adopted and not self._serves(items):
                    # Left lapsed for a replica that runs its channel (its sweep takes it);
                    # this process never adopts it again (its channels do not change).
                    log.info("lease.skipped session=%s: its channel does not run here", session.id)
                    session.leased = False
                    if len(self._not_here) < 100_000:
                        self._not_here.add(session.id)
                    await self.lease_keeper.give_back(key, lapse=True)
                    session.dirty = False
                    break
                session.adopted = None
                if await self._deliver_pending_reply(session, items):
                    continue
                pending = [e for e in items if is_pending(e)]
                if not pending:
                    if session.dirty:
                        continue
                    break
                # Everything that expired while we were down (messages and commands alike)
                # gets one note for the session, not one per message or command.
                expired = list(itertools.takewhile(self._expired, pending))
                if expired:
                    await self._expire(session, expired)
                    continue
                try:
                    if pending[0].kind == "event":
                        async with self._slots:
                            await self.commands.run(session, pending[0])
                    else:
                        await self.turns.run(session, pending, items)  # takes a slot itself
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Whatever broke, the entry is closed with a note: one bad entry must
                    # never block the conversation (or be re-run on every wake and restart).
                    await self._give_up(session, pending, exc)
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
                    await self._give_back(session, key)
            finally:
                session.running = False
                session.adopted = None
                session.idle.set()
                if not self._closing and not session.dirty:
                    self._sessions.pop(session.id, None)
                elif session.dirty and not self._closing:
                    self._wake(session)

    # -- leases (several replicas on one database; the rules are in leases.py) ----------------
    async def _take_lease(self, session: Session, key: LeaseKey) -> bool:
        """Take the session's lease before reading its queue; False: another replica has
        it (and will see what was stored: a holder looks at the queue after releasing)."""
        if not self.leases.shared:
            session.claimed.set()
            return True
        try:
            while True:
                session.dirty = False
                if await self.lease_keeper.take(key, lambda: self._lost(session)):
                    break
                # A message stored here during the attempt may have come after it: again.
                if not session.dirty or self._closing:
                    log.info("lease.busy session=%s", session.id)
                    self._forget(session)
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

    def _lost(self, session: Session) -> None:
        """The session's lease is no longer ours: stop its work here at once."""
        session.leased = False
        if session.task is not None and not session.task.done():
            session.task.cancel()

    def _forget(self, session: Session) -> None:
        session.running = False
        session.dirty = False
        session.adopted = None
        session.idle.set()
        session.claimed.set()
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]

    async def _give_back(self, session: Session, key: LeaseKey) -> None:
        """Release the lease; then look at the queue once more, since a message another
        replica stored while we held the lease is ours to answer."""
        session.leased = False
        try:
            await self.lease_keeper.give_back(key, handover=self._closing)
            if self._closing:
                return
            if session.dirty:
                return  # stored here meanwhile: the next worker takes the lease again
            # Our cursor is the tape's: nobody else moved it while we held the lease (if
            # another replica moves it from now on, at worst a worker looks once for nothing).
            cursor = session.cursor
            if cursor is None:
                cursor = await self._read_cursor(session.tape)
            items = await session.tape.query(after_id=cursor, kinds=["message", "event"])
            if any(is_pending(e) for e in items) or unhandled_replies(items):
                session.dirty = True
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("lease.release_failed session=%s", session.id)

    def _serves(self, items: list[TapeEntry]) -> bool:
        """Whether this process runs the channel the session's work is for (as `resume`
        decides): a session adopted by its lease alone may belong to `bub-bot run`."""
        channel = channel_of(items)
        return channel is None or channel in self.channels

    def _adopt(self, key: LeaseKey, how: str = "handover") -> None:
        """Wake a session known only by its lease: `how` is "handover" (another replica
        handed it over) or "takeover" (its lease lapsed: the replica died)."""
        if self._closing or key.session_id in self._not_here:
            return
        session = self._sessions.get(key.session_id)
        if session is None:
            tape = Tape(self.store, key.tape, key.session_id)
            session = Session(key.session_id, tape, self.settings.workspace)
            session.needs_workspace = True
            session.idle.set()
            self._sessions[key.session_id] = session
        if not session.running:
            session.adopted = how
        self._wake(session)

    def leader(self, name: str) -> Leadership:
        """Leadership of job `name` across replicas (see `channels.base.Leadership`)."""
        return Leadership(self.lease_keeper, name)

    async def broadcast(self, topic: str, data: str) -> None:
        """Tell the other replicas on this database `data` under `topic` (see
        `channels.base.RuntimeLike.broadcast`); best effort: a failure is logged, not raised."""
        try:
            await self.leases.broadcast(topic, data)
        except Exception as exc:
            log.warning("broadcast.failed topic=%s: %s", topic, exc)

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        """Call `callback(data)` for every broadcast of `topic` by another replica."""
        self.leases.subscribe(topic, callback)

    async def start(self) -> None:
        """Begin serving: with shared leases, take handovers and sweep for lapsed leases;
        then resume every session with unfinished work."""
        if self.leases.shared:
            await self.lease_keeper.listen(self._adopt)
            self.lease_keeper.start(
                lambda key: self._adopt(key, "takeover"), channels=lambda: list(self.channels)
            )
        await self.resume()

    async def _read_cursor(self, tape: Tape) -> int:
        done = await tape.query(kinds=["event"], names=[DONE], newest_first=True, limit=1)
        return int(done[0].payload["data"]["through"]) if done else 0

    async def _deliver_pending_reply(self, session: Session, items: list[TapeEntry]) -> bool:
        """Finish delivering an answer that was computed but not fully sent (after a crash,
        or the /reset reply written with the reset)."""
        replies = unhandled_replies(items)
        if not replies:
            return False
        reply = replies[-1]
        pending = [e for e in items if is_pending(e) and e.id < reply.id]
        through = max(covered(pending, reply), session.cursor or 0)
        source = next((e for e in reversed(pending) if e.id <= through), None)
        if source is None and "reply_target" in reply.meta:
            source = reply  # a reply that carries its own target (the /reset reply)
        if source is None:
            await self.delivery.mark_done(session, through, reply=reply.id)  # closes it: no loop
            return True
        log.info("reply.pending session=%s entry=%d", session.id, reply.id)
        try:
            await self.delivery.finish(session, source, reply, through, fresh=False, resumed=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reply.resume_failed session=%s entry=%d", session.id, reply.id)
            await self.delivery.mark_done(session, through, reply=reply.id, failed=True)
        return True

    async def _give_up(self, session: Session, pending: list[TapeEntry], exc: Exception) -> None:
        """Close the head of `pending` (a command, or the messages before the first command)
        after an unexpected failure: an `error` entry, a short note to the user, done."""
        through = head_through(pending)
        log.exception("session.failed session=%s entry=%d", session.id, pending[0].id)
        written = await session.tape.append_many(
            [
                TapeEntry.error("runtime", f"{type(exc).__name__}: {exc}"),
                TapeEntry.event(
                    "turn.notice", {"status": "error", "text": FAILED_NOTE}, context=False
                ),
            ]
        )
        source = next(e for e in reversed(pending) if e.id <= through)
        try:
            await self.delivery.finish(session, source, written[-1], through, fresh=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Even the note could not go out (e.g. the channel cannot format it): still done.
            log.exception("reply.failed session=%s entry=%d", session.id, written[-1].id)
            await self.delivery.mark_done(session, through, reply=written[-1].id, failed=True)

    def _expired(self, entry: TapeEntry) -> bool:
        """A message expires when it is older than the resume window and was either stored
        before this process started (found on resume) or sent long before the platform
        delivered it (a backlog after downtime: the platform's own time says so)."""
        window = self.settings.resume_window_seconds
        if window <= 0 or (entry.date >= self._started_at and "sent_at" not in entry.meta):
            return False
        return age_seconds(entry) > window

    async def _expire(self, session: Session, expired: list[TapeEntry]) -> None:
        """Old messages found after a restart: record them and send one note per session."""
        last = expired[-1]
        log.warning("inbound.expired session=%s count=%d", session.id, len(expired))
        many = len(expired) > 1
        text = EXPIRED_NOTE.format(s="s" if many else "", it="them" if many else "it")
        note = await session.tape.append(
            TapeEntry.event(
                "inbound.expired", {"ids": [e.id for e in expired], "text": text}, context=False
            )
        )
        await self.delivery.send(session, last, text, note.id)
        await self.delivery.mark_done(session, last.id, expired=True)

    # -- lifecycle -----------------------------------------------------------------------------
    async def resume(self, sessions: set[str] | None = None) -> int:
        """After a start: wake every session (or just `sessions`) with unfinished inbound work.

        Returns how many were woken. Sessions whose channel is not running stay as they are.
        """
        woken = 0
        for summary in await self.store.list_tapes():
            if not summary.session_id or (
                sessions is not None and summary.session_id not in sessions
            ):
                continue
            tape = Tape(self.store, summary.name, summary.session_id)
            cursor = await self._read_cursor(tape)
            items = await tape.query(after_id=cursor, kinds=["message", "event"])
            pending = [e for e in items if is_pending(e)]
            if not pending and not unhandled_replies(items):
                continue
            # A session whose channel is not running now stays as it is.
            if channel_of(items) not in self.channels:
                continue
            session = self._sessions.get(summary.session_id)
            if session is None:
                workspace = await self.placement.recorded_workspace(tape)
                # Checked again: the session may have come alive while we were reading.
                session = self._sessions.get(summary.session_id)
                if session is None:
                    session = Session(summary.session_id, tape, workspace)
                    session.idle.set()
                    self._sessions[summary.session_id] = session
            # Never set the cursor here: a live worker may have moved it since we read it,
            # and rewinding it would answer messages twice. The worker reads its own.
            self._wake(session)
            woken += 1
        if woken:
            log.info("resume sessions=%d", woken)
        return woken

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop taking work; let running turns finish for `grace` seconds, then cancel them."""
        self._closing = True
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        tasks = [s.task for s in self._sessions.values() if s.task and not s.task.done()]
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
        await self.lease_keeper.close()
