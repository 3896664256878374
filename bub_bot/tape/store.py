"""SQLite tape store: WAL, one writer, dense per-tape ids, one transaction per write group.

Every operation is one function run on aiosqlite's worker thread, so a whole transaction
(BEGIN IMMEDIATE ... COMMIT) costs one thread hop and can never interleave with another.
"""

from __future__ import annotations

import json
import sqlite3
import string
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from .entries import KINDS, TapeEntry, dumps, utc_now
from .names import SIDECAR_SEP, archive_name, tape_role

SCHEMA_VERSION = 1

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tapes (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL,               -- live | sidecar | archive
    session_id  TEXT,
    created     TEXT NOT NULL,
    updated     TEXT NOT NULL                -- set on create, rename and reset only
);
CREATE TABLE IF NOT EXISTS entries (
    tape    INTEGER NOT NULL,
    id      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    name    TEXT,                            -- anchor/event name or message role
    payload TEXT NOT NULL,
    meta    TEXT NOT NULL,
    date    TEXT NOT NULL,
    UNIQUE (tape, id)
);
-- Counters come from indexes (max id, anchors by id), not from a tapes row rewritten on
-- every append. Partial indexes: only anchors and events are looked up by name, so message
-- and tool entries (most of a tape) cost no index writes beyond (tape, id).
CREATE INDEX IF NOT EXISTS anchors_by_id ON entries (tape, id) WHERE kind = 'anchor';
CREATE INDEX IF NOT EXISTS anchors_by_name ON entries (tape, name, id) WHERE kind = 'anchor';
CREATE INDEX IF NOT EXISTS events_by_name ON entries (tape, name, id) WHERE kind = 'event';
CREATE TABLE IF NOT EXISTS dedupe (
    key      TEXT PRIMARY KEY,
    tape     TEXT NOT NULL,
    entry_id INTEGER NOT NULL,
    date     TEXT NOT NULL
);
"""

T = TypeVar("T")


class TapeStoreError(RuntimeError):
    """The tape database cannot be opened or used; the message names the path and cause."""


class AnchorNotFound(LookupError):
    """A query named an anchor the tape does not have."""


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


def _row(e: TapeEntry) -> tuple[str, str | None, str, str, str]:
    """An entry as an `entries` row (without tape and id); fails before any write."""
    return (e.kind, e.name, dumps(e.payload, "payload"), dumps(e.meta, "meta"), e.date)


def _row_to_entry(row: Sequence[Any]) -> TapeEntry:
    id_, kind, payload, meta, date_ = row
    return TapeEntry(kind, json.loads(payload), json.loads(meta), date_, id_)


def _day_start(d: date) -> str:
    return datetime(d.year, d.month, d.day, tzinfo=UTC).isoformat(timespec="microseconds")


def _bound(value: str | date | datetime, *, end: bool) -> tuple[str, str]:
    """Turn a user date bound into (operator, ISO string); bare dates cover whole UTC days."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return ("<=" if end else ">="), moment.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, date):
        day = value
    else:
        text = str(value).strip()
        try:
            if len(text) == 10:
                day = date.fromisoformat(text)
            else:
                return _bound(datetime.fromisoformat(text.replace("Z", "+00:00")), end=end)
        except ValueError:
            raise ValueError(f"not a date or ISO-8601 time: {value!r}") from None
    if end:
        return "<", _day_start(day + timedelta(days=1))
    return ">=", _day_start(day)


class _Opening:
    """What `SQLiteTapeStore.open` returns: await it, or use it with `async with`."""

    def __init__(self, start: Callable[[], Awaitable[SQLiteTapeStore]]) -> None:
        self._start = start
        self._store: SQLiteTapeStore | None = None

    def __await__(self) -> Generator[Any, None, SQLiteTapeStore]:
        return self._start().__await__()

    async def __aenter__(self) -> SQLiteTapeStore:
        self._store = await self._start()
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.close()


