"""Leases: which process runs a session's turns when several replicas share one database.

A lease is a row (key, owner, expiry) in the store's database (`bub_bot/tape/leases.py`;
PostgreSQL's in `tape/postgres_leases.py`). The runtime takes a session's lease before its
worker reads the queue, renews every lease it holds while work runs, and releases it when the
queue is empty. Rules that make this safe without a coordinator:

- **Take after store.** `receive` writes the message first and then tries the lease, and
  acknowledges the platform only after that attempt. If another replica holds the lease, that
  replica has not released yet, and a holder always looks at the queue once more *after*
  releasing, so it sees the message (our write committed before our failed attempt, which came
  before its release). A worker whose attempt failed tries again if a message was stored here
  while it was trying. No message waits for a poll, so no NOTIFY is needed on receive.
- **Nothing stored without an owner.** Because the acknowledgement waits for the attempt, a
  replica killed between storing and taking the lease never acknowledged: the platform
  re-delivers, and a re-delivery recognised as a duplicate still wakes its session, in case the
  replica that stored it died before taking the lease. An attempt that fails (a database
  error) fails `receive` too, for the same re-delivery.
- **Lapse on death.** A replica that dies stops renewing; its leases expire after
  `BUB_LEASE_SECONDS` and the survivors' sweep (every third of that, and right when the next
  lease of another replica is due to lapse) takes them over and
  resumes those sessions with the usual resume rules (the tape says what was done). A session
  adopted this way whose channel this replica does not run is left alone.
- **Lose it, stop.** A renewal that finds the lease gone (the process stalled past the expiry
  and someone took over) cancels that session's work. So does a database that does not
  answer: a lease counts as renewed only by a renewal that succeeded (`since`), every
  renewal is bounded in time (a black-holed connection hangs, it does not fail), and work
  whose lease was not renewed by half a renewal period before it would lapse
  (`LeaseKeeper.deadline`) is cancelled then, logged `lease.lost`: it has stopped before
  another replica can take the lease. Two replicas never both run a session.
- **Re-read after re-taking.** Whenever a lease is taken again, the worker reads the session's
  cursor from the tape: another replica may have answered messages in between.
- **Hand over on shutdown.** SIGTERM releases every lease as a handover: the row is left
  lapsed and the others are told (NOTIFY); they take the sessions at once, and if a notice is
  lost their sweep finds the lapsed row. A message stored by a replica that is shutting down
  is handed over the same way.

Jobs that run on one replica only (Telegram long polling) use a job lease (`Leadership`): the
leader renews it with the session leases; a standby retries every third of the lease, or at
once when the leader hands it over.

With SQLite (one process) `LocalLeases` grants every lease at once and costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..tape.entries import TapeEntry
from ..tape.leases import LeaseKey, Leases, LocalLeases

__all__ = ["Leadership", "LeaseKeeper", "LeaseKey", "Leases", "LocalLeases", "bounded"]

log = logging.getLogger("bub_bot.runtime")

T = TypeVar("T")


async def bounded(call: Awaitable[T], timeout: float) -> T:
    """`call`'s result, or TimeoutError after `timeout` seconds. Unlike `asyncio.wait_for`
    this does not wait for the cancelled call to finish: a driver cleaning up a connection
    that does not answer (asyncpg cancelling a query on a cut network) can hang too."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        # Nobody awaits it any more: fetch its outcome so it is not reported as lost.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise TimeoutError(f"no answer in {timeout:.1f} s")
    return task.result()


@dataclass
class _Held:
    key: LeaseKey
    on_lost: Callable[[], None]
    since: float
    """Monotonic time before the last acquire or renewal of this lease that succeeded: the
    lease holds at least until `since + seconds` by the database's clock."""


