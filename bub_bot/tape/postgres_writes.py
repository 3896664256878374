"""PostgreSQL tape store: the write transactions (each runs inside `PostgresTapeStore._write`,
or alone for the common append), and how ids are allocated (see postgres.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from .entries import utc_now
from .forks import lifecycle_events
from .jobs import COLUMNS, Decide, Fired, JobRow, row_job
from .names import SIDECAR_SEP, tape_role
from .postgres_leases import WAITING
from .postgres_usage import USAGE_UPSERT, add_usage, usage_columns
from .query import POSTGRES
from .rows import (
    Append,
    Copies,
    Reset,
    Row,
    check_copy_ids,
    entry_row,
    firing_append,
    fork_base,
    is_inbound,
    with_ids,
)


class Refused(Exception):
    """Raised inside a write transaction to roll it back and return None."""


async def lock_tape(
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


async def allocate_and_insert(
    conn: asyncpg.Connection, tape: str, rows: Sequence[Row], session_id: str | None
) -> list[int] | None:
    """Append `rows` after the tape's last id; their ids, or None if the tape has no row."""
    found = await conn.fetch(_ALLOCATE_AND_INSERT, tape, len(rows), session_id, *_columns(rows))
    return sorted(r[0] for r in found) if found else None


async def allocate_count_and_insert(
    conn: asyncpg.Connection, w: Append, now: str
) -> list[int] | None:
    """`allocate_and_insert` adding `w.adds` in the same statement."""
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


async def append(conn: asyncpg.Connection, w: Append, now: str) -> list[int]:
    tape_id, _ = await lock_tape(conn, w.tape, w.session_id, now)
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
            raise Refused
        if w.bootstrap is not None and not has_anchor:
            rows = [w.bootstrap, *rows]
            skip = 1
    ids: list[int] = []
    if rows:
        written = await allocate_and_insert(conn, w.tape, rows, w.session_id)
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
            raise Refused
    return ids


async def append_copies(conn: asyncpg.Connection, w: Copies) -> None:
    tape_id, last = await lock_tape(conn, w.tape, w.session_id, w.updated)
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


async def reset(conn: asyncpg.Connection, w: Reset, now: str) -> str | None:
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
    await lock_tape(conn, tape, session["session_id"] if session else None, now)
    if rows:
        await allocate_and_insert(conn, tape, rows, None)
    return archived


async def add_job(conn: asyncpg.Connection, row: JobRow, limit: int | None) -> bool:
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


async def fire_jobs(
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
        group = firing_append(job, firing)
        written = None
        if group is not None and firing.entry is not None:
            try:
                async with conn.transaction():  # a savepoint: a recorded key undoes this only
                    ids = await append(conn, group, stamp)
                written = with_ids([firing.entry], ids)[0]
            except Refused:
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