class SQLiteTapeStore:
    """Tapes in one SQLite file. Open with `await SQLiteTapeStore.open(path)` or `async with`."""

    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        self._conn = conn
        self.path = path

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> _Opening:
        """Open (creating if needed) the database at `path`; fail with one clear line if not.

        `store = await SQLiteTapeStore.open(path)`, or `async with SQLiteTapeStore.open(path)
        as store:` (closed on exit).
        """
        return _Opening(lambda: cls._open(path))

    @classmethod
    async def _open(cls, path: str | Path) -> SQLiteTapeStore:
        location = str(path)
        if location != ":memory:":
            try:
                Path(location).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TapeStoreError(f"cannot open tape database {location}: {exc}") from None
            location = str(Path(location).expanduser())
        try:
            conn = await aiosqlite.connect(location, isolation_level=None, timeout=10)
        except sqlite3.Error as exc:
            raise TapeStoreError(f"cannot open tape database {location}: {exc}") from None
        store = cls(conn, location)
        try:
            await store._run(_init_schema)
        except sqlite3.Error as exc:
            await conn.close()
            cause = str(exc)
            if "not a database" in cause or "malformed" in cause:
                cause = f"{cause} (the file is corrupt or not a SQLite database)"
            raise TapeStoreError(f"cannot open tape database {location}: {cause}") from None
        except TapeStoreError as exc:
            await conn.close()
            raise TapeStoreError(f"cannot open tape database {location}: {exc}") from None
        return store

    async def __aenter__(self) -> SQLiteTapeStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        await self._conn.close()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # aiosqlite runs `fn(sqlite3_connection, *args)` on its worker thread: one hop per
        # transaction instead of one per statement.
        return await self._conn._execute(lambda: fn(self._conn._conn, *args))

    async def ping(self) -> None:
        """Check the database is writable (takes and releases the write lock)."""
        await self._run(_ping)

    # -- writes -------------------------------------------------------------------------------
    async def append(self, tape: str, entry: TapeEntry) -> TapeEntry:
        """Append one entry; returns it with its id and date."""
        written = await self.append_many(tape, [entry])
        assert written is not None
        return written[0]

    async def append_many(
        self,
        tape: str,
        entries: Iterable[TapeEntry],
        *,
        dedupe_keys: Sequence[str] = (),
        if_no_anchor: bool = False,
        bootstrap: TapeEntry | None = None,
        session_id: str | None = None,
    ) -> list[TapeEntry] | None:
        """Append entries in one transaction and return them with their ids.

        `dedupe_keys`: if any key was ever recorded, nothing is written and None is returned;
        otherwise the keys are recorded with the entries (one transaction, so a crash keeps
        both or neither). `if_no_anchor`: write only when the tape has no anchor yet.
        `bootstrap`: an anchor written first, in the same transaction, if the tape has none.
        """
        entries = list(entries)
        rows = [_row(e) for e in entries]
        ids = await self._run(
            _append,
            tape,
            rows,
            tuple(dict.fromkeys(dedupe_keys)),
            if_no_anchor,
            _row(bootstrap) if bootstrap else None,
            session_id,
            utc_now(),
        )
        if ids is None:
            return None
        return [
            TapeEntry(e.kind, e.payload, e.meta, e.date, i)
            for e, i in zip(entries, ids, strict=True)
        ]

    async def reset(
        self,
        tape: str,
        *,
        archive: bool = True,
        first: Callable[[str | None], Sequence[TapeEntry]] | None = None,
        carry_inbound_after: int | None = None,
    ) -> str | None:
        """Clear `tape` and its sidecars in one transaction; returns the archive name.

        With `archive` the tape and its sidecars move under a fresh archive name (nothing is
        deleted); without it they are deleted. `first(archive_name)` gives the entries the
        fresh tape starts with (written in the same transaction). `carry_inbound_after`:
        inbound entries (meta.inbound) after this id move to the fresh tape too, read inside
        the transaction so a message that arrives during the reset cannot vanish.
        """
        archived = archive_name(tape) if archive else None
        rows = [_row(e) for e in (first(archived) if first else ())]
        await self._run(_reset, tape, archived, rows, carry_inbound_after, utc_now())
        return archived

    async def archive(self, tape: str) -> str:
        """Move `tape` and its sidecars under an archive name; the live tape starts empty."""
        archived = await self.reset(tape, archive=True)
        assert archived is not None
        return archived

    # -- reads --------------------------------------------------------------------------------
    async def stats(self, tape: str) -> TapeStats:
        """Entry and anchor counters for a tape (zeros for a tape never written)."""
        return await self._run(_stats, tape)

    async def get(self, tape: str, entry_id: int) -> TapeEntry | None:
        """One entry by id."""
        found = await self.query(tape, after_id=entry_id - 1, limit=1)
        return found[0] if found and found[0].id == entry_id else None

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
        """Entries of `tape` matching every filter given, oldest first unless `newest_first`.

        Anchor filters: after the last anchor; after the last occurrence of a named anchor;
        `between=(start, end)`: after the last `start` anchor and before the first `end`
        anchor that follows it (to the end of the tape if none does). `since`/`until` take
        datetimes or ISO strings; a bare date (YYYY-MM-DD) covers the whole UTC day. `text`
        finds a substring of the payload in any script (case-insensitive for ASCII).
        """
        clauses: list[str] = []
        params: list[Any] = []
        if kinds is not None:
            kinds = list(kinds)
            unknown = [k for k in kinds if k not in KINDS]
            if unknown:
                raise ValueError(f"unknown entry kind(s) {unknown}; kinds are {', '.join(KINDS)}")
            # Literal kinds (validated above) let SQLite use the partial indexes.
            if len(kinds) == 1:
                clauses.append(f"kind = '{kinds[0]}'")
            else:
                clauses.append(f"kind IN ({','.join(repr(k) for k in kinds)})")
        if names is not None:
            names = list(names)
            clauses.append(f"name IN ({','.join('?' * len(names))})")
            params.extend(names)
        if since is not None:
            op, value = _bound(since, end=False)
            clauses.append(f"date {op} ?")
            params.append(value)
        if until is not None:
            op, value = _bound(until, end=True)
            clauses.append(f"date {op} ?")
            params.append(value)
        if text:
            # Payloads are stored as JSON without ASCII escapes, so any script matches as-is;
            # the needle is escaped the same way so quotes and newlines match too.
            clauses.append("instr(lower(payload), ?) > 0")
            # SQLite's lower() folds ASCII only, so the needle is folded the same way (str.lower
            # would fold "Привет" to "привет" and never match the stored "Привет").
            params.append(json.dumps(text, ensure_ascii=False)[1:-1].translate(_ASCII_LOWER))
        return await self._run(
            _query,
            tape,
            after_last_anchor,
            after_anchor,
            between,
            after_id,
            before_id,
            " AND ".join(clauses),
            params,
            limit,
            newest_first,
        )

    async def read_context(self, tape: str) -> list[TapeEntry]:
        """The default view: entries strictly after the last anchor (two index lookups)."""
        return await self.query(tape, after_last_anchor=True)

    async def list_tapes(self, *, include_all: bool = False) -> list[TapeSummary]:
        """Live tapes, most recently active first (sidecars and archives only with include_all)."""
        return await self._run(_list_tapes, include_all)

    async def is_duplicate(self, key: str) -> bool:
        """Whether a dedupe key has been recorded."""
        return await self._run(_has_key, key)