class LeaseKeeper:
    """The leases this process holds: takes, renews (one statement for all, every third of
    the lease), gives back; calls `on_lost` for a lease that is no longer ours; sweeps for
    lapsed session leases; passes handover notices on."""

    def __init__(
        self, leases: Leases, seconds: float, emit: Callable[..., None] | None = None
    ) -> None:
        self.leases = leases
        self.seconds = seconds
        self.interval = seconds / 3
        self._emit = emit or (lambda event, **data: None)
        self._held: dict[str, _Held] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._renewer: asyncio.Task[None] | None = None
        self._job_notices: dict[str, asyncio.Event] = {}

    @property
    def shared(self) -> bool:
        return self.leases.shared

    @property
    def held(self) -> int:
        """How many leases this process holds now (sessions and jobs)."""
        return len(self._held)

    def holds(self, key: LeaseKey) -> bool:
        return key.tape in self._held

    async def take(self, key: LeaseKey, on_lost: Callable[[], None]) -> bool:
        """Take the lease; False when another live owner holds it. `on_lost` is called if a
        renewal later finds it gone."""
        started = time.monotonic()
        if not await self.leases.acquire(key):
            return False
        self._held[key.tape] = _Held(key, on_lost, started)
        if self.leases.shared and (self._renewer is None or self._renewer.done()):
            self._renewer = self._spawn(self._renew_loop(), "lease-renewal")
        return True

    async def give_back(
        self, key: LeaseKey, *, handover: bool = False, lapse: bool = False
    ) -> None:
        """Release the lease (`handover`: the others take it at once; `lapse`: it stays
        lapsed for another process's sweep)."""
        self._held.pop(key.tape, None)
        await self.leases.release(key, handover=handover, lapse=lapse)

    async def give_back_reading(self, key: LeaseKey, after_id: int) -> list[TapeEntry] | None:
        """Release the lease and read its tape's messages and events after `after_id`, in
        one statement where the database allows (None: released, read it yourself)."""
        self._held.pop(key.tape, None)
        return await self.leases.release_reading(key, after_id)

    async def hand_over(self, key: LeaseKey) -> None:
        """Tell the others to look at a session whose lease we do not hold (a message stored
        while shutting down); a live holder elsewhere is left alone."""
        if key.tape not in self._held:
            await self.leases.release(key, handover=True)

    def deadline(self, held: _Held) -> float:
        """Monotonic time by which `held` must have been renewed, or its work stops: half a
        renewal period before it can lapse in the database, room for cancelled work to end
        before another replica may take the lease."""
        return held.since + self.seconds - self.interval / 2

    def _next_renewal(self) -> float:
        """Seconds until the renewer should run: every third of the lease, sooner when a
        lease's deadline comes first (so giving up never waits for the next round)."""
        if not self._held:
            return self.interval
        now = time.monotonic()
        first = min(self.deadline(h) for h in self._held.values())
        return max(0.0, min(self.interval, first - now))

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._next_renewal())
            if not self._held:
                continue
            try:
                await self.renew_now()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The loop must live on: it is also what stops work whose lease may lapse.
                log.exception("lease.renewal_loop failed; going on")

    async def renew_now(self) -> None:
        """Extend every held lease; a lease found gone, or not renewed by its deadline (the
        database failed or did not answer in time), is dropped and its `on_lost` called."""
        now = time.monotonic()
        for held in [h for h in self._held.values() if now >= self.deadline(h)]:
            self._lose(held, "not renewed in time")
        snapshot = list(self._held.values())
        if not snapshot:
            return
        sent = time.monotonic()
        # Bounded: a hanging database must not keep us past a deadline.
        budget = min(self.interval, min(self.deadline(h) for h in snapshot) - sent)
        try:
            gone = await bounded(self.leases.renew(h.key for h in snapshot), max(budget, 0.05))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            now = time.monotonic()
            # Not renewed: `since` stays; past its deadline the lease may lapse: stop now.
            lapsing = [h for h in snapshot if now >= self.deadline(h)]
            log.warning(
                "lease.renew_failed leases=%d giving_up=%d: %s",
                len(snapshot),
                len(lapsing),
                exc or type(exc).__name__,
            )
            for held in lapsing:
                if self._held.get(held.key.tape) is held:
                    self._lose(held, "not renewed in time")
            return
        for held in snapshot:
            if self._held.get(held.key.tape) is not held:
                continue  # given back (or taken again) meanwhile
            if held.key.tape in gone:
                self._lose(held, "taken by another replica")
            else:
                held.since = sent

    def _lose(self, held: _Held, why: str) -> None:
        """Forget a lease that may not be ours any more and stop its work (`on_lost`)."""
        del self._held[held.key.tape]
        log.warning(
            "lease.lost %s=%s reason=%s: another replica may run it now; stopping here",
            "session" if held.key.is_session else "job",
            held.key.session_id or held.key.tape,
            why.replace(" ", "_"),
        )
        self._emit("lease", outcome="lost")
        try:
            held.on_lost()
        except Exception:
            log.exception("lease.lost handler failed key=%s", held.key.tape)

    def start(
        self,
        on_lapsed: Callable[[LeaseKey], None],
        channels: Callable[[], Sequence[str]] | None = None,
    ) -> asyncio.Task[None]:
        """Sweep for lapsed session leases every third of the lease (`on_lapsed` for each
        one not ours; only sessions of `channels()` when given). Returns the sweeping task."""
        return self._spawn(self._sweep_loop(on_lapsed, channels), "lease-sweep")

    async def _sweep_loop(
        self,
        on_lapsed: Callable[[LeaseKey], None],
        channels: Callable[[], Sequence[str]] | None,
    ) -> None:
        wait = self.interval
        while True:
            await asyncio.sleep(wait)
            await self.sweep(on_lapsed, channels() if channels is not None else None)
            # Look again when the next lease of another replica would lapse (if it does not
            # get renewed, its replica died), at the latest after a third of the lease.
            wait = self.interval
            try:
                left = await self.leases.next_lapse()
            except asyncio.CancelledError:
                raise
            except Exception:
                left = None
            if left is not None:
                wait = min(wait, max(left, 0.0) + 0.1)

    async def sweep(
        self, on_lapsed: Callable[[LeaseKey], None], channels: Sequence[str] | None = None
    ) -> None:
        try:
            found = await self.leases.lapsed(channels=channels)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("lease.sweep_failed: %s", exc)
            return
        for key in found:
            if key.tape not in self._held:
                on_lapsed(key)

    async def listen(self, on_session: Callable[[LeaseKey], None]) -> None:
        """Pass handover notices on: a session's to `on_session`, a job's to its standby."""

        def notified(key: LeaseKey) -> None:
            if key.is_session:
                on_session(key)
            elif (event := self._job_notices.get(key.tape)) is not None:
                event.set()

        await self.leases.listen(notified)

    async def job_notice(self, key: LeaseKey, timeout: float) -> None:
        """Wait up to `timeout` seconds for a handover notice of job `key`."""
        event = self._job_notices.setdefault(key.tape, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks = [t for t in self._tasks if not t.done()] + [task]
        return task

    async def close(self) -> None:
        """Stop renewing and sweeping, stop listening (releases nothing itself)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.leases.close()


class Leadership:
    """One job that runs on one replica at a time (see `channels.base.Leadership`)."""

    def __init__(self, keeper: LeaseKeeper, name: str) -> None:
        self.keeper = keeper
        self.name = name
        self.key = LeaseKey.job(name)
        self.lost = asyncio.Event()
        self.leading = False

    async def acquire(self) -> None:
        """Wait until this replica leads: try now, then every third of the lease or as soon
        as the leader hands over."""
        waiting = False
        while True:
            try:
                if await self.keeper.take(self.key, self._lose):
                    self.lost.clear()
                    self.leading = True
                    log.info("leader.acquired job=%s", self.name)
                    self.keeper._emit("leader", job=self.name, outcome="acquired")
                    return
                if not waiting:
                    log.info("leader.standby job=%s: another replica leads", self.name)
                    waiting = True
            except asyncio.CancelledError:
                # Stopped while trying: the attempt may have won in the database.
                if self.keeper.shared:
                    with contextlib.suppress(Exception):
                        await self.keeper.give_back(self.key, handover=True)
                raise
            except Exception as exc:
                log.warning("leader.acquire_failed job=%s: %s", self.name, exc)
            await self.keeper.job_notice(self.key, self.keeper.interval)

    def _lose(self) -> None:
        self.leading = False
        self.lost.set()
        self.keeper._emit("leader", job=self.name, outcome="lost")

    async def release(self) -> None:
        """Stop leading; a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        self.keeper._emit("leader", job=self.name, outcome="released")
        try:
            await self.keeper.give_back(self.key, handover=True)
            log.info("leader.released job=%s", self.name)
        except Exception as exc:
            log.warning("leader.release_failed job=%s: %s", self.name, exc)

    async def __aenter__(self) -> Leadership:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
