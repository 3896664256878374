"""The tape store interface: what every store (SQLite, PostgreSQL) offers, and shared parts.

Code above the tape layer types against `TapeStore` and opens a store with `open_store`; it
never knows which database it talks to. Both stores keep the same promises: dense 1-based
ids per tape under concurrent writers, one transaction per write group (entries + dedupe keys
+ bootstrap anchor; archive + clear + first entries), counters from indexes, text search that
finds any script, and exact round trips of payload, meta and date.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Generic, Protocol, Self, TypeVar

from .entries import PayloadError, TapeEntry, dumps, safe_text, utc_now
from .forks import ForkPoint, Merged
from .jobs import Decide, Fired, Firing, Job
from .leases import Leases, LocalLeases
from .names import FORK_SEP, archive_name
from .query import QuerySpec
from .usage import Counting, UsageAdd, UsageRow

log = logging.getLogger("bub_bot.tape")


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

View = Mapping[str, Any] | Callable[[list[list[TapeEntry]]], Mapping[str, Any] | None]
"""One query of `query_many`: filters as for `query`, or a function of the results before it
that gives them (None: no query, an empty result)."""


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
        """Several queries of `tape` as one round of work (one trip to SQLite's thread, one
        consistent read), in order: a view that is a function sees the results before it."""

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


# -- shared by the stores --------------------------------------------------------------------
Row = tuple[str, str | None, str, str, str]


@dataclass(frozen=True, slots=True)
class Append:
    """One append transaction as a store runs it: the rows, checked and encoded; the dedupe
    keys, sorted (two transactions recording the same keys take them in the same order).
    The store returns the rows' ids, or None when it refused: a dedupe key was recorded
    already, or `if_no_anchor` and the tape has an anchor."""

    tape: str
    rows: list[Row]
    dedupe_keys: list[str]
    if_no_anchor: bool
    bootstrap: Row | None
    session_id: str | None
    adds: list[UsageAdd] = field(default_factory=list)
    """Counters added in the same transaction, each (key, window) once, sorted."""
    decide: Callable[[dict[tuple[str, str], int]], list[Row] | None] | None = None
    """Given the counters' `messages` after the adds, rows to write instead (None: `rows`)."""


@dataclass(frozen=True, slots=True)
class Reset:
    """One reset transaction: `rows(archive name or None)` starts the fresh tape; the store
    archives under `archived` (None: deletes) and returns the archive name, None when the
    tape was never written."""

    tape: str
    archived: str | None
    rows: Callable[[str | None], list[Row]]
    carry_inbound_after: int | None


@dataclass(frozen=True, slots=True)
class Copies:
    """One copy transaction: `rows` (of `entries`) keep their ids and dates."""

    tape: str
    entries: list[TapeEntry]
    rows: list[Row]
    session_id: str | None
    updated: str


def entry_row(e: TapeEntry) -> Row:
    """An entry as a stored row (kind, name, payload, meta, date); fails before any write."""
    name = e.name
    return (
        e.kind,
        safe_text(name) if isinstance(name, str) else None,
        dumps(e.payload, "payload"),
        dumps(e.meta, "meta"),
        e.date,
    )


def row_entry(id_: int, kind: str, payload: str, meta: str, date_: str) -> TapeEntry:
    """A stored row back as an entry."""
    return TapeEntry(kind, json.loads(payload), json.loads(meta), date_, id_)


def is_inbound(meta: str) -> bool:
    """Whether stored meta marks an inbound message as it arrived (carried over a reset); a
    copy made after an anchor was answered already (older tapes marked copies inbound too)."""
    # Stored meta is compact JSON, so the key reads `"inbound":`; cheap test first.
    if '"inbound":' not in meta:
        return False
    parsed = json.loads(meta)
    value = parsed.get("inbound")
    return (value is True or value == 1) and "copy_of" not in parsed


