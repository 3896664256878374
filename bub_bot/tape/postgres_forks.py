"""Fork, merge and discard on PostgreSQL (see tape/forks.py): each one transaction.

A fork's row starts with `last_id = base`, so its own entries continue at the fork point
through the same id allocation every append uses. A merge allocates the parent's ids with
the UPDATE every writer of that tape takes in turn: an append racing the merge gets the ids
before or after the merged range, never inside it.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from .forks import ForkError, ForkPoint, Merged, merge_events, sidecar_suffix
from .names import SIDECAR_SEP, fork_name, tape_role
from .rows import entry_row

_TAPE = (
    "INSERT INTO bub_tapes (name, role, session_id, created, updated, parent, base, last_id)"
    " VALUES ($1, $2, $3, $4, $4, $5, $6, $6) ON CONFLICT (name) DO NOTHING"
)


async def _row(conn: asyncpg.Connection, name: str, session_id: str | None, now: str) -> None:
    await conn.execute(_TAPE, name, tape_role(name), session_id, now, None, 0)


async def _sidecars(conn: asyncpg.Connection, tape: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT id, name, parent, base, last_id FROM bub_tapes WHERE starts_with(name, $1)"
        " ORDER BY id FOR UPDATE",
        tape + SIDECAR_SEP,
    )


async def fork(
    conn: asyncpg.Connection, tape: str, tag: str, session_id: str | None, now: str
) -> ForkPoint:
    """Make fork `tag` of `tape` (and of its sidecars) at the tape's last id."""
    await _row(conn, tape, session_id, now)
    # FOR SHARE: the fork point is the last id committed; appends wait for our commit.
    base = await conn.fetchval("SELECT last_id FROM bub_tapes WHERE name = $1 FOR SHARE", tape)
    name = fork_name(tape, tag)
    await conn.execute(_TAPE, name, "fork", session_id, now, tape, base)
    sidecars: dict[str, int] = {}
    for row in await _sidecars(conn, tape):
        own = name + row["name"][len(tape) :]
        await conn.execute(_TAPE, own, "sidecar", session_id, now, row["name"], row["last_id"])
        sidecars[sidecar_suffix(tape, row["name"])] = row["last_id"]
    return ForkPoint(name, tape, base, session_id, sidecars)


async def fork_point(conn: asyncpg.Connection, name: str) -> ForkPoint | None:
    """The stored fork `name` (None: no such fork)."""
    row = await conn.fetchrow(
        "SELECT parent, base, session_id FROM bub_tapes WHERE name = $1 AND role = 'fork'", name
    )
    if row is None or row["parent"] is None:
        return None
    found = await conn.fetch(
        "SELECT name, base FROM bub_tapes WHERE starts_with(name, $1) AND parent IS NOT NULL",
        name + SIDECAR_SEP,
    )
    sidecars = {sidecar_suffix(name, r["name"]): r["base"] for r in found}
    return ForkPoint(name, row["parent"], row["base"], row["session_id"], sidecars)


async def forks_of(conn: asyncpg.Connection, tape: str) -> list[str]:
    """The live forks of `tape`, oldest first."""
    rows = await conn.fetch(
        "SELECT name FROM bub_tapes WHERE parent = $1 AND role = 'fork' ORDER BY id", tape
    )
    return [r[0] for r in rows]


_MOVE = (
    "WITH t AS (UPDATE bub_tapes SET last_id = last_id + $2 WHERE name = $1"
    " RETURNING id, last_id)"
    " INSERT INTO bub_entries (tape, id, kind, name, payload, meta, date)"
    " SELECT t.id, t.last_id - $2 + row_number() OVER (ORDER BY e.id), e.kind, e.name,"
    " e.payload, e.meta, e.date FROM t, bub_entries e WHERE e.tape = $3"
    " RETURNING id"
)


async def _move(conn: asyncpg.Connection, target: str, source_id: int) -> tuple[int, int]:
    """Copy the entries of tape row `source_id` after `target`'s last id: (first, last)."""
    count = await conn.fetchval("SELECT count(*) FROM bub_entries WHERE tape = $1", source_id)
    if not count:
        return 0, 0
    ids = [r[0] for r in await conn.fetch(_MOVE, target, count, source_id)]
    return min(ids), max(ids)


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)]


async def merge(conn: asyncpg.Connection, name: str, now: str) -> Merged:
    """Append fork `name`'s entries (and its sidecars') to its parent, then drop it."""
    row = await conn.fetchrow(
        "SELECT id, parent, base, session_id FROM bub_tapes"
        " WHERE name = $1 AND role = 'fork' FOR UPDATE",
        name,
    )
    if row is None or row["parent"] is None:
        raise ForkError(f"{name!r} is not a fork (merged or discarded already?)")
    parent, session_id = row["parent"], row["session_id"]
    await _row(conn, parent, session_id, now)
    first, last = await _move(conn, parent, row["id"])
    counts: dict[str, int] = {}
    tapes: dict[str, tuple[str, str]] = {}
    family = [row["id"]]
    for sidecar in await _sidecars(conn, name):
        family.append(sidecar["id"])
        suffix = sidecar_suffix(name, sidecar["name"])
        target = sidecar["parent"] or parent + sidecar["name"][len(name) :]
        await _row(conn, target, session_id, now)
        low, high = await _move(conn, target, sidecar["id"])
        if high:
            counts[suffix] = high - low + 1
            tapes[suffix] = (sidecar["name"], target)
    merged = Merged(name, parent, first, last, counts)
    rows = [entry_row(e) for e in merge_events(merged, row["base"], tapes)]
    await conn.execute(
        "WITH t AS (UPDATE bub_tapes SET last_id = last_id + $2 WHERE name = $1"
        " RETURNING id, last_id)"
        " INSERT INTO bub_entries (tape, id, kind, name, payload, meta, date)"
        " SELECT t.id, t.last_id - $2 + r.n, r.kind, r.name, r.payload, r.meta, r.date"
        " FROM t, unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[])"
        " WITH ORDINALITY AS r(kind, name, payload, meta, date, n)",
        parent,
        len(rows),
        *_columns(rows),
    )
    await conn.execute("DELETE FROM bub_entries WHERE tape = ANY($1::bigint[])", family)
    await conn.execute("DELETE FROM bub_tapes WHERE id = ANY($1::bigint[])", family)
    return merged


async def discard(
    conn: asyncpg.Connection, name: str, archived: str | None, now: str, whole: bool = False
) -> bool:
    """Drop fork `name` (`whole`: or live tape) and its sidecars, or move them under
    `archived`; False: no such tape."""
    row = await conn.fetchrow(
        "SELECT id FROM bub_tapes WHERE name = $1 AND role = ANY($2::text[]) FOR UPDATE",
        name,
        ["fork", "live"] if whole else ["fork"],
    )
    if row is None:
        return False
    ids = [row["id"], *(r["id"] for r in await _sidecars(conn, name))]
    if archived is not None:
        await conn.execute(
            "UPDATE bub_tapes SET name = $1 || substr(name, $2), role = 'archive', updated = $3"
            " WHERE id = ANY($4::bigint[])",
            archived,
            len(name) + 1,
            now,
            ids,
        )
    else:
        await conn.execute("DELETE FROM bub_entries WHERE tape = ANY($1::bigint[])", ids)
        await conn.execute("DELETE FROM bub_tapes WHERE id = ANY($1::bigint[])", ids)
    return True
