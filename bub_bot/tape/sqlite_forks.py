"""Fork, merge and discard on SQLite (see tape/forks.py): functions run on the database thread,
each one transaction under the write lock."""

from __future__ import annotations

import sqlite3

from .forks import ForkError, ForkPoint, Merged, merge_events, sidecar_suffix
from .names import SIDECAR_SEP, fork_name, tape_role
from .rows import entry_row

INSERT = (
    "INSERT INTO entries (tape, id, kind, name, payload, meta, date) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def last_id(conn: sqlite3.Connection, tape_id: int) -> int:
    """The tape's newest id; a fork without entries of its own: its fork point."""
    return conn.execute(
        "SELECT coalesce((SELECT max(id) FROM entries WHERE tape = ?1),"
        " (SELECT base FROM tapes WHERE id = ?1), 0)",
        (tape_id,),
    ).fetchone()[0]


def _row(conn: sqlite3.Connection, name: str, session_id: str | None, now: str) -> int:
    row = conn.execute("SELECT id FROM tapes WHERE name = ?", (name,)).fetchone()
    if row is not None:
        return row[0]
    cur = conn.execute(
        "INSERT INTO tapes (name, role, session_id, created, updated) VALUES (?, ?, ?, ?, ?)",
        (name, tape_role(name), session_id, now, now),
    )
    return cur.lastrowid  # type: ignore[return-value]


def _sidecars(conn: sqlite3.Connection, tape: str) -> list[tuple[int, str, str | None]]:
    prefix = tape + SIDECAR_SEP
    return conn.execute(
        "SELECT id, name, parent FROM tapes WHERE substr(name, 1, ?) = ? ORDER BY id",
        (len(prefix), prefix),
    ).fetchall()


def _transaction(conn: sqlite3.Connection, fn, *args):  # type: ignore[no-untyped-def]
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn, *args)
        conn.execute("COMMIT")
        return result
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def fork(
    conn: sqlite3.Connection, tape: str, tag: str, session_id: str | None, now: str
) -> ForkPoint:
    """Make fork `tag` of `tape` (and of its sidecars) at the tape's last id."""
    return _transaction(conn, _fork, tape, tag, session_id, now)


def _fork(
    conn: sqlite3.Connection, tape: str, tag: str, session_id: str | None, now: str
) -> ForkPoint:
    parent_id = _row(conn, tape, session_id, now)
    base = last_id(conn, parent_id)
    name = fork_name(tape, tag)
    insert = (
        "INSERT INTO tapes (name, role, session_id, created, updated, parent, base)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    conn.execute(insert, (name, "fork", session_id, now, now, tape, base))
    sidecars: dict[str, int] = {}
    for row_id, sidecar, _ in _sidecars(conn, tape):
        at = last_id(conn, row_id)
        own = name + sidecar[len(tape) :]
        conn.execute(insert, (own, "sidecar", session_id, now, now, sidecar, at))
        sidecars[sidecar_suffix(tape, sidecar)] = at
    return ForkPoint(name, tape, base, session_id, sidecars)


def fork_point(conn: sqlite3.Connection, name: str) -> ForkPoint | None:
    """The stored fork `name` (None: no such fork)."""
    row = conn.execute(
        "SELECT parent, base, session_id FROM tapes WHERE name = ? AND role = 'fork'", (name,)
    ).fetchone()
    if row is None or row[0] is None:
        return None
    sidecars = {}
    for row_id, sidecar, parent in _sidecars(conn, name):
        if parent is not None:
            sidecars[sidecar_suffix(name, sidecar)] = conn.execute(
                "SELECT base FROM tapes WHERE id = ?", (row_id,)
            ).fetchone()[0]
    return ForkPoint(name, row[0], row[1], row[2], sidecars)


def forks_of(conn: sqlite3.Connection, tape: str) -> list[str]:
    """The live forks of `tape`, oldest first."""
    rows = conn.execute(
        "SELECT name FROM tapes WHERE parent = ? AND role = 'fork' ORDER BY id", (tape,)
    )
    return [r[0] for r in rows]


def _append_after(conn: sqlite3.Connection, target: int, rows: list[tuple]) -> tuple[int, int]:
    start = last_id(conn, target) + 1
    conn.executemany(INSERT, [(target, start + i, *row) for i, row in enumerate(rows)])
    return start, start + len(rows) - 1


def _own_rows(conn: sqlite3.Connection, tape_id: int) -> list[tuple]:
    return conn.execute(
        "SELECT kind, name, payload, meta, date FROM entries WHERE tape = ? ORDER BY id",
        (tape_id,),
    ).fetchall()


def merge(conn: sqlite3.Connection, name: str, now: str) -> Merged:
    """Append fork `name`'s entries (and its sidecars') to its parent, then drop it."""
    return _transaction(conn, _merge, name, now)


def _merge(conn: sqlite3.Connection, name: str, now: str) -> Merged:
    row = conn.execute(
        "SELECT id, parent, base, session_id FROM tapes WHERE name = ? AND role = 'fork'",
        (name,),
    ).fetchone()
    if row is None or row[1] is None:
        raise ForkError(f"{name!r} is not a fork (merged or discarded already?)")
    fork_id, parent, base, session_id = row
    parent_id = _row(conn, parent, session_id, now)
    own = _own_rows(conn, fork_id)
    first = last = 0
    if own:
        first, last = _append_after(conn, parent_id, own)
    counts: dict[str, int] = {}
    tapes: dict[str, tuple[str, str]] = {}
    family = [fork_id]
    for row_id, sidecar, sidecar_parent in _sidecars(conn, name):
        family.append(row_id)
        suffix = sidecar_suffix(name, sidecar)
        target = sidecar_parent or parent + sidecar[len(name) :]
        rows = _own_rows(conn, row_id)
        if rows:
            _append_after(conn, _row(conn, target, session_id, now), rows)
            counts[suffix] = len(rows)
            tapes[suffix] = (sidecar, target)
    merged = Merged(name, parent, first, last, counts)
    events = merge_events(merged, base, tapes)
    _append_after(conn, parent_id, [entry_row(e) for e in events])
    for row_id in family:
        conn.execute("DELETE FROM entries WHERE tape = ?", (row_id,))
        conn.execute("DELETE FROM tapes WHERE id = ?", (row_id,))
    return merged


def discard(
    conn: sqlite3.Connection, name: str, archived: str | None, now: str, whole: bool = False
) -> bool:
    """Drop fork `name` (`whole`: or live tape) and its sidecars, or move them under
    `archived`; False: no such tape."""
    return _transaction(conn, _discard, name, archived, now, whole)


def _discard(
    conn: sqlite3.Connection, name: str, archived: str | None, now: str, whole: bool
) -> bool:
    roles = "('fork', 'live')" if whole else "('fork')"
    row = conn.execute(
        f"SELECT id FROM tapes WHERE name = ? AND role IN {roles}", (name,)
    ).fetchone()
    if row is None:
        return False
    for row_id, tape in [(row[0], name), *((r[0], r[1]) for r in _sidecars(conn, name))]:
        if archived is not None:
            conn.execute(
                "UPDATE tapes SET name = ?, role = 'archive', updated = ? WHERE id = ?",
                (archived + tape[len(name) :], now, row_id),
            )
        else:
            conn.execute("DELETE FROM entries WHERE tape = ?", (row_id,))
            conn.execute("DELETE FROM tapes WHERE id = ?", (row_id,))
    return True