class StoreBase:
    """What both stores share: the operations written in terms of the others."""

    kind: str
    location: str
    schema_version: int
    transactions: int = 0
    """See `TapeStore.transactions`; each store adds one per round of work it runs."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError

    def leases(self, owner: str, seconds: float) -> Leases:
        """One process on this database: every lease is granted (see TapeStore)."""
        return LocalLeases()

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
        """Append entries in one transaction and return them with their ids (see TapeStore)."""
        entries = list(entries)
        chosen = entries
        decide = None
        if usage is not None and usage.decide is not None:
            ask = usage.decide

            def decide(found: dict[tuple[str, str], int]) -> list[Row] | None:
                nonlocal chosen
                replaced = ask(usage.counts(found))
                if replaced is None:
                    return None
                chosen = list(replaced)
                return [entry_row(e) for e in chosen]

        ids = await self._append(
            Append(
                tape,
                [entry_row(e) for e in entries],
                sorted({safe_text(k) for k in dedupe_keys}),
                if_no_anchor,
                entry_row(bootstrap) if bootstrap else None,
                safe_text(session_id) if session_id else None,
                usage.sorted_adds() if usage is not None else [],
                decide,
            )
        )
        return None if ids is None else with_ids(chosen, ids)

    async def _append(self, append: Append) -> list[int] | None:
        """The store's append transaction (see `Append`)."""
        raise NotImplementedError

    async def append_copies(
        self,
        tape: str,
        entries: Sequence[TapeEntry],
        *,
        session_id: str | None = None,
        updated: str | None = None,
    ) -> int:
        """Write entries copied from another store, ids and dates as they are (see TapeStore)."""
        entries = list(entries)
        await self._append_copies(
            Copies(
                tape,
                entries,
                [entry_row(e) for e in entries],
                safe_text(session_id) if session_id else None,
                updated or utc_now(),
            )
        )
        return len(entries)

    async def _append_copies(self, copies: Copies) -> None:
        """The store's copy transaction (see `Copies`)."""
        raise NotImplementedError

    async def reset(
        self,
        tape: str,
        *,
        archive: bool = True,
        first: FirstEntries | None = None,
        carry_inbound_after: int | None = None,
    ) -> str | None:
        """Clear `tape` and its sidecars in one transaction; returns the archive name (see
        TapeStore). Archiving renames tape rows: O(1) in the entries."""

        def rows(archived: str | None) -> list[Row]:
            return [entry_row(e) for e in (first(archived) if first else ())]

        name = archive_name(tape) if archive else None
        return await self._reset(Reset(tape, name, rows, carry_inbound_after))

    async def _reset(self, reset: Reset) -> str | None:
        """The store's reset transaction (see `Reset`)."""
        raise NotImplementedError

    async def _select(self, spec: QuerySpec) -> list[TapeEntry]:
        raise NotImplementedError

    async def append(self, tape: str, entry: TapeEntry) -> TapeEntry:
        """Append one entry; returns it with its id and date."""
        written = await self.append_many(tape, [entry])
        assert written is not None
        return written[0]

    async def archive(self, tape: str) -> str:
        """Move `tape` and its sidecars under an archive name; the live tape starts empty."""
        archived = await self.reset(tape, archive=True)
        if archived is None:
            raise TapeStoreError(f"tape {tape!r} was never written: nothing to archive")
        return archived

    async def get(self, tape: str, entry_id: int) -> TapeEntry | None:
        """One entry by id."""
        found = await self.query(tape, after_id=entry_id - 1, limit=1)
        return found[0] if found and found[0].id == entry_id else None

    async def query(self, tape: str, **filters: Any) -> list[TapeEntry]:
        """Entries of `tape` matching every filter given, oldest first unless `newest_first`
        (filters: see `QuerySpec`)."""
        return await self._select(QuerySpec.build(tape, **filters))

    async def read_context(self, tape: str) -> list[TapeEntry]:
        """The default view: entries strictly after the last anchor (index lookups only)."""
        return await self._select(QuerySpec(tape, after_last_anchor=True))

    async def query_many(self, tape: str, views: Sequence[View]) -> list[list[TapeEntry]]:
        """Several queries of `tape` in order, as one round of work where the store can
        (see TapeStore); here: one after the other."""
        results: list[list[TapeEntry]] = []
        for view in views:
            filters = view(results) if callable(view) else view
            found = [] if filters is None else await self.query(tape, **filters)
            results.append(found)
        return results


def run_views(
    tape: str, views: Sequence[View], select: Callable[[QuerySpec], list[TapeEntry]]
) -> list[list[TapeEntry]]:
    """`query_many` for a store that reads synchronously (SQLite's thread): `select` each."""
    results: list[list[TapeEntry]] = []
    for view in views:
        filters = view(results) if callable(view) else view
        results.append([] if filters is None else select(QuerySpec.build(tape, **filters)))
    return results


async def run_views_async(
    tape: str, views: Sequence[View], select: Callable[[QuerySpec], Awaitable[list[TapeEntry]]]
) -> list[list[TapeEntry]]:
    """`query_many` for a store that reads asynchronously on one connection: `select` each."""
    results: list[list[TapeEntry]] = []
    for view in views:
        filters = view(results) if callable(view) else view
        results.append([] if filters is None else await select(QuerySpec.build(tape, **filters)))
    return results


def firing_append(job: Job, firing: Firing) -> Append | None:
    """The append a firing writes on its job's tape (None: it writes nothing, or its entry
    cannot be stored: the job moves on without it rather than block every later one)."""
    if firing.entry is None:
        return None
    try:
        return Append(
            job.tape,
            [entry_row(firing.entry)],
            sorted({safe_text(k) for k in firing.keys}),
            False,
            entry_row(firing.bootstrap) if firing.bootstrap else None,
            safe_text(job.session_id),
        )
    except PayloadError as exc:
        log.error("job.unstorable job=%s session=%s: %s", job.id, job.session_id, exc)
        return None


def new_tag() -> str:
    """A fresh fork tag."""
    return uuid.uuid4().hex[:12]


def with_ids(entries: Sequence[TapeEntry], ids: Sequence[int]) -> list[TapeEntry]:
    """`entries` as written, carrying the ids the store gave them."""
    return [
        TapeEntry(e.kind, e.payload, e.meta, e.date, i) for e, i in zip(entries, ids, strict=True)
    ]


def fork_base(tape: str, entries: Sequence[TapeEntry]) -> int:
    """Where a copied fork's (or archived fork's) own entries start from: its fork point
    (0: `tape` is no fork, or the copy does not start it)."""
    if FORK_SEP not in tape or not entries or entries[0].id is None:
        return 0
    return max(entries[0].id - 1, 0)


def check_copy_ids(tape: str, entries: Sequence[TapeEntry], last_id: int) -> None:
    """Copied entries must continue `tape` densely after `last_id`."""
    expected = list(range(last_id + 1, last_id + 1 + len(entries)))
    if [e.id for e in entries] != expected:
        got = [e.id for e in entries[:3]]
        raise TapeStoreError(
            f"tape {tape}: copied entries must continue at id {last_id + 1} without gaps"
            f" (got {got}…)"
        )
