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
from . import sqlite_writes as writes
from .entries import TapeEntry, safe_text, utc_now
from .forks import ForkPoint, Merged
from .jobs import Decide, Fired, JobRow
from .names import archive_name
from .query import SQLITE, QuerySpec
from .rows import Append, Copies, Reset, new_tag, row_entry
from .schema import SQLITE_VERSION, migrate_sqlite
from .sqlite_usage import SQLiteUsage
from .statements import Statements
from .store import DedupeRecord, Opening, TapeStats, TapeStoreError, TapeSummary
from .store_base import StoreBase
from .views import View, run_views

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
        self.transactions += 1
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
        return await self._run(writes.append, append, utc_now())

    async def _reset(self, reset: Reset) -> str | None:
        return await self._run(writes.reset, reset, utc_now())

    async def _append_copies(self, copies: Copies) -> None:
        await self._run(writes.append_copies, copies)

    async def add_dedupe_records(self, records: Sequence[DedupeRecord]) -> int:
        """Record keys that are not recorded yet; returns how many were new."""
        return await self._run(writes.add_dedupe, list(records))

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
        return await self._run(writes.statement_rows, sql, args, write)

    async def _insert_job(self, row: JobRow, limit: int | None) -> bool:
        return await self._run(writes.add_job, row, limit)

    async def _claim_jobs(
        self, now: float, decide: Decide, kinds: list[str], channels: list[str], limit: int
    ) -> list[Fired]:
        return await self._run(writes.fire_jobs, now, decide, kinds, channels, limit)

    # -- reads --------------------------------------------------------------------------------
    async def stats(self, tape: str) -> TapeStats:
        """Entry and anchor counters for a tape (zeros for a tape never written)."""
        return await self._run(_stats, tape)

    async def _select(self, spec: QuerySpec) -> list[TapeEntry]:
        return await self._run(_query, spec)

    async def query_many(self, tape: str, views: Sequence[View]) -> list[list[TapeEntry]]:
        """Several queries of `tape` in one trip to the database thread (see TapeStore)."""
        return await self._run(lambda c: run_views(tape, views, lambda s: _query(c, s)))

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


def _stats(conn: sqlite3.Connection, tape: str) -> TapeStats:
    row = conn.execute("SELECT id, session_id FROM tapes WHERE name = ?", (tape,)).fetchone()
    if row is None:
        return TapeStats(tape, None, 0, 0, 0)
    tape_id, session_id = row
    anchors = conn.execute(
        "SELECT count(*) FROM entries WHERE tape = ? AND kind = 'anchor'", (tape_id,)
    ).fetchone()[0]
    return TapeStats(
        tape,
        session_id,
        sqlite_forks.last_id(conn, tape_id),
        anchors,
        writes.last_anchor(conn, tape_id),
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
