"""Leases: rows in the tape database that say which process runs what (the interface).

A store hands out a `Leases` for one owner (`TapeStore.leases`): PostgreSQL keeps them in a
table shared by every replica on the database (`postgres_leases`); SQLite has one process, so
its `LocalLeases` grants everything at once and stores nothing. How the runtime uses them is
described in `bub_bot/runtime/leases.py`.

Two kinds of lease share the table: a session's (named by its tape, carrying the session id,
adopted by another replica when its owner dies) and a job's (one replica at a time runs it,
e.g. Telegram long polling; no session id; a standby takes it when it lapses).

The same notices carry broadcasts: a short text under a topic, heard by the other processes
on the database that subscribed to the topic (e.g. "this conversation changed"), best effort.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .entries import TapeEntry

MAX_BROADCAST = 7900
"""Bytes of a broadcast's topic and data together, as UTF-8 (PostgreSQL's NOTIFY takes a
payload under 8000 bytes, and the notice wraps them)."""


@dataclass(frozen=True, slots=True)
class LeaseKey:
    """A lease's name: a session's tape (tape names include the workspace) and its session
    id, or a job's name with an empty session id (`LeaseKey.job`)."""

    tape: str
    session_id: str

    @classmethod
    def job(cls, name: str) -> LeaseKey:
        """The lease of a job only one replica runs at a time."""
        return cls(name, "")

    @property
    def is_session(self) -> bool:
        return bool(self.session_id)


class Leases(Protocol):
    """Leases shared by every process on one database, held by one owner (this process)."""

    shared: bool
    """False for a single-process store: every lease is granted and nothing is renewed."""

    owner: str
    """This process's owner id (host, pid and a random part)."""

    async def acquire(self, key: LeaseKey) -> bool:
        """Take (or extend) the lease; False when another live owner holds it."""

    async def renew(self, keys: Iterable[LeaseKey]) -> set[str]:
        """Extend these leases (one statement); returns the names no longer ours."""

    async def release(self, key: LeaseKey, *, handover: bool = False, lapse: bool = False) -> None:
        """Give the lease up. `handover`: leave it lapsed at once and tell the other
        processes (they take it now; if the notice is lost, their sweep finds it). `lapse`:
        leave it lapsed without a notice, for the sweep of a process that can do the work
        (this one runs no channel for it)."""

    async def release_reading(self, key: LeaseKey, after_id: int) -> list[TapeEntry] | None:
        """Give the lease up and read the messages and events on its tape after `after_id`
        (what a holder looks at once it let go), as one statement where the database allows:
        the read sees what another replica stored before the release, and a replica that
        stores after it finds the lease free. None: released, nothing read (read it)."""

    async def lapsed(
        self, limit: int = 100, channels: Sequence[str] | None = None
    ) -> list[LeaseKey]:
        """Session leases whose owner stopped renewing (a dead replica's sessions), oldest
        first; with `channels`, only sessions of those channels (`<channel>:…` ids: a lease
        left for a replica that runs another channel never hides the ones this one can take).
        Job leases are never listed: their standbys retry on their own."""

    async def next_lapse(self) -> float | None:
        """Seconds until the next session lease of another owner lapses if not renewed
        (None: there is none), so a sweep can look right then."""

    async def listen(self, on_handover: Callable[[LeaseKey], None]) -> None:
        """Call `on_handover` when another process hands a lease over."""

    async def broadcast(self, topic: str, data: str) -> None:
        """Tell the other processes `data` under `topic` (a word; together at most
        `MAX_BROADCAST` bytes of UTF-8 text without NUL, else ValueError). Best effort: a
        process not listening at that moment never hears it. A single-process store sends
        nothing."""

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        """Call `callback(data)` (in the event loop, never for our own) for every broadcast
        of `topic` by another process, once listening (`listen`)."""

    async def close(self) -> None:
        """Stop listening; release nothing (a clean shutdown releases explicitly)."""


class LocalLeases:
    """One process owns everything (SQLite): every lease is granted, nothing is stored."""

    shared = False
    owner = "local"

    async def acquire(self, key: LeaseKey) -> bool:
        return True

    async def renew(self, keys: Iterable[LeaseKey]) -> set[str]:
        return set()

    async def release(self, key: LeaseKey, *, handover: bool = False, lapse: bool = False) -> None:
        return None

    async def release_reading(self, key: LeaseKey, after_id: int) -> list[TapeEntry] | None:
        return None

    async def lapsed(
        self, limit: int = 100, channels: Sequence[str] | None = None
    ) -> list[LeaseKey]:
        return []

    async def next_lapse(self) -> float | None:
        return None

    async def listen(self, on_handover: Callable[[LeaseKey], None]) -> None:
        return None

    async def broadcast(self, topic: str, data: str) -> None:
        return None  # nobody else to tell

    def subscribe(self, topic: str, callback: Callable[[str], None]) -> None:
        return None

    async def close(self) -> None:
        return None


def owner_id() -> str:
    """A new owner id for this process: host name, pid and a random part (a restarted process
    with a recycled pid is still someone else)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
