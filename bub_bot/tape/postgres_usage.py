"""The PostgreSQL store's usage counters (tape/usage.py): an upsert that increments, in the
caller's transaction (an append's; the common append folds it into its one statement, see
postgres.py) or alone; reads, sums, copies and pruning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from .entries import utc_now
from .usage import COLUMNS as USAGE_COLUMNS
from .usage import Counting, UsageAdd, UsageRow, row_usage


class PostgresUsage:
    """Usage counter methods of `PostgresTapeStore` (on its pool)."""

    pool: asyncpg.Pool

    async def add_usage(self, adds: Sequence[UsageAdd]) -> None:
        """Add to counters in one statement (atomic)."""
        merged = Counting(tuple(adds)).sorted_adds()
        if not merged:
            return
        for attempt in range(3):
            try:
                async with self.pool.acquire() as conn:
                    await conn.fetch(_ADD_USAGE, *usage_columns(merged), utc_now())
                return
            except asyncpg.exceptions.DeadlockDetectedError:
                if attempt == 2:
                    raise

    async def usage(self, keys: Sequence[str], first: str, last: str) -> list[UsageRow]:
        """The counter rows of `keys` with `first <= window <= last`."""
        if not keys:
            return []
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {USAGE_COLUMNS} FROM bub_usage WHERE key = ANY($1::text[])"
                " AND win BETWEEN $2 AND $3",
                list(keys),
                first,
                last,
            )
        return [row_usage(r) for r in rows]

    async def usage_records(
        self, *, after: tuple[str, str] = ("", ""), limit: int = 1000
    ) -> list[UsageRow]:
        """Counter rows after (key, window) `after`, in that order."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {USAGE_COLUMNS} FROM bub_usage WHERE (key, win) > ($1, $2)"
                " ORDER BY key, win LIMIT $3",
                after[0],
                after[1],
                limit,
            )
        return [row_usage(r) for r in rows]

    async def add_usage_records(self, rows: Sequence[UsageRow]) -> int:
        """Store counter rows the database does not have yet; how many were new."""
        if not rows:
            return 0
        columns = [
            list(c)
            for c in zip(
                *(
                    (r.key, r.window, r.messages, r.tokens_in, r.tokens_out, r.cost, r.estimated)
                    for r in rows
                ),
                strict=True,
            )
        ]
        async with self.pool.acquire() as conn:
            status = await conn.execute(
                "INSERT INTO bub_usage (key, win, messages, tokens_in, tokens_out, cost,"
                " estimated, updated) SELECT k, w, m, ti, tt, c, e, $8 FROM unnest("
                f"{USAGE_ARRAYS}) AS a(k, w, m, ti, tt, c, e) ON CONFLICT (key, win) DO NOTHING",
                *columns,
                utc_now(),
            )
        return int(status.split()[-1])

    async def prune_usage(self, before: Sequence[str]) -> int:
        """Delete the rows of windows older than each of `before` (see TapeStore)."""
        if not before:
            return 0
        where = " OR ".join(
            f"(win >= ${2 * i + 1} AND win < ${2 * i + 2})" for i in range(len(before))
        )
        args = [v for b in before for v in (b[:2], b)]
        async with self.pool.acquire() as conn:
            status = await conn.execute(f"DELETE FROM bub_usage WHERE {where}", *args)
        return int(status.split()[-1])

    async def top_usage(
        self, prefix: str, first: str, last: str, *, limit: int = 10
    ) -> list[UsageRow]:
        """Keys starting with `prefix`, summed over the windows, most tokens first."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT key, min(win), sum(messages), sum(tokens_in), sum(tokens_out),"
                " sum(cost), sum(estimated) FROM bub_usage WHERE starts_with(key, $1)"
                " AND win BETWEEN $2 AND $3 GROUP BY key"
                " ORDER BY sum(tokens_in) + sum(tokens_out) DESC, key LIMIT $4",
                prefix,
                first,
                last,
                limit,
            )
        return [row_usage(r) for r in rows]


USAGE_UPSERT = (
    "INSERT INTO bub_usage (key, win, messages, tokens_in, tokens_out, cost, estimated, updated)"
    " SELECT k, w, m, ti, tt, c, e, {now} FROM unnest({arrays})"
    " AS a(k, w, m, ti, tt, c, e){where}"
    " ON CONFLICT (key, win) DO UPDATE SET messages = bub_usage.messages + excluded.messages,"
    " tokens_in = bub_usage.tokens_in + excluded.tokens_in,"
    " tokens_out = bub_usage.tokens_out + excluded.tokens_out,"
    " cost = bub_usage.cost + excluded.cost, estimated = bub_usage.estimated + excluded.estimated,"
    " updated = excluded.updated"
)
USAGE_ARRAYS = (
    "$1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[]"
)
_ADD_USAGE = (
    USAGE_UPSERT.format(now="$8", arrays=USAGE_ARRAYS, where="") + " RETURNING key, win, messages"
)


def usage_columns(adds: Sequence[UsageAdd]) -> list[list[Any]]:
    return [list(column) for column in zip(*(a.values() for a in adds), strict=True)]


async def add_usage(
    conn: asyncpg.Connection, adds: Sequence[UsageAdd], now: str
) -> dict[tuple[str, str], int]:
    """Add to the counters (in the caller's transaction); each row's `messages` after. The
    upsert locks each row: a concurrent add waits and then adds to the committed value."""
    found = await conn.fetch(_ADD_USAGE, *usage_columns(adds), now)
    return {(r[0], r[1]): int(r[2]) for r in found}
