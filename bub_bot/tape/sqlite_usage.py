"""The SQLite store's usage counters (tape/usage.py): added in the caller's transaction (an
append's) or alone, read, summed, copied and pruned."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .entries import utc_now
from .usage import COLUMNS as USAGE_COLUMNS
from .usage import Counting, UsageAdd, UsageRow, row_usage

T = TypeVar("T")


class SQLiteUsage:
    """Usage counter methods of `SQLiteTapeStore` (which runs them on its database thread)."""

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def add_usage(self, adds: Sequence[UsageAdd]) -> None:
        """Add to counters in one transaction."""
        merged = Counting(tuple(adds)).sorted_adds()
        if merged:
            await self._run(_add_usage_alone, merged, utc_now())

    async def usage(self, keys: Sequence[str], first: str, last: str) -> list[UsageRow]:
        """The counter rows of `keys` with `first <= window <= last`."""
        if not keys:
            return []
        sql = (
            f"SELECT {USAGE_COLUMNS} FROM usage WHERE key IN ({_marks(keys)})"
            " AND win BETWEEN ? AND ?"
        )
        args = (*keys, first, last)
        return await self._run(lambda c: [row_usage(r) for r in c.execute(sql, args)])

    async def usage_records(
        self, *, after: tuple[str, str] = ("", ""), limit: int = 1000
    ) -> list[UsageRow]:
        """Counter rows after (key, window) `after`, in that order."""
        sql = (
            f"SELECT {USAGE_COLUMNS} FROM usage WHERE key > ? OR (key = ? AND win > ?)"
            " ORDER BY key, win LIMIT ?"
        )
        args = (after[0], after[0], after[1], limit)
        return await self._run(lambda c: [row_usage(r) for r in c.execute(sql, args)])

    async def add_usage_records(self, rows: Sequence[UsageRow]) -> int:
        """Store counter rows the database does not have yet; how many were new."""
        sql = f"INSERT INTO usage ({USAGE_COLUMNS}, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        sql += " ON CONFLICT (key, win) DO NOTHING"
        values = [
            (r.key, r.window, r.messages, r.tokens_in, r.tokens_out, r.cost, r.estimated, utc_now())
            for r in rows
        ]
        return await self._run(_insert_counting, sql, values)

    async def prune_usage(self, before: Sequence[str]) -> int:
        """Delete the rows of windows older than each of `before` (see TapeStore)."""
        if not before:
            return 0
        where = " OR ".join("(win >= ? AND win < ?)" for _ in before)
        args = [v for b in before for v in (b[:2], b)]
        return await self._run(_prune_usage, f"DELETE FROM usage WHERE {where}", args)

    async def top_usage(
        self, prefix: str, first: str, last: str, *, limit: int = 10
    ) -> list[UsageRow]:
        """Keys starting with `prefix`, summed over the windows, most tokens first."""
        sql = (
            "SELECT key, min(win), sum(messages), sum(tokens_in), sum(tokens_out), sum(cost),"
            " sum(estimated) FROM usage WHERE key >= ? AND key < ? AND win BETWEEN ? AND ?"
            " GROUP BY key ORDER BY sum(tokens_in) + sum(tokens_out) DESC, key LIMIT ?"
        )
        args = (prefix, prefix + "\U0010ffff", first, last, limit)
        return await self._run(lambda c: [row_usage(r) for r in c.execute(sql, args)])


def _marks(values: Sequence[object]) -> str:
    return ",".join("?" * len(values))


_UPSERT_USAGE = (
    f"INSERT INTO usage ({USAGE_COLUMNS}, updated) VALUES {{values}}"
    " ON CONFLICT (key, win) DO UPDATE SET messages = messages + excluded.messages,"
    " tokens_in = tokens_in + excluded.tokens_in, tokens_out = tokens_out + excluded.tokens_out,"
    " cost = cost + excluded.cost, estimated = estimated + excluded.estimated,"
    " updated = excluded.updated RETURNING key, win, messages"
)
_UPSERT_ROWS = 100
"""Counter rows per statement (far below SQLite's limit of bound parameters)."""


def add_usage(
    conn: sqlite3.Connection, adds: Sequence[UsageAdd], now: str
) -> dict[tuple[str, str], int]:
    """Add to the counters (inside the caller's transaction), a hundred rows a statement;
    each row's `messages` after."""
    found = {}
    for start in range(0, len(adds), _UPSERT_ROWS):
        part = adds[start : start + _UPSERT_ROWS]
        sql = _UPSERT_USAGE.format(values=",".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(part)))
        args = [v for add in part for v in (*add.values(), now)]
        for key, win, messages in conn.execute(sql, args).fetchall():
            found[(key, win)] = messages
    return found


def _insert_counting(conn: sqlite3.Connection, sql: str, values: list[tuple[Any, ...]]) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = conn.total_changes
        conn.executemany(sql, values)
        count = conn.total_changes - before
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return count


def _prune_usage(conn: sqlite3.Connection, sql: str, args: list[str]) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        count = conn.execute(sql, args).rowcount
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return count


def _add_usage_alone(conn: sqlite3.Connection, adds: Sequence[UsageAdd], now: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        add_usage(conn, adds, now)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
