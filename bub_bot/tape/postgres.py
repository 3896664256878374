"""PostgreSQL tape store: an asyncpg pool; dense per-tape ids under writers in many processes.

Concurrency: ids come from the tape row's `last_id`, moved by an UPDATE in the same statement
(or transaction) that inserts the entries. The UPDATE takes the row's lock and, under READ
COMMITTED, works on the newest committed row once it has it, so writers of one tape — in any
process on any machine — get consecutive ranges one after the other, and writers of different
tapes never wait for each other. A rolled-back write moves nothing: ids stay dense and
gap-free. A plain append is that one statement (one round trip); a group with dedupe keys or
an anchor condition is a transaction that locks the row first (`SELECT … FOR UPDATE`), then
decides. Dedupe keys are a primary key written in the same transaction, so one delivery
reaching two processes is stored once.

Text columns use the "C" collation: dates compare as the ISO strings they are, names and keys
sort by bytes (the same order as SQLite), and `lower()` folds ASCII only, as SQLite's does.
Payload and meta are stored as the JSON text `entries.dumps` made (not jsonb, which would
reorder keys and reject `\\u0000`), so entries round-trip exactly.

Tables are prefixed `bub_` so a database shared with another application stays readable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import asyncpg

from . import postgres_forks
from . import postgres_writes as writes
from .entries import TapeEntry, safe_text, utc_now
from .forks import ForkPoint, Merged
from .jobs import Decide, Fired, JobRow
from .names import archive_name
from .postgres_leases import PostgresLeases
from .postgres_usage import PostgresUsage
from .query import POSTGRES, QuerySpec
from .rows import Append, Copies, Reset, new_tag, row_entry
from .schema import migrate_postgres
from .statements import Statements
from .store import DedupeRecord, Opening, TapeStats, TapeStoreError, TapeSummary
from .store_base import StoreBase
from .urls import parse_database_url
from .views import View, run_views_async

T = TypeVar("T")


class PostgresTapeStore(Statements, PostgresUsage, StoreBase):
    """Tapes in a PostgreSQL database. Open with `await PostgresTapeStore.open(url)`.

    `pool` (an asyncpg pool) is public for parts that share the database (leases); its
    connections are not reset between uses, so leave no session state on them (see
    `_keep_session`).
    """

    kind = "postgresql"
    dialect = POSTGRES

    def __init__(
        self, pool: asyncpg.Pool, location: str, schema_version: int, url: str = ""
    ) -> None:
        self.pool = pool
        self.location = location
        self.schema_version = schema_version
        self._url = url  # for connections outside the pool (the leases' listener)

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, *, pool_size: int = 10) -> Opening[PostgresTapeStore]:
        """Connect (a pool of up to `pool_size` connections), create or upgrade the schema.

        Fails with TapeStoreError naming the host — never the password — when the URL is bad,
        the server unreachable, the credentials wrong or the schema newer than this code.
        """
        return Opening(lambda: cls._open(url, pool_size))

    @classmethod
    async def _open(cls, url: str, pool_size: int) -> PostgresTapeStore:
        try:
            parsed = parse_database_url(url)
        except ValueError as exc:
            raise TapeStoreError(f"cannot open tape database: {exc}") from None
        where = parsed.display
        password = _password(url)

        def fail(exc: BaseException) -> TapeStoreError:
            cause = " ".join(str(exc).split()) or type(exc).__name__
            if password:
                cause = cause.replace(password, "***")
            return TapeStoreError(f"cannot open tape database {where}: {cause}")

        opened: list[PostgresTapeStore] = []

        async def counted(conn: asyncpg.Connection) -> None:
            # Run on every `pool.acquire()`: one round of work (a transaction or a read).
            if opened:
                opened[0].transactions += 1

        try:
            pool = await asyncpg.create_pool(
                url,
                setup=counted,
                min_size=1,
                max_size=max(1, pool_size),
                timeout=10,
                max_inactive_connection_lifetime=300,
                reset=_keep_session,
                # A statement that has not answered in a minute (a partitioned network, a
                # stuck lock) fails instead of hanging a turn forever.
                command_timeout=60,
                # JIT compiles big analytical plans; for these short statements it only
                # adds latency.
                server_settings={"application_name": "bub-bot", "jit": "off"},
            )
        except (
            OSError,
            TimeoutError,
            ValueError,
            OverflowError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
        ) as exc:
            raise fail(exc) from None
        try:
            version = await migrate_postgres(pool)
        except TapeStoreError as exc:
            await pool.close()
            raise TapeStoreError(f"cannot open tape database {where}: {exc}") from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await pool.close()
            raise fail(exc) from None
        opened.append(cls(pool, where, version, url))
        return opened[0]

    def leases(self, owner: str, seconds: float) -> PostgresLeases:
        """Leases in `bub_leases`, shared by every replica on this database (see
        postgres_leases); handover notices arrive on a connection of their own."""

        async def connect() -> asyncpg.Connection:
            return await asyncpg.connect(
                self._url,
                timeout=10,
                server_settings={"application_name": "bub-bot leases"},
            )

        return PostgresLeases(self.pool, connect, owner, seconds)

    async def close(self) -> None:
        """Close the pool (waits briefly for connections in use)."""
        try:
            await asyncio.wait_for(self.pool.close(), 10)
        except TimeoutError:
            self.pool.terminate()

    async def ping(self) -> None:
        """Check the server answers and accepts writes (not a read-only standby)."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT pg_is_in_recovery() AS standby,"
                " current_setting('transaction_read_only') AS read_only"
            )
        if row["standby"] or row["read_only"] == "on":
            raise TapeStoreError(f"tape database {self.location} is read-only")

    async def probe(self) -> None:
        """Write a row and read it back in a transaction that is rolled back."""
        now = utc_now()
        async with self.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                key = f"bub-bot:probe:{now}"
                await conn.execute(
                    "INSERT INTO bub_dedupe (key, tape, entry_id, date) VALUES ($1, '', 0, $2)",
                    key,
                    now,
                )
                found = await conn.fetchval("SELECT date FROM bub_dedupe WHERE key = $1", key)
                if found != now:
                    raise TapeStoreError("a row just written could not be read back")
                # The leases table (several replicas) is there and writable too.
                await conn.execute(
                    "INSERT INTO bub_leases (key, owner, expires) VALUES ($1, 'doctor', now())",
                    key,
                )
            finally:
                await tx.rollback()

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        """Run `fn(conn, *args)` in one transaction; None if it raised Refused. A deadlock or
        serialization failure (rolled back by the server) is retried."""
        for attempt in range(3):
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    return await fn(conn, *args)
            except writes.Refused:
                return None
            except (
                asyncpg.exceptions.DeadlockDetectedError,
                asyncpg.exceptions.SerializationError,
            ):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # -- writes -------------------------------------------------------------------------------
    async def _append(self, append: Append) -> list[int] | None:
        w = append
        simple = not w.dedupe_keys and not w.if_no_anchor and w.bootstrap is None
        if w.rows and simple and w.decide is None:
            # The common append: one statement, one round trip (its own transaction); with
            # counters too (a step's usage with its `run` event).
            for attempt in range(3):
                try:
                    async with self.pool.acquire() as conn:
                        if w.adds:
                            ids = await writes.allocate_count_and_insert(conn, w, utc_now())
                        else:
                            ids = await writes.allocate_and_insert(
                                conn, w.tape, w.rows, w.session_id
                            )
                    break
                except asyncpg.exceptions.DeadlockDetectedError:
                    if attempt == 2:
                        raise
            if ids is not None:
                return ids
            # A new tape: created in the transaction below.
        return await self._write(writes.append, append, utc_now())

    async def _reset(self, reset: Reset) -> str | None:
        return await self._write(writes.reset, reset, utc_now())

    async def _append_copies(self, copies: Copies) -> None:
        await self._write(writes.append_copies, copies)

    # -- forks (tape/forks.py) -----------------------------------------------------------------
    async def fork(self, tape: str, *, tag: str = "", session_id: str | None = None) -> ForkPoint:
        """Fork `tape` and its sidecars at its last id (see TapeStore)."""
        sid = safe_text(session_id) if session_id else None
        forked = await self._write(postgres_forks.fork, tape, tag or new_tag(), sid, utc_now())
        assert forked is not None
        return forked

    async def fork_point(self, name: str) -> ForkPoint | None:
        """The stored fork `name` (None: not a fork, or merged or discarded)."""
        async with self.pool.acquire() as conn:
            return await postgres_forks.fork_point(conn, name)

    async def forks(self, tape: str) -> list[str]:
        """The live forks of `tape`, oldest first."""
        async with self.pool.acquire() as conn:
            return await postgres_forks.forks_of(conn, tape)

    async def merge(self, name: str) -> Merged:
        """Append the fork's entries (and its sidecars') to its parent; drop the fork."""
        merged = await self._write(postgres_forks.merge, name, utc_now())
        assert merged is not None
        return merged

    async def discard(self, name: str, *, archive: bool = False, whole: bool = False) -> str | None:
        """Drop the fork (`whole`: or live tape; or archive it); returns the archive name
        (None without `archive`, or when there was no such tape)."""
        archived = archive_name(name) if archive else None
        found = await self._write(postgres_forks.discard, name, archived, utc_now(), whole)
        return archived if found else None

    async def add_dedupe_records(self, records: Sequence[DedupeRecord]) -> int:
        """Record keys that are not recorded yet; returns how many were new."""
        if not records:
            return 0
        async with self.pool.acquire() as conn:
            status = await conn.execute(
                "INSERT INTO bub_dedupe (key, tape, entry_id, date)"
                " SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])"
                " ON CONFLICT DO NOTHING",
                [safe_text(r.key) for r in records],
                [r.tape for r in records],
                [r.entry_id for r in records],
                [r.date for r in records],
            )
        return int(status.split()[-1])

    # -- statements (tape/statements.py) ------------------------------------------------------
    async def _rows(self, sql: str, args: list[Any], *, write: bool = False) -> list[Any]:
        async with self.pool.acquire() as conn:
            return await conn.fetch(sql, *args)  # one statement: its own transaction

    async def _insert_job(self, row: JobRow, limit: int | None) -> bool:
        return bool(await self._write(writes.add_job, row, limit))

    async def _claim_jobs(
        self, now: float, decide: Decide, kinds: list[str], channels: list[str], limit: int
    ) -> list[Fired]:
        # Rows another replica is firing are skipped (`FOR UPDATE SKIP LOCKED`).
        return await self._write(writes.fire_jobs, now, decide, kinds, channels, limit) or []

    # -- reads --------------------------------------------------------------------------------
    async def stats(self, tape: str) -> TapeStats:
        """Entry and anchor counters for a tape (zeros for a tape never written)."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT t.session_id,"
                " coalesce((SELECT max(id) FROM bub_entries WHERE tape = t.id), t.base)"
                " AS entries,"
                " (SELECT count(*) FROM bub_entries WHERE tape = t.id AND kind = 'anchor')"
                " AS anchors,"
                " (SELECT coalesce(max(id), 0) FROM bub_entries"
                " WHERE tape = t.id AND kind = 'anchor') AS last_anchor"
                " FROM bub_tapes t WHERE t.name = $1",
                tape,
            )
        if row is None:
            return TapeStats(tape, None, 0, 0, 0)
        return TapeStats(
            tape, row["session_id"], row["entries"], row["anchors"], row["last_anchor"]
        )

    async def _select(self, spec: QuerySpec) -> list[TapeEntry]:
        async with self.pool.acquire() as conn:
            return await _select(conn, spec)

    async def query_many(self, tape: str, views: Sequence[View]) -> list[list[TapeEntry]]:
        """Several queries of `tape` on one connection, one read-only REPEATABLE READ
        transaction (one snapshot: the queue and the context agree), counted once."""
        async with self.pool.acquire() as conn:
            if len(views) < 2:
                # One statement is one snapshot already: no BEGIN/COMMIT round trips.
                return await run_views_async(tape, views, partial(_select, conn))
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await run_views_async(tape, views, partial(_select, conn))

    async def list_tapes(self, *, include_all: bool = False) -> list[TapeSummary]:
        """Live tapes, most recently active first (sidecars and archives only with include_all)."""
        # Per tape: the newest entry and the anchor count, both from indexes; never a scan.
        sql = (
            "SELECT t.name, t.session_id, coalesce(l.id, 0),"
            " (SELECT count(*) FROM bub_entries a WHERE a.tape = t.id AND a.kind = 'anchor'),"
            " coalesce(l.date, t.updated)"
            " FROM bub_tapes t LEFT JOIN LATERAL (SELECT id, date FROM bub_entries e"
            " WHERE e.tape = t.id ORDER BY id DESC LIMIT 1) l ON TRUE"
        )
        if not include_all:
            sql += " WHERE t.role = 'live'"
        async with self.pool.acquire() as conn:
            rows = [TapeSummary(*r) for r in await conn.fetch(sql)]
        return sorted(rows, key=lambda r: (r.updated, r.name), reverse=True)


# -- SQL helpers --------------------------------------------------------------------------------
async def _select(conn: asyncpg.Connection, spec: QuerySpec) -> list[TapeEntry]:
    """The entries `spec` selects, read on `conn`."""
    start = spec.start_anchor
    if start is None:
        # The hot path (read_context): one statement, index lookups only.
        sql, args = POSTGRES.entries(spec, spec.tape, spec.after_id, spec.before_id, by_name=True)
    else:
        end = safe_text(spec.between[1]) if spec.between else None
        found = await conn.fetchrow(POSTGRES.anchors(), spec.tape, safe_text(start), end)
        sql, args = POSTGRES.entries(spec, *spec.anchored(found))
    return [row_entry(*r) for r in await conn.fetch(sql, *args)]


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset without asyncpg's `RESET ALL; UNLISTEN *; …` round trip on every release.

    asyncpg still rolls back an open transaction and drops listeners. This is safe because
    nothing here leaves session state on a pooled connection: locks are transaction-scoped.
    Code sharing the pool must do the same (SET LOCAL, pg_advisory_xact_lock; LISTEN on a
    connection of its own).
    """


def _password(url: str) -> str:
    try:
        return unquote(urlsplit(url).password or "")
    except ValueError:
        return ""
