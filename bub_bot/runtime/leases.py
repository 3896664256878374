"""Leases: which process runs a session's turns when several replicas share one database.

A lease is a row (key, owner, expiry) in the store's database. The runtime takes a session's
lease before its worker reads the queue, renews every lease it holds while work runs, and
releases it when the queue is empty. Rules that make this safe without a coordinator:

- **Take after store.** `receive` writes the message first and then tries the lease. If
  another replica holds it, that replica has not released yet, and a holder always looks at
  the queue once more *after* releasing, so it sees the message (its write committed before
  our failed attempt, which came before the release). No message waits for a poll.
- **Lapse on death.** A replica that dies stops renewing; its leases expire after
  `BUB_LEASE_SECONDS` and the survivors' sweep (every third of that) takes them over and
  resumes those sessions with the usual resume rules (the tape says what was done).
- **Lose it, stop.** A renewal that finds the lease gone (the process stalled past the
  expiry and someone took over) cancels that session's work: two replicas never both run it.
- **Hand over on shutdown.** SIGTERM releases every lease and tells the others (NOTIFY),
  which take the sessions with work at once instead of waiting for expiry.

With SQLite (one process) `LocalLeases` grants every lease at once and costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LeaseKey:
    """A session's lease: named by its tape (tape names include the workspace)."""

    tape: str
    session_id: str


class Leases(Protocol):
    """Per-session leases shared by every replica on one database."""

    shared: bool
    """False for a single-process store: every lease is granted and nothing is renewed."""

    async def acquire(self, key: LeaseKey) -> bool:
        """Take (or extend) the lease; False when another live owner holds it."""

    async def renew(self, keys: Iterable[LeaseKey]) -> set[str]:
        """Extend these leases; returns the tape names whose lease is no longer ours."""

    async def release(self, key: LeaseKey, *, handover: bool = False) -> None:
        """Give the lease up; `handover` also tells the other replicas to look at it now."""

    async def lapsed(self) -> list[LeaseKey]:
        """Leases whose owner stopped renewing (a dead replica's sessions)."""

    async def listen(self, on_handover: Callable[[LeaseKey], None]) -> None:
        """Call `on_handover` when another replica hands a session over."""

    async def close(self) -> None:
        """Stop listening; release nothing (a clean shutdown releases explicitly)."""


class LocalLeases:
    """One process owns everything (SQLite): every lease is granted, nothing is stored."""

    shared = False

    async def acquire(self, key: LeaseKey) -> bool:
        return True

    async def renew(self, keys: Iterable[LeaseKey]) -> set[str]:
        return set()

    async def release(self, key: LeaseKey, *, handover: bool = False) -> None:
        return None

    async def lapsed(self) -> list[LeaseKey]:
        return []

    async def listen(self, on_handover: Callable[[LeaseKey], None]) -> None:
        return None

    async def close(self) -> None:
        return None
