"""SQLite tape store: the write transactions, each one function run on the database thread
(BEGIN IMMEDIATE ... COMMIT, see sqlite.py).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from . import sqlite_forks
from .entries import safe_text, utc_now
from .forks import lifecycle_events
from .jobs import COLUMNS, Decide, Fired, JobRow, row_job
from .names import SIDECAR_SEP, tape_role
from .query import SQLITE
from .rows import (
    Append,
    Copies,
    Reset,
    check_copy_ids,
    entry_row,
    firing_append,
    fork_base,
    is_inbound,
    with_ids,
)
from .sqlite_usage import add_usage
from .store import DedupeRecord


def tape_row(
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


def last_anchor(conn: sqlite3.Connection, tape_id: int) -> int:
    return conn.execute(
        "SELECT coalesce(max(id), 0) FROM entries WHERE tape = ? AND kind = 'anchor'", (tape_id,)
    ).fetchone()[0]


_INSERT = (
    "INSERT INTO entries (tape, id, kind, name, payload, meta, date) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def append(conn: sqlite3.Connection, w: Append, now: str) -> list[int] | None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        ids = append_rows(conn, w, now)
        conn.execute("COMMIT" if ids is not None else "ROLLBACK")
        return ids
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def append_rows(conn: sqlite3.Connection, w: Append, now: str) -> list[int] | None:
    """The append inside a transaction; None (having written nothing) when it refuses."""
    if w.dedupe_keys:
        marks = ",".join("?" * len(w.dedupe_keys))
        seen = conn.execute(f"SELECT 1 FROM dedupe WHERE key IN ({marks})", w.dedupe_keys)
        if seen.fetchone() is not None:
            return None
    tape_id = tape_row(conn, w.tape, w.session_id, now)
    last_id = sqlite_forks.last_id(conn, tape_id)
    has_anchor = (w.if_no_anchor or w.bootstrap is not None) and last_anchor(conn, tape_id) > 0
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


def add_job(conn: sqlite3.Connection, row: JobRow, limit: int | None) -> bool:
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


def statement_rows(conn: sqlite3.Connection, sql: str, args: list[Any], write: bool) -> list[Any]:
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


def fire_jobs(
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
            group = firing_append(job, firing)
            written = None
            if group is not None and firing.entry is not None:
                ids = append_rows(conn, group, stamp)
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


def append_copies(conn: sqlite3.Connection, w: Copies) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        tape_id = tape_row(conn, w.tape, w.session_id, w.updated, w.updated)
        last = sqlite_forks.last_id(conn, tape_id)
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


def add_dedupe(conn: sqlite3.Connection, records: list[DedupeRecord]) -> int:
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


def reset(conn: sqlite3.Connection, w: Reset, now: str) -> str | None:
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
        tape_id = tape_row(conn, tape, session[1] if session else None, now)
        if rows:
            conn.executemany(_INSERT, [(tape_id, i, *row) for i, row in enumerate(rows, start=1)])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return archived
