"""SQLite tape store: WAL, one writer, dense per-tape ids, one transaction per write group.

Every operation is one function run on aiosqlite's worker thread, so a whole transaction
(BEGIN IMMEDIATE ... COMMIT) costs one thread hop and can never interleave with another.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from ..hardening import create_private_file, database_files, private_dir, private_files
from . import sqlite_forks
from .entries import TapeEntry, safe_text, utc_now
from .forks import ForkPoint, Merged, lifecycle_events
from .jobs import COLUMNS, Decide, Fired, JobRow, row_job
from .names import SIDECAR_SEP, archive_name, tape_role
from .query import SQLITE, QuerySpec
from .schema import SQLITE_VERSION, migrate_sqlite
from .sqlite_usage import SQLiteUsage, add_usage
from .statements import Statements
from .store import (
    Append,
    Copies,
    DedupeRecord,
    Opening,
    Reset,
    StoreBase,
    TapeStats,
    TapeStoreError,
    TapeSummary,
    check_copy_ids,
    entry_row,
    firing_append,
    fork_base,
    is_inbound,
    new_tag,
    row_entry,
    with_ids,
)

T = TypeVar("T")


class SQLiteTapeStore(Statements, SQLiteUsage, StoreBase):
    """Tapes in one SQLite file. Open with `await SQLiteTapeStore.open(path)` or `async with`."""

    kind = "sqlite"
    dialect = SQLITE

    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        self._conn = conn
        self.path = path
        self.location = path
        self.schema_version = SQLITE_VERSION

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> Opening[SQLiteTapeStore]:
        """Open (creating if needed) the database at `path`; fail with one clear line if not.

        `store = await SQLiteTapeStore.open(path)`, or `async with SQLiteTapeStore.open(path)
        as store:` (closed on exit).
        """
        return Opening(lambda: cls._open(path))

    @classmethod
    async def _open(cls, path: str | Path) -> SQLiteTapeStore:
        location = str(path)
        if location != ":memory:":
            database = Path(location).expanduser()
            try:
                # Every conversation's tape: the directory 0700 and the files 0600 (also
                # the -wal/-shm SQLite makes, which take the database file's mode).
                private_dir(database.parent)
                create_private_file(database)
                private_files(database_files(database))
            except OSError as exc:
                raise TapeStoreError(f"cannot open tape database {location}: {exc}") from None
            location = str(database)
        try:
            conn = await aiosqlite.connect(location, isolation_level=None, timeout=10)
        except sqlite3.Error as exc:
            raise TapeStoreError(f"cannot open tape database {location}: {exc}") from None
        store = cls(conn, location)
        try:
            await store._run(migrate_sqlite)
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

    async def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        await self._conn.close()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # aiosqlite runs `fn(sqlite3_connection, *args)` on its worker thread: one hop per
        # transaction instead of one per statement.
        return await self._conn._execute(lambda: fn(self._conn._conn, *args))

    async def ping(self) -> None:
        """Check the database is writable (takes and releases the write lock)."""
        try:
            await self._run(_ping)
        except sqlite3.Error as exc:
            raise TapeStoreError(f"tape database {self.location}: {exc}") from None

    async def probe(self) -> None:
        """Write a row and read it back in a transaction that is rolled back."""
        try:
            await self._run(_probe, utc_now())
        except sqlite3.Error as exc:
            raise TapeStoreError(f"tape database {self.location}: {exc}") from None

    # -- writes -------------------------------------------------------------------------------
    async def _append(self, append: Append) -> list[int] | None:
        return await self._run(_append, append, utc_now())

    async def _reset(self, reset: Reset) -> str | None:
        return await self._run(_reset, reset, utc_now())

    async def _append_copies(self, copies: Copies) -> None:
        await self._run(_append_copies, copies)

    async def add_dedupe_records(self, records: Sequence[DedupeRecord]) -> int:
        """Record keys that are not recorded yet; returns how many were new."""
        return await self._run(_add_dedupe, list(records))

    # -- forks (tape/forks.py) ---------------------------------------------------------------
    async def fork(self, tape: str, *, tag: str = "", session_id: str | None = None) -> ForkPoint:
        """Fork `tape` and its sidecars at its last id (see TapeStore)."""
        return await self._run(
            sqlite_forks.fork,
            tape,
            tag or new_tag(),
            safe_text(session_id) if session_id else None,
            utc_now(),
        )

    async def fork_point(self, name: str) -> ForkPoint | None:
        """The stored fork `name` (None: not a fork, or merged or discarded)."""
        return await self._run(sqlite_forks.fork_point, name)

    async def forks(self, tape: str) -> list[str]:
        """The live forks of `tape`, oldest first."""
        return await self._run(sqlite_forks.forks_of, tape)

    async def merge(self, name: str) -> Merged:
        """Append the fork's entries (and its sidecars') to its parent; drop the fork."""
        return await self._run(sqlite_forks.merge, name, utc_now())

    async def discard(self, name: str, *, archive: bool = False, whole: bool = False) -> str | None:
        """Drop the fork (`whole`: or live tape; or archive it); returns the archive name
        (None without `archive`, or when there was no such tape)."""
        archived = archive_name(name) if archive else None
        found = await self._run(sqlite_forks.discard, name, archived, utc_now(), whole)
        return archived if found else None

    # -- statements (tape/statements.py) ------------------------------------------------------
    async def _rows(self, sql: str, args: list[Any], *, write: bool = False) -> list[Any]:
        return await self._run(_rows, sql, args, write)

    async def _insert_job(self, row: JobRow, limit: int | None) -> bool:
        return await self._run(_add_job, row, limit)

    async def _claim_jobs(
        self, now: float, decide: Decide, kinds: list[str], channels: list[str], limit: int
    ) -> list[Fired]:
        return await self._run(_fire_jobs, now, decide, kinds, channels, limit)

    # -- reads --------------------------------------------------------------------------------
    async def stats(self, tape: str) -> TapeStats:
        """Entry and anchor counters for a tape (zeros for a tape never written)."""
        return await self._run(_stats, tape)

    async def _select(self, spec: QuerySpec) -> list[TapeEntry]:
        return await self._run(_query, spec)

    async def list_tapes(self, *, include_all: bool = False) -> list[TapeSummary]:
        """Live tapes, most recently active first (sidecars and archives only with include_all)."""
        return await self._run(_list_tapes, include_all)


# -- functions run on the database thread --------------------------------------------------
def _ping(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ROLLBACK")


def _probe(conn: sqlite3.Connection, now: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        key = f"bub-bot:probe:{now}"
        conn.execute(
            "INSERT INTO dedupe (key, tape, entry_id, date) VALUES (?, '', 0, ?)", (key, now)
        )
        row = conn.execute("SELECT date FROM dedupe WHERE key = ?", (key,)).fetchone()
        if row is None or row[0] != now:
            raise TapeStoreError("a row just written could not be read back")
    finally:
        conn.execute("ROLLBACK")


def _tape_id(
    conn: sqlite3.Connection, tape: str, session_id: str | None, now: str, updated: str = ""
) -> int:
    """The tape's row id, creating the row (and filling a missing session id) as needed."""
    row = conn.execute("SELECT id, session_id FROM tapes WHERE name = ?", (tape,)).fetchone()
    if row is not None:
        if session_id and row[1] is None:
            conn.execute("UPDATE tapes SET session_id = ? WHERE id = ?", (session_id, row[0]))
        return row[0]
    cur = conn.execute(
        "INSERT INTO tapes (name, role, session_id, created, updated) VALUES (?, ?, ?, ?, ?)",
        (tape, tape_role(tape), session_id, updated or now, updated or now),
    )
    return cur.lastrowid  # type: ignore[return-value]


