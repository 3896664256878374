"""The tape store interface: what every store (SQLite, PostgreSQL) offers, and its result types.

The parts the stores share live beside it: `views` (the reads of `query_many`), `rows`
(entries as stored rows and the write plans a store runs), `store_base` (the operations
written once in terms of the others).

Code above the tape layer types against `TapeStore` and opens a store with `open_store`; it
never knows which database it talks to. Both stores keep the same promises: dense 1-based
ids per tape under concurrent writers, one transaction per write group (entries + dedupe keys
+ bootstrap anchor; archive + clear + first entries), counters from indexes, text search that
finds any script, and exact round trips of payload, meta and date.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Generic, Protocol, TypeVar

from .entries import TapeEntry
from .forks import ForkPoint, Merged
from .jobs import Decide, Fired, Job
from .leases import Leases
from .usage import Counting, UsageAdd, UsageRow
from .views import View


class TapeStoreError(RuntimeError):
    """The tape database cannot be opened or used; the message names where and why (one line,
    never a password)."""


@dataclass(frozen=True, slots=True)
class TapeSummary:
    """One row of `list_tapes()`."""

    name: str
    session_id: str | None
    entries: int
    anchors: int
    updated: str


@dataclass(frozen=True, slots=True)
class TapeStats:
    """Counters kept per tape so `info()` never scans entries."""

    name: str
    session_id: str | None
    entries: int
    anchors: int
    last_anchor_id: int


@dataclass(frozen=True, slots=True)
class DedupeRecord:
    """A recorded dedupe key: the delivery it stood for went to `tape`, first entry `entry_id`."""

    key: str
    tape: str
    entry_id: int
    date: str


# `first(archive_name)` gives the entries a tape starts with after a reset.
FirstEntries = Callable[[str | None], Sequence[TapeEntry]]


class TapeStore(Protocol):
    """A place tapes live. `SQLiteTapeStore` and `PostgresTapeStore` implement it."""

    kind: str
    """"sqlite" or "postgresql"."""
    location: str
    """Where the data is, for messages: a file path, or a URL without its password."""
    schema_version: int
    """The schema version of the open database."""
    transactions: int
    """How many transactions this store ran since it was opened (every round of work on a
    connection counts: a write transaction, or a read): a cheap counter for benchmarks and
    tests of how many trips a piece of work costs."""

    async def __aenter__(self) -> TapeStore: ...
    async def __aexit__(self, *exc: object) -> None: ...

    async def close(self) -> None:
        """Release the connection(s)."""

    async def ping(self) -> None:
        """Raise TapeStoreError unless the database is reachable and writable."""

    async def probe(self) -> None:
        """Write a row and read it back in a transaction that is rolled back (doctor)."""

    def leases(self, owner: str, seconds: float) -> Leases:
        """Leases of `owner` lasting `seconds` without renewal (several replicas on one
        database); a single-process store grants every lease (`LocalLeases`)."""

    async def append(self, tape: str, entry: TapeEntry) -> TapeEntry:
        """Append one entry; returns it with its id."""

    async def append_many(
        self,
        tape: str,
        entries: Iterable[TapeEntry],
        *,
        dedupe_keys: Sequence[str] = (),
        if_no_anchor: bool = False,
        bootstrap: TapeEntry | None = None,
        session_id: str | None = None,
        usage: Counting | None = None,
    ) -> list[TapeEntry] | None:
        """Append entries in one transaction and return them with their ids.

        `dedupe_keys`: if any key was ever recorded, nothing is written and None is returned;
        otherwise the keys are recorded with the entries (one transaction). `if_no_anchor`:
        write only when the tape has no anchor yet (else None). `bootstrap`: an anchor written
        first, in the same transaction, if the tape has none. `usage`: counters added in the
        same transaction (a refused write adds none); its `decide` may replace the entries
        from the counts (see tape/usage.py).
        """

    async def reset(
        self,
        tape: str,
        *,
        archive: bool = True,
        first: FirstEntries | None = None,
        carry_inbound_after: int | None = None,
    ) -> str | None:
        """Clear `tape` and its sidecars in one transaction; returns the archive name (None
        without `archive`, or when the tape was never written: there was nothing to archive).

        With `archive` the tape and its sidecars move under a fresh archive name (nothing is
        deleted); without it they are deleted. `first(archive_name)` gives the entries the
        fresh tape starts with. `carry_inbound_after`: inbound entries (meta.inbound) after
        this id move to the fresh tape too, read inside the transaction.
        """

    async def archive(self, tape: str) -> str:
        """Move `tape` and its sidecars under an archive name; the live tape starts empty."""

    async def stats(self, tape: str) -> TapeStats:
        """Entry and anchor counters (zeros for a tape never written)."""

    async def get(self, tape: str, entry_id: int) -> TapeEntry | None:
        """One entry by id."""

    async def query(
        self,
        tape: str,
        *,
        after_last_anchor: bool = False,
        after_anchor: str | None = None,
        between: tuple[str, str] | None = None,
        after_id: int | None = None,
        before_id: int | None = None,
        kinds: Iterable[str] | None = None,
        names: Iterable[str] | None = None,
        since: str | date | datetime | None = None,
        until: str | date | datetime | None = None,
        text: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[TapeEntry]:
        """Entries of `tape` matching every filter given (see `QuerySpec`)."""

    async def query_many(self, tape: str, views: Sequence[View]) -> list[list[TapeEntry]]:
        """Several queries of `tape` as one round of work and one consistent read (one trip
        to SQLite's thread; one read-only REPEATABLE READ transaction on one PostgreSQL
        connection), in order: a view that is a function sees the results before it."""

    async def read_context(self, tape: str) -> list[TapeEntry]:
        """The default view: entries strictly after the last anchor."""

    async def list_tapes(self, *, include_all: bool = False) -> list[TapeSummary]:
        """Live tapes, most recently active first (sidecars and archives with include_all)."""

    async def is_duplicate(self, key: str) -> bool:
        """Whether a dedupe key has been recorded."""

    async def session_tapes(self, session_id: str) -> list[str]:
        """The live tapes of a session id (one per workspace it was used in), an index lookup."""

    # -- copying between stores (`bub-bot tapes copy`) -----------------------------------------
    async def append_copies(
        self,
        tape: str,
        entries: Sequence[TapeEntry],
        *,
        session_id: str | None = None,
        updated: str | None = None,
    ) -> int:
        """Write entries that already have ids (copied from another store) as they are.

        Their ids must continue the tape densely (last id + 1, + 2, …), else TapeStoreError
        and nothing is written. Creates the tape (with `session_id`, and `updated` as its
        activity time) if missing, also for an empty list. Returns how many were written.
        """

    async def dedupe_records(self, *, after: str = "", limit: int = 1000) -> list[DedupeRecord]:
        """Recorded dedupe keys greater than `after`, in key order (for paging)."""

    async def add_dedupe_records(self, records: Sequence[DedupeRecord]) -> int:
        """Record keys that are not recorded yet; returns how many were new."""

    # -- usage counters (tape/usage.py) --------------------------------------------------------
    async def add_usage(self, adds: Sequence[UsageAdd]) -> None:
        """Add to counters in one transaction (usage that no tape entry records)."""

    async def usage(self, keys: Sequence[str], first: str, last: str) -> list[UsageRow]:
        """The counter rows of `keys` with `first <= window <= last`."""

    async def top_usage(
        self, prefix: str, first: str, last: str, *, limit: int = 10
    ) -> list[UsageRow]:
        """Keys starting with `prefix`, their rows with `first <= window <= last` summed,
        most tokens first (`window` is then the key's first window in the range)."""

    async def usage_records(
        self, *, after: tuple[str, str] = ("", ""), limit: int = 1000
    ) -> list[UsageRow]:
        """Counter rows after (key, window) `after`, in that order (for paging: copies)."""

    async def add_usage_records(self, rows: Sequence[UsageRow]) -> int:
        """Store counter rows that the database does not have yet (a (key, window) it has
        is left as it is, so copying twice copies nothing); returns how many were new."""

    async def prune_usage(self, before: Sequence[str]) -> int:
        """Delete the rows of windows older than each of `before` (`m:2026-12-01` drops every
        `m:` window before that day): short windows only matter while they last."""

    # -- forks (tape/forks.py) -----------------------------------------------------------------
    async def fork(self, tape: str, *, tag: str = "", session_id: str | None = None) -> ForkPoint:
        """Fork `tape` (and its sidecars) at its last id, one transaction: the fork
        `<tape>__fork__<tag>` (a fresh tag when none) reads the tape up to there plus its own
        entries (`ForkTape`), and writes only to itself."""

    async def fork_point(self, name: str) -> ForkPoint | None:
        """The stored fork `name` (None: not a fork, or merged or discarded)."""

    async def forks(self, tape: str) -> list[str]:
        """The live forks of `tape`, oldest first."""

    async def merge(self, name: str) -> Merged:
        """Append fork `name`'s entries to its parent after the parent's last id (kind,
        payload, meta, date kept), its sidecars' to the parent's sidecars, a `fork.merge` and
        a `sidecar.merge` event per sidecar (context=False) on the parent, and drop the fork:
        one transaction. ForkError when `name` is not a live fork."""

    async def discard(self, name: str, *, archive: bool = False, whole: bool = False) -> str | None:
        """Drop fork `name` and its sidecars (or move them under an archive name, returned);
        None when there was no such fork. `whole`: also a live tape (a temp subagent's,
        whose tape ends with its run: archived without a fresh tape left behind)."""

    # -- jobs: durable timers (tape/jobs.py) ---------------------------------------------------
    async def add_job(self, job: Job, *, limit: int | None = None) -> bool:
        """Store a new job. With `limit`: only while its session has fewer than `limit` jobs
        of its kind (counted in the same transaction); False when it has that many."""

    async def jobs(
        self,
        *,
        session_id: str | None = None,
        kinds: Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[Job]:
        """Jobs soonest first: all, or a session's, or of `kinds`."""

    async def remove_job(
        self, job_id: str, *, session_id: str | None = None, kinds: Sequence[str] | None = None
    ) -> Job | None:
        """Delete a job (only if it is `session_id`'s and of `kinds`, when given); returns
        it, None when there is no such job."""

    async def next_due(self, *, kinds: Sequence[str], channels: Sequence[str]) -> float | None:
        """The soonest due time of the jobs of `kinds` for `channels` (None: none)."""

    async def fire_jobs(
        self,
        now: float,
        decide: Decide,
        *,
        kinds: Sequence[str],
        channels: Sequence[str],
        limit: int = 100,
    ) -> list[Fired]:
        """Claim up to `limit` jobs of `kinds` for `channels` due at `now`, and in the same
        transaction write each one's entry (`decide(job)`) and advance or delete it (see
        tape/jobs.py). Jobs another transaction is firing are skipped, not waited for."""


S = TypeVar("S")


class Opening(Generic[S]):
    """What a store's `open` returns: await it, or use it with `async with` (closed on exit)."""

    def __init__(self, start: Callable[[], Awaitable[S]]) -> None:
        self._start = start
        self._store: S | None = None

    def __await__(self) -> Generator[Any, None, S]:
        return self._start().__await__()

    async def __aenter__(self) -> S:
        self._store = await self._start()
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.close()  # type: ignore[attr-defined]