# -- functions run on the database thread --------------------------------------------------
def _init_schema(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA busy_timeout = 10000")
    # Refuse a newer file before changing anything in it (not even its journal mode).
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise TapeStoreError(
            f"schema version {version} is newer than this bub-bot supports ({SCHEMA_VERSION});"
            " upgrade bub-bot"
        )
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() not in ("wal", "memory"):
        raise TapeStoreError(f"could not switch to WAL (journal_mode is {mode})")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _ping(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ROLLBACK")


def _tape_id(conn: sqlite3.Connection, tape: str, session_id: str | None, now: str) -> int:
    """The tape's row id, creating the row (and filling a missing session id) as needed."""
    row = conn.execute("SELECT id, session_id FROM tapes WHERE name = ?", (tape,)).fetchone()
    if row is not None:
        if session_id and row[1] is None:
            conn.execute("UPDATE tapes SET session_id = ? WHERE id = ?", (session_id, row[0]))
        return row[0]
    cur = conn.execute(
        "INSERT INTO tapes (name, role, session_id, created, updated) VALUES (?, ?, ?, ?, ?)",
        (tape, tape_role(tape), session_id, now, now),
    )
    return cur.lastrowid  # type: ignore[return-value]


def _last_id(conn: sqlite3.Connection, tape_id: int) -> int:
    return conn.execute(
        "SELECT coalesce(max(id), 0) FROM entries WHERE tape = ?", (tape_id,)
    ).fetchone()[0]


def _last_anchor(conn: sqlite3.Connection, tape_id: int) -> int:
    return conn.execute(
        "SELECT coalesce(max(id), 0) FROM entries WHERE tape = ? AND kind = 'anchor'", (tape_id,)
    ).fetchone()[0]


def _append(
    conn: sqlite3.Connection,
    tape: str,
    rows: list[tuple],
    dedupe_keys: tuple[str, ...],
    if_no_anchor: bool,
    bootstrap: tuple | None,
    session_id: str | None,
    now: str,
) -> list[int] | None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        if dedupe_keys:
            marks = ",".join("?" * len(dedupe_keys))
            seen = conn.execute(f"SELECT 1 FROM dedupe WHERE key IN ({marks})", dedupe_keys)
            if seen.fetchone() is not None:
                conn.execute("ROLLBACK")
                return None
        tape_id = _tape_id(conn, tape, session_id, now)
        last_id = _last_id(conn, tape_id)
        has_anchor = (if_no_anchor or bootstrap is not None) and _last_anchor(conn, tape_id) > 0
        if if_no_anchor and has_anchor:
            conn.execute("ROLLBACK")
            return None
        skip = 0
        if bootstrap is not None and not has_anchor:
            rows = [bootstrap, *rows]
            skip = 1
        ids = list(range(last_id + 1, last_id + 1 + len(rows)))
        conn.executemany(
            "INSERT INTO entries (tape, id, kind, name, payload, meta, date)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(tape_id, i, *row) for i, row in zip(ids, rows, strict=True)],
        )
        ids = ids[skip:]
        if dedupe_keys:
            first_id = ids[0] if ids else 0
            conn.executemany(
                "INSERT INTO dedupe (key, tape, entry_id, date) VALUES (?, ?, ?, ?)",
                [(key, tape, first_id, now) for key in dedupe_keys],
            )
        conn.execute("COMMIT")
        return ids
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _family(conn: sqlite3.Connection, tape: str) -> list[tuple[int, str]]:
    """The tape and its sidecars: (row id, name)."""
    prefix = tape + SIDECAR_SEP
    return conn.execute(
        "SELECT id, name FROM tapes WHERE name = ? OR substr(name, 1, ?) = ?",
        (tape, len(prefix), prefix),
    ).fetchall()


def _reset(
    conn: sqlite3.Connection,
    tape: str,
    archived: str | None,
    rows: list[tuple],
    carry_after: int | None,
    now: str,
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        session = conn.execute(
            "SELECT id, session_id FROM tapes WHERE name = ?", (tape,)
        ).fetchone()
        if carry_after is not None and session is not None:
            rows = (
                rows
                + conn.execute(
                    "SELECT kind, name, payload, meta, date FROM entries WHERE tape = ? AND id > ?"
                    " AND json_extract(meta, '$.inbound') = 1 ORDER BY id",
                    (session[0], carry_after),
                ).fetchall()
            )
        for row_id, name in _family(conn, tape):
            if archived is not None:
                # Renaming the tape row moves all its entries at once: archive is O(1).
                conn.execute(
                    "UPDATE tapes SET name = ?, role = 'archive', updated = ? WHERE id = ?",
                    (archived + name[len(tape) :], now, row_id),
                )
            else:
                conn.execute("DELETE FROM entries WHERE tape = ?", (row_id,))
                conn.execute("DELETE FROM tapes WHERE id = ?", (row_id,))
        tape_id = _tape_id(conn, tape, session[1] if session else None, now)
        if rows:
            conn.executemany(
                "INSERT INTO entries (tape, id, kind, name, payload, meta, date)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(tape_id, i, *row) for i, row in enumerate(rows, start=1)],
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _stats(conn: sqlite3.Connection, tape: str) -> TapeStats:
    row = conn.execute("SELECT id, session_id FROM tapes WHERE name = ?", (tape,)).fetchone()
    if row is None:
        return TapeStats(tape, None, 0, 0, 0)
    tape_id, session_id = row
    anchors = conn.execute(
        "SELECT count(*) FROM entries WHERE tape = ? AND kind = 'anchor'", (tape_id,)
    ).fetchone()[0]
    return TapeStats(
        tape, session_id, _last_id(conn, tape_id), anchors, _last_anchor(conn, tape_id)
    )


def _anchor_id(conn: sqlite3.Connection, tape_id: int, name: str, after: int = 0) -> int | None:
    row = conn.execute(
        "SELECT max(id) FROM entries WHERE tape = ? AND kind = 'anchor' AND name = ? AND id > ?",
        (tape_id, name, after),
    ).fetchone()
    return row[0] if row else None


def _query(
    conn: sqlite3.Connection,
    tape: str,
    after_last_anchor: bool,
    after_anchor: str | None,
    between: tuple[str, str] | None,
    after_id: int | None,
    before_id: int | None,
    where: str,
    params: list[Any],
    limit: int | None,
    newest_first: bool,
) -> list[TapeEntry]:
    row = conn.execute("SELECT id FROM tapes WHERE name = ?", (tape,)).fetchone()
    if row is None:
        if after_anchor or between:
            raise AnchorNotFound(f"anchor {after_anchor or between[0]!r} not found")  # type: ignore[index]
        return []
    tape_id = row[0]
    lo, hi = after_id or 0, before_id
    if after_last_anchor:
        lo = max(lo, _last_anchor(conn, tape_id))
    if after_anchor is not None:
        found = _anchor_id(conn, tape_id, after_anchor)
        if found is None:
            raise AnchorNotFound(f"anchor {after_anchor!r} not found")
        lo = max(lo, found)
    if between is not None:
        start, end = between
        found = _anchor_id(conn, tape_id, start)
        if found is None:
            raise AnchorNotFound(f"anchor {start!r} not found")
        lo = max(lo, found)
        stop = conn.execute(
            "SELECT min(id) FROM entries WHERE tape = ? AND kind = 'anchor' AND name = ?"
            " AND id > ?",
            (tape_id, end, found),
        ).fetchone()[0]
        if stop is not None:
            hi = stop if hi is None else min(hi, stop)
    sql = "SELECT id, kind, payload, meta, date FROM entries WHERE tape = ? AND id > ?"
    args: list[Any] = [tape_id, lo]
    if hi is not None:
        sql += " AND id < ?"
        args.append(hi)
    if where:
        sql += " AND " + where
        args.extend(params)
    sql += " ORDER BY id DESC" if newest_first else " ORDER BY id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(int(limit))
    return [_row_to_entry(r) for r in conn.execute(sql, args)]


def _list_tapes(conn: sqlite3.Connection, include_all: bool) -> list[TapeSummary]:
    # Per tape: three index lookups (newest entry, its date, anchor count), never a scan.
    sql = (
        "SELECT t.name, t.session_id, coalesce(e.id, 0),"
        " (SELECT count(*) FROM entries a WHERE a.tape = t.id AND a.kind = 'anchor'),"
        " coalesce(e.date, t.updated)"
        " FROM tapes t LEFT JOIN entries e ON e.tape = t.id"
        " AND e.id = (SELECT max(id) FROM entries m WHERE m.tape = t.id)"
    )
    if not include_all:
        sql += " WHERE t.role = 'live'"
    rows = [TapeSummary(*row) for row in conn.execute(sql)]
    return sorted(rows, key=lambda r: r.updated, reverse=True)


def _has_key(conn: sqlite3.Connection, key: str) -> bool:
    return conn.execute("SELECT 1 FROM dedupe WHERE key = ?", (key,)).fetchone() is not None