_last_id = sqlite_forks.last_id


def _last_anchor(conn: sqlite3.Connection, tape_id: int) -> int:
    return conn.execute(
        "SELECT coalesce(max(id), 0) FROM entries WHERE tape = ? AND kind = 'anchor'", (tape_id,)
    ).fetchone()[0]


_INSERT = (
    "INSERT INTO entries (tape, id, kind, name, payload, meta, date) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _append(conn: sqlite3.Connection, w: Append, now: str) -> list[int] | None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        ids = _append_rows(conn, w, now)
        conn.execute("COMMIT" if ids is not None else "ROLLBACK")
        return ids
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _append_rows(conn: sqlite3.Connection, w: Append, now: str) -> list[int] | None:
    """The append inside a transaction; None (having written nothing) when it refuses."""
    if w.dedupe_keys:
        marks = ",".join("?" * len(w.dedupe_keys))
        seen = conn.execute(f"SELECT 1 FROM dedupe WHERE key IN ({marks})", w.dedupe_keys)
        if seen.fetchone() is not None:
            return None
    tape_id = _tape_id(conn, w.tape, w.session_id, now)
    last_id = _last_id(conn, tape_id)
    has_anchor = (w.if_no_anchor or w.bootstrap is not None) and _last_anchor(conn, tape_id) > 0
    if w.if_no_anchor and has_anchor:
        return None
    rows, skip = w.rows, 0
    if w.adds:
        # In the append's transaction: the counters move exactly when the entries are written.
        found = add_usage(conn, w.adds, now)
        if w.decide is not None:
            rows = w.decide(found) or rows
    if w.bootstrap is not None and not has_anchor:
        rows = [w.bootstrap, *rows]
        skip = 1
    ids = list(range(last_id + 1, last_id + 1 + len(rows)))
    conn.executemany(_INSERT, [(tape_id, i, *row) for i, row in zip(ids, rows, strict=True)])
    ids = ids[skip:]
    if w.dedupe_keys:
        first_id = ids[0] if ids else 0
        conn.executemany(
            "INSERT INTO dedupe (key, tape, entry_id, date) VALUES (?, ?, ?, ?)",
            [(key, w.tape, first_id, now) for key in w.dedupe_keys],
        )
    return ids


def _add_job(conn: sqlite3.Connection, row: JobRow, limit: int | None) -> bool:
    conn.execute("BEGIN IMMEDIATE")
    try:
        if limit is not None:
            count = conn.execute(
                "SELECT count(*) FROM jobs WHERE session_id = ? AND kind = ?", (row[2], row[1])
            ).fetchone()[0]
            if count >= limit:
                conn.execute("ROLLBACK")
                return False
        conn.execute(f"INSERT INTO jobs ({COLUMNS}) VALUES ({','.join('?' * len(row))})", row)
        conn.execute("COMMIT")
        return True
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _rows(conn: sqlite3.Connection, sql: str, args: list[Any], write: bool) -> list[Any]:
    if not write:
        return conn.execute(sql, args).fetchall()
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = conn.execute(sql, args).fetchall()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return rows


def _fire_jobs(
    conn: sqlite3.Connection,
    now: float,
    decide: Decide,
    kinds: list[str],
    channels: list[str],
    limit: int,
) -> list[Fired]:
    stamp = utc_now()
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Under the write lock: a job another process fired a moment ago has moved on.
        rows = conn.execute(*SQLITE.due_jobs(now, kinds, channels, limit)).fetchall()
        fired: list[Fired] = []
        for job in map(row_job, rows):
            firing = decide(job)
            append = firing_append(job, firing)
            written = None
            if append is not None and firing.entry is not None:
                ids = _append_rows(conn, append, stamp)
                written = None if ids is None else with_ids([firing.entry], ids)[0]
            if firing.next_due is None:
                conn.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
            else:
                conn.execute(
                    "UPDATE jobs SET due = ?, fired = fired + 1 WHERE id = ?",
                    (firing.next_due, job.id),
                )
            fired.append(Fired(job, firing, written))
        conn.execute("COMMIT")
        return fired
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _append_copies(conn: sqlite3.Connection, w: Copies) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        tape_id = _tape_id(conn, w.tape, w.session_id, w.updated, w.updated)
        last = _last_id(conn, tape_id)
        if last == 0 and fork_base(w.tape, w.entries):
            # A fork's own entries go on from its fork point (tape/forks.py).
            last = fork_base(w.tape, w.entries)
            conn.execute("UPDATE tapes SET base = ? WHERE id = ?", (last, tape_id))
        check_copy_ids(w.tape, w.entries, last)
        conn.executemany(
            _INSERT, [(tape_id, e.id, *row) for e, row in zip(w.entries, w.rows, strict=True)]
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _add_dedupe(conn: sqlite3.Connection, records: list[DedupeRecord]) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = conn.total_changes
        conn.executemany(
            "INSERT OR IGNORE INTO dedupe (key, tape, entry_id, date) VALUES (?, ?, ?, ?)",
            [(safe_text(r.key), r.tape, r.entry_id, r.date) for r in records],
        )
        added = conn.total_changes - before
        conn.execute("COMMIT")
        return added
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


def _reset(conn: sqlite3.Connection, w: Reset, now: str) -> str | None:
    tape, archived, carry_after = w.tape, w.archived, w.carry_inbound_after
    conn.execute("BEGIN IMMEDIATE")
    try:
        session = conn.execute(
            "SELECT id, session_id FROM tapes WHERE name = ?", (tape,)
        ).fetchone()
        if session is None:
            archived = None  # never written: nothing to archive
        rows = w.rows(archived)
        if carry_after is not None and session is not None:
            later = conn.execute(
                "SELECT kind, name, payload, meta, date FROM entries WHERE tape = ? AND id > ?"
                " AND instr(meta, '\"inbound\":') > 0 ORDER BY id",
                (session[0], carry_after),
            )
            rows = rows + [r for r in later if is_inbound(r[3])]
        family = _family(conn, tape)
        sidecars = [name for _, name in family if name != tape]
        if session is not None and sidecars:
            events = lifecycle_events(tape, sidecars, archived, reset=True)
            rows = rows + [entry_row(e) for e in events]
        for row_id, name in family:
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
            conn.executemany(_INSERT, [(tape_id, i, *row) for i, row in enumerate(rows, start=1)])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return archived


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


def _query(conn: sqlite3.Connection, spec: QuerySpec) -> list[TapeEntry]:
    start = spec.start_anchor
    if start is None:
        # The common read (read_context): one statement, index lookups only.
        sql, args = SQLITE.entries(spec, spec.tape, spec.after_id, spec.before_id, by_name=True)
    else:
        end = safe_text(spec.between[1]) if spec.between else None
        found = conn.execute(SQLITE.anchors(), (spec.tape, safe_text(start), end)).fetchone()
        sql, args = SQLITE.entries(spec, *spec.anchored(found))
    return [row_entry(*r) for r in conn.execute(sql, args)]


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
    return sorted(rows, key=lambda r: (r.updated, r.name), reverse=True)
