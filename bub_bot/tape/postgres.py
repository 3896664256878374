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
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import asyncpg

from . import postgres_forks
from .entries import TapeEntry, safe_text, utc_now
from .forks import ForkPoint, Merged, lifecycle_events
from .jobs import COLUMNS, Decide, Fired, JobRow, row_job
from .names import SIDECAR_SEP, archive_name, tape_role
from .postgres_leases import WAITING, PostgresLeases
from .postgres_usage import USAGE_UPSERT, PostgresUsage, add_usage, usage_columns
from .query import POSTGRES, QuerySpec
from .schema import migrate_postgres
from .statements import Statements
from .store import (
    Append,
    Copies,
    DedupeRecord,
    Opening,
    Reset,
    Row,
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
from .urls import parse_database_url

T = TypeVar("T")


class _Refused(Exception):
    """Raised inside a write transaction to roll it back and return None."""


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

        try:
            pool = await asyncpg.create_pool(
                url,
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
        return cls(pool, where, version, url)

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
        """Run `fn(conn, *args)` in one transaction; None if it raised _Refused. A deadlock or
        serialization failure (rolled back by the server) is retried."""
        for attempt in range(3):
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    return await fn(conn, *args)
            except _Refused:
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
                            ids = await _allocate_count_and_insert(conn, w, utc_now())
                        else:
                            ids = await _allocate_and_insert(conn, w.tape, w.rows, w.session_id)
                    break
                except asyncpg.exceptions.DeadlockDetectedError:
                    if attempt == 2:
                        raise
            if ids is not None:
                return ids
            # A new tape: created in the transaction below.
        return await self._write(_append, append, utc_now())

    async def _reset(self, reset: Reset) -> str | None:
        return await self._write(_reset, reset, utc_now())

    async def _append_copies(self, copies: Copies) -> None:
        await self._write(_append_copies, copies)

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
        return bool(await self._write(_add_job, row, limit))

    async def _claim_jobs(
        self, now: float, decide: Decide, kinds: list[str], channels: list[str], limit: int
    ) -> list[Fired]:
        # Rows another replica is firing are skipped (`FOR UPDATE SKIP LOCKED`).
        return await self._write(_fire_jobs, now, decide, kinds, channels, limit) or []

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
            start = spec.start_anchor
            if start is None:
                # The hot path (read_context): one statement, index lookups only.
                sql, args = POSTGRES.entries(
                    spec, spec.tape, spec.after_id, spec.before_id, by_name=True
                )
            else:
                end = safe_text(spec.between[1]) if spec.between else None
                found = await conn.fetchrow(POSTGRES.anchors(), spec.tape, safe_text(start), end)
                sql, args = POSTGRES.entries(spec, *spec.anchored(found))
            return [row_entry(*r) for r in await conn.fetch(sql, *args)]

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


async def _lock_tape(
    conn: asyncpg.Connection, tape: str, session_id: str | None, now: str
) -> tuple[int, int]:
    """Lock the tape's row for this transaction (creating it if needed); (row id, last id)."""
    select = "SELECT id, session_id, last_id FROM bub_tapes WHERE name = $1 FOR UPDATE"
    row = await conn.fetchrow(select, tape)
    if row is None:
        # A new row is ours alone until commit; a concurrent creator waits on the unique
        # index, finds the conflict, and locks the row we committed.
        tape_id = await conn.fetchval(
            "INSERT INTO bub_tapes (name, role, session_id, created, updated)"
            " VALUES ($1, $2, $3, $4, $4) ON CONFLICT (name) DO NOTHING RETURNING id",
            tape,
            tape_role(tape),
            session_id,
            now,
        )
        if tape_id is not None:
            return tape_id, 0
        row = await conn.fetchrow(select, tape)
        assert row is not None
    if session_id and row["session_id"] is None:
        await conn.execute(
            "UPDATE bub_tapes SET session_id = $1 WHERE id = $2", session_id, row["id"]
        )
    return row["id"], row["last_id"]


def _columns(rows: Sequence[Row]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * 5


# Id allocation and insert in one statement. The UPDATE takes the tape row's lock and, under
# READ COMMITTED, re-reads the row's newest committed version once it has the lock, so
# `last_id` is never stale: concurrent writers of one tape get consecutive ranges. Run alone
# (autocommit) it is a whole append in one round trip. No row (a new tape): no entries.
_ALLOCATE_AND_INSERT = (
    "WITH t AS (UPDATE bub_tapes SET last_id = last_id + $2,"
    " session_id = coalesce(session_id, $3) WHERE name = $1 RETURNING id, last_id)"
    " INSERT INTO bub_entries (tape, id, kind, name, payload, meta, date)"
    " SELECT t.id, t.last_id - $2 + r.n, r.kind, r.name, r.payload, r.meta, r.date"
    " FROM t, unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[])"
    " WITH ORDINALITY AS r(kind, name, payload, meta, date, n)"
    " RETURNING id"
)


# The common append with counters, in one statement (one round trip, atomic): the counters
# are added only when the tape row exists (`t` returned it), so the fallback for a new tape
# cannot count twice.
_ALLOCATE_COUNT_AND_INSERT = _ALLOCATE_AND_INSERT.replace(
    " INSERT INTO bub_entries",
    ", u AS ("
    + USAGE_UPSERT.format(
        now="$16",
        arrays="$9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::bigint[],"
        " $14::bigint[], $15::bigint[]",
        where=" WHERE EXISTS (SELECT 1 FROM t)",
    )
    + ") INSERT INTO bub_entries",
    1,
)


async def _allocate_and_insert(
    conn: asyncpg.Connection, tape: str, rows: Sequence[Row], session_id: str | None
) -> list[int] | None:
    """Append `rows` after the tape's last id; their ids, or None if the tape has no row."""
    found = await conn.fetch(_ALLOCATE_AND_INSERT, tape, len(rows), session_id, *_columns(rows))
    return sorted(r[0] for r in found) if found else None


async def _allocate_count_and_insert(
    conn: asyncpg.Connection, w: Append, now: str
) -> list[int] | None:
    """`_allocate_and_insert` adding `w.adds` in the same statement."""
    found = await conn.fetch(
        _ALLOCATE_COUNT_AND_INSERT,
        w.tape,
        len(w.rows),
        w.session_id,
        *_columns(w.rows),
        *usage_columns(w.adds),
        now,
    )
    return sorted(r[0] for r in found) if found else None


async def _append(conn: asyncpg.Connection, w: Append, now: str) -> list[int]:
    tape_id, _ = await _lock_tape(conn, w.tape, w.session_id, now)
    rows, skip = w.rows, 0
    if w.adds:
        # In the append's transaction (rolled back with it when a dedupe key refuses it).
        found = await add_usage(conn, w.adds, now)
        if w.decide is not None:
            rows = w.decide(found) or rows
    if w.if_no_anchor or w.bootstrap is not None:
        # A statement after the lock: it sees every entry committed before we got it.
        has_anchor = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM bub_entries WHERE tape = $1 AND kind = 'anchor')",
            tape_id,
        )
        if w.if_no_anchor and has_anchor:
            raise _Refused
        if w.bootstrap is not None and not has_anchor:
            rows = [w.bootstrap, *rows]
            skip = 1
    ids: list[int] = []
    if rows:
        written = await _allocate_and_insert(conn, w.tape, rows, w.session_id)
        assert written is not None  # the row exists: we hold its lock
        ids = written[skip:]
    if w.dedupe_keys:
        # The primary key is the guard: a key recorded (or being recorded) by any other
        # transaction makes this insert skip it, and the whole group rolls back.
        status = await conn.execute(
            "INSERT INTO bub_dedupe (key, tape, entry_id, date)"
            " SELECT k, $2, $3, $4 FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING",
            w.dedupe_keys,
            w.tape,
            ids[0] if ids else 0,
            now,
        )
        if int(status.split()[-1]) != len(w.dedupe_keys):
            raise _Refused
    return ids


async def _append_copies(conn: asyncpg.Connection, w: Copies) -> None:
    tape_id, last = await _lock_tape(conn, w.tape, w.session_id, w.updated)
    if last == 0 and fork_base(w.tape, w.entries):
        # A fork's own entries go on from its fork point (tape/forks.py).
        last = fork_base(w.tape, w.entries)
        await conn.execute(
            "UPDATE bub_tapes SET base = $2, last_id = $2 WHERE id = $1", tape_id, last
        )
    check_copy_ids(w.tape, w.entries, last)
    if w.rows:
        await conn.execute(
            "INSERT INTO bub_entries (tape, id, kind, name, payload, meta, date)"
            " SELECT $1, r.* FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[],"
            " $6::text[], $7::text[]) AS r",
            tape_id,
            [e.id for e in w.entries],
            *_columns(w.rows),
        )
        await conn.execute(
            "UPDATE bub_tapes SET last_id = $2 WHERE id = $1", tape_id, w.entries[-1].id
        )


async def _reset(conn: asyncpg.Connection, w: Reset, now: str) -> str | None:
    tape, archived, carry_after = w.tape, w.archived, w.carry_inbound_after
    # Lock the tape and its sidecars (in id order, as every reset does) for the transaction.
    family = await conn.fetch(
        "SELECT id, name, session_id FROM bub_tapes"
        " WHERE name = $1 OR starts_with(name, $2) ORDER BY id FOR UPDATE",
        tape,
        tape + SIDECAR_SEP,
    )
    session = next((r for r in family if r["name"] == tape), None)
    if session is None:
        archived = None  # never written: nothing to archive
    rows = w.rows(archived)
    if carry_after is not None and session is not None:
        later = await conn.fetch(
            "SELECT kind, name, payload, meta, date FROM bub_entries"
            " WHERE tape = $1 AND id > $2 AND strpos(meta, '\"inbound\":') > 0 ORDER BY id",
            session["id"],
            carry_after,
        )
        rows = rows + [tuple(r) for r in later if is_inbound(r["meta"])]  # type: ignore[misc]
    sidecars = [r["name"] for r in family if r["name"] != tape]
    if session is not None and sidecars:
        rows = rows + [entry_row(e) for e in lifecycle_events(tape, sidecars, archived, reset=True)]
    ids = [r["id"] for r in family]
    if ids and archived is not None:
        # Renaming the tape rows moves all their entries at once: archive is O(1).
        await conn.execute(
            "UPDATE bub_tapes SET name = $1 || substr(name, $2), role = 'archive', updated = $3"
            " WHERE id = ANY($4::bigint[])",
            archived,
            len(tape) + 1,
            now,
            ids,
        )
    elif ids:
        await conn.execute("DELETE FROM bub_entries WHERE tape = ANY($1::bigint[])", ids)
        await conn.execute("DELETE FROM bub_tapes WHERE id = ANY($1::bigint[])", ids)
    await _lock_tape(conn, tape, session["session_id"] if session else None, now)
    if rows:
        await _allocate_and_insert(conn, tape, rows, None)
    return archived


async def _add_job(conn: asyncpg.Connection, row: JobRow, limit: int | None) -> bool:
    if limit is not None:
        # One session's adds one at a time, so two at once cannot both pass the count.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('bub_jobs:' || $1))", row[2])
        count = await conn.fetchval(
            "SELECT count(*) FROM bub_jobs WHERE session_id = $1 AND kind = $2", row[2], row[1]
        )
        if count >= limit:
            return False
    await conn.execute(
        f"INSERT INTO bub_jobs ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,"
        " $11, $12)",
        *row,
    )
    return True


async def _fire_jobs(
    conn: asyncpg.Connection,
    now: float,
    decide: Decide,
    kinds: list[str],
    channels: list[str],
    limit: int,
) -> list[Fired]:
    stamp = utc_now()
    sql, args = POSTGRES.due_jobs(now, kinds, channels, limit)
    rows = await conn.fetch(sql, *args)
    fired: list[Fired] = []
    # Tapes are locked in name order, so two replicas firing jobs of the same tapes never
    # wait for each other in a circle.
    for job in sorted(map(row_job, rows), key=lambda j: (j.tape, j.due, j.id)):
        firing = decide(job)
        append = firing_append(job, firing)
        written = None
        if append is not None and firing.entry is not None:
            try:
                async with conn.transaction():  # a savepoint: a recorded key undoes this only
                    ids = await _append(conn, append, stamp)
                written = with_ids([firing.entry], ids)[0]
            except _Refused:
                pass
        fired.append(Fired(job, firing, written))
    finished = [f.job.id for f in fired if f.firing.next_due is None]
    moved = [f for f in fired if f.firing.next_due is not None]
    if finished:
        await conn.execute("DELETE FROM bub_jobs WHERE id = ANY($1::text[])", finished)
    if moved:
        await conn.execute(
            "UPDATE bub_jobs AS j SET due = m.due, fired = j.fired + 1"
            " FROM unnest($1::text[], $2::float8[]) AS m(id, due) WHERE j.id = m.id",
            [f.job.id for f in moved],
            [f.firing.next_due for f in moved],
        )
    waiting = sorted({(f.job.tape, f.job.session_id) for f in fired if f.entry is not None})
    if waiting:
        await conn.execute(WAITING, [t for t, _ in waiting], [s for _, s in waiting])
    return fired
