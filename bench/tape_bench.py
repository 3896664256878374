"""Tape store benchmark: append rate, context build time (cold/warm), RSS, against a floor.

    .venv/bin/python bench/tape_bench.py [--sizes 1000,100000,1000000]
    .venv/bin/python bench/tape_bench.py --store postgresql://user:password@host:5432/db

Workload: turns of 5 entries (user message, tool_call, tool_result, assistant message, `run`
event) and one anchor 50 entries before the end, so the default context is always the same
50 entries whatever the tape's total size. For each size a child process builds the tape
(bulk-loaded in larger transactions), measures the append rate on a fixed sample of 5-entry
transactions, reads the context warm, and reports its RSS; fresh child processes then time one
cold read each (after connecting: the read, not the connect).

Stores: SQLite files in a temporary directory by default. With `--store postgresql://…` every
size gets its own schema in that database (`bench_<size>`, created and dropped by the bench,
so the user needs CREATE on the database); entries are written through the store as in
production (`append_many`, 1000 per transaction for the bulk part).

The floor is the same read through the plain driver: for SQLite the two queries through
`sqlite3` (the tape row for its last anchor, then the entries after it), for PostgreSQL the
one statement the store sends, through a bare asyncpg connection; `json.loads` of each payload
in both. Prints figures only; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TAPE = "bench__session"
SAMPLE_TAPE = "bench__append_sample"
TAIL = 50  # entries after the anchor: the default context
BULK_BATCH = 1000

TARGET_APPEND = 15_000
TARGET_FLOOR_RATIO = 3.0
TARGET_GROWTH = 1.5
TARGET_RSS_MB = 10.0
TARGET_PG_WARM_MS = 5.0


# -- workload ---------------------------------------------------------------------------------
def turn(i: int) -> list[Any]:
    """One turn: user message, tool_call, tool_result, assistant message, run event."""
    from bub_bot.tape import TapeEntry

    path = f"src/module_{i % 97}.py"
    call_id = f"call_{i}"
    return [
        TapeEntry.message(
            {"role": "user", "content": f"question {i}: what does {path} do, in one line?"}
        ),
        TapeEntry.tool_call(
            [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "fs.read", "arguments": json.dumps({"path": path})},
                }
            ]
        ),
        TapeEntry.tool_result(
            [{"tool_call_id": call_id, "content": f"def f_{i}():\n    return {i}\n" * 4}]
        ),
        TapeEntry.message(
            {"role": "assistant", "content": f"{path} defines f_{i}(), which returns {i}."}
        ),
        TapeEntry.event(
            "run",
            {
                "usage": {
                    "prompt_tokens": 900 + i % 50,
                    "completion_tokens": 40,
                    "total_tokens": 940,
                },
                "steps": 2,
            },
        ),
    ]


def entries(count: int, start_turn: int = 0) -> Iterator[Any]:
    """`count` workload entries, turn after turn (the last turn may be cut short)."""
    i = start_turn
    left = count
    while left > 0:
        for entry in turn(i)[:left]:
            yield entry
            left -= 1
        i += 1


def rss_kb() -> tuple[int, int]:
    """(current VmRSS, peak maxrss) in KiB."""
    now = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                now = int(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":
        peak //= 1024
    return now, peak


# -- where the tapes live --------------------------------------------------------------------------
class Target:
    """One database per size: a SQLite file in `workdir`, or a schema of a PostgreSQL database."""

    def __init__(self, store: str | None, workdir: Path) -> None:
        self.store = store
        self.workdir = workdir
        self.postgres = bool(store) and "://" in str(store) and not str(store).startswith("sqlite")

    def url(self, size: int) -> str:
        if not self.postgres:
            return str(self.workdir / f"tapes-{size}.db")
        sep = "&" if "?" in str(self.store) else "?"
        return f"{self.store}{sep}search_path=bench_{size}"

    def prepare(self, size: int) -> None:
        if self.postgres:
            self._pg(f"DROP SCHEMA IF EXISTS bench_{size} CASCADE; CREATE SCHEMA bench_{size}")

    def cleanup(self, size: int) -> None:
        if self.postgres:
            self._pg(f"DROP SCHEMA IF EXISTS bench_{size} CASCADE")
            return
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.url(size)}{suffix}").unlink(missing_ok=True)

    def _pg(self, sql: str) -> None:
        import asyncio

        import asyncpg

        async def run() -> None:
            conn = await asyncpg.connect(self.store)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(run())


# -- floor: the same read through the plain driver ------------------------------------------------
def floor_read(conn: Any, tape: str) -> list[Any]:
    (tape_id,) = conn.execute("SELECT id FROM tapes WHERE name = ?", (tape,)).fetchone()
    (last_anchor,) = conn.execute(
        "SELECT max(id) FROM entries WHERE tape = ? AND kind = 'anchor'", (tape_id,)
    ).fetchone()
    rows = conn.execute(
        "SELECT id, kind, payload, meta, date FROM entries WHERE tape = ? AND id > ? ORDER BY id",
        (tape_id, last_anchor),
    ).fetchall()
    return [json.loads(r[2]) for r in rows]


PG_FLOOR_SQL = (
    "SELECT id, kind, payload, meta, date FROM bub_entries"
    " WHERE tape = (SELECT id FROM bub_tapes WHERE name = $1)"
    " AND id > greatest($2, (SELECT coalesce(max(a.id), 0) FROM bub_entries a"
    " WHERE a.tape = (SELECT id FROM bub_tapes WHERE name = $1) AND a.kind = 'anchor'))"
    " ORDER BY id"
)


async def open_floor(url: str) -> tuple[Callable[[], Awaitable[list[Any]]], Callable[[], Any]]:
    """(read, close) for the floor read on `url` through the plain driver."""
    if "://" not in url:
        import sqlite3

        conn = sqlite3.connect(url)

        async def read_sqlite() -> list[Any]:
            return floor_read(conn, TAPE)

        async def close_sqlite() -> None:
            conn.close()

        return read_sqlite, close_sqlite
    import asyncpg

    pg = await asyncpg.connect(url)

    async def read_pg() -> list[Any]:
        return [json.loads(r[2]) for r in await pg.fetch(PG_FLOOR_SQL, TAPE, 0)]

    return read_pg, pg.close


async def pg_megabytes(store: Any) -> float:
    async with store.pool.acquire() as conn:
        size = await conn.fetchval(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        )
    return int(size) / 1e6


# -- child processes -----------------------------------------------------------------------------
async def child_build(db: str, size: int, sample: int, warm_runs: int) -> dict[str, Any]:
    from bub_bot.tape import Tape, TapeEntry, open_store

    result: dict[str, Any] = {"size": size}
    async with open_store(db) as store:
        tape = Tape(store, TAPE)
        # Build: everything before the anchor in bulk transactions, then the anchor and the
        # 50-entry tail one 5-entry step per transaction.
        head = size - TAIL - 1
        t0 = time.perf_counter()
        batch: list[Any] = []
        for entry in entries(head):
            batch.append(entry)
            if len(batch) == BULK_BATCH:
                await store.append_many(TAPE, batch)
                batch = []
        if batch:
            await store.append_many(TAPE, batch)
        await tape.append(TapeEntry.anchor("bench/phase", {"summary": "the last 50 entries"}))
        tail_turn = head // 5 + 1
        for k in range(TAIL // 5):
            await store.append_many(TAPE, turn(tail_turn + k))
        result["build_s"] = time.perf_counter() - t0
        stats = await store.stats(TAPE)
        assert stats.entries == size, (stats, size)
        if store.kind == "postgresql":
            # What autovacuum does shortly after a bulk load: fresh planner statistics.
            async with store.pool.acquire() as conn:  # type: ignore[attr-defined]
                await conn.execute("ANALYZE")

        # Append rate: a fixed sample of one-step (5-entry) transactions on another tape of
        # the same database. Entries are made in chunks outside the clock (that is the caller's
        # work); serialisation, the round trips and the transaction are inside it.
        steps = sample // 5
        spent = 0.0
        done = 0
        while done < steps:
            chunk = [turn(k) for k in range(done, min(steps, done + 200))]
            t0 = time.perf_counter()
            for step in chunk:
                await store.append_many(SAMPLE_TAPE, step)
            spent += time.perf_counter() - t0
            done += len(chunk)
        result["append_per_s"] = steps * 5 / spent

        # Warm context build: the full read_messages path (query + visible + selector), with
        # the floor timed in alternation on the same database so both see the same load.
        messages = await tape.read_messages()
        result["context_entries"] = len(await tape.read_entries())
        result["context_messages"] = len(messages)
        floor_read_once, floor_close = await open_floor(db)
        try:
            assert len(await floor_read_once()) == result["context_entries"]
            ours, query_only, floor = [], [], []
            for _ in range(warm_runs):
                t0 = time.perf_counter()
                await tape.read_messages()
                t1 = time.perf_counter()
                await store.query(TAPE, after_last_anchor=True)
                t2 = time.perf_counter()
                await floor_read_once()
                t3 = time.perf_counter()
                ours.append(t1 - t0)
                query_only.append(t2 - t1)
                floor.append(t3 - t2)
        finally:
            await floor_close()
        result["warm_s"] = statistics.median(ours)
        result["query_warm_s"] = statistics.median(query_only)
        result["floor_warm_s"] = statistics.median(floor)
        result["rss_kb"], result["maxrss_kb"] = rss_kb()
        if store.kind == "postgresql":
            result["db_mb"] = await pg_megabytes(store)
    if "db_mb" not in result:  # SQLite: the file after close (the WAL checkpointed into it)
        result["db_mb"] = os.path.getsize(db) / 1e6
    return result


async def child_cold_ours(db: str) -> dict[str, Any]:
    from bub_bot.tape import Tape, open_store

    async with open_store(db) as store:
        tape = Tape(store, TAPE)
        t0 = time.perf_counter()
        messages = await tape.read_messages()
        elapsed = time.perf_counter() - t0
    return {"cold_s": elapsed, "messages": len(messages)}


async def child_cold_floor(db: str) -> dict[str, Any]:
    read, close = await open_floor(db)
    try:
        t0 = time.perf_counter()
        rows = await read()
        elapsed = time.perf_counter() - t0
    finally:
        await close()
    return {"cold_s": elapsed, "entries": len(rows)}


def run_child(*args: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- report -----------------------------------------------------------------------------------------
def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def measure(sizes: list[int], sample: int, warm_runs: int, cold_runs: int, target: Target) -> None:
    rows = []
    for size in sizes:
        db = target.url(size)
        print(f"  building {size:,} entries …", file=sys.stderr, flush=True)
        target.prepare(size)
        try:
            built = run_child("build", db, str(size), str(sample), str(warm_runs))
            cold, cold_floor = [], []
            for _ in range(cold_runs):  # alternate, so both see the same machine load
                cold.append(run_child("cold-ours", db)["cold_s"])
                cold_floor.append(run_child("cold-floor", db)["cold_s"])
        finally:
            target.cleanup(size)
        built["cold_s"] = statistics.median(cold)
        built["floor_cold_s"] = statistics.median(cold_floor)
        rows.append(built)

    print()
    store = "PostgreSQL" if target.postgres else "SQLite"
    print(
        f"tape benchmark, {store} — context = {TAIL} entries after the last anchor; append"
        f" sample = {sample:,} entries in 5-entry transactions; warm = median of {warm_runs},"
        f" cold = median of {cold_runs} fresh processes"
    )
    floor_kind = (
        "bare asyncpg, the same statement + json.loads(payload)"
        if target.postgres
        else "plain sqlite3, same two queries + json.loads(payload)"
    )
    print(
        "warm/cold = Tape.read_messages(); query = store.query(after_last_anchor) alone;"
        f" floor = {floor_kind}"
    )
    header = (
        f"{'entries':>10} {'db MB':>7} {'build s':>8} {'append/s':>9} "
        f"{'warm':>10} {'floor':>9} {'×floor':>7} {'query':>9} {'×floor':>7} "
        f"{'cold':>10} {'floor':>9} {'×floor':>7} {'RSS MB':>7} {'peak MB':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['size']:>10,} {r['db_mb']:>7.1f} {r['build_s']:>8.1f} {r['append_per_s']:>9,.0f} "
            f"{us(r['warm_s']):>10} {us(r['floor_warm_s']):>9} {r['warm_s'] / r['floor_warm_s']:>7.2f} "
            f"{us(r['query_warm_s']):>9} {r['query_warm_s'] / r['floor_warm_s']:>7.2f} "
            f"{us(r['cold_s']):>10} {us(r['floor_cold_s']):>9} {r['cold_s'] / r['floor_cold_s']:>7.2f} "
            f"{r['rss_kb'] / 1024:>7.1f} {r['maxrss_kb'] / 1024:>8.1f}"
        )
    print()
    small, large = rows[0], rows[-1]
    span = f"t({large['size']:.0e})/t({small['size']:.0e})".replace("+0", "")
    worst_append = min(r["append_per_s"] for r in rows)
    worst_warm = max(r["warm_s"] / r["floor_warm_s"] for r in rows)
    worst_cold = max(r["cold_s"] / r["floor_cold_s"] for r in rows)
    warm_growth = large["warm_s"] / small["warm_s"]
    cold_growth = large["cold_s"] / small["cold_s"]
    rss_growth = round((large["rss_kb"] - small["rss_kb"]) / 1024, 1) + 0.0
    peak_growth = round((large["maxrss_kb"] - small["maxrss_kb"]) / 1024, 1) + 0.0
    print("target                                  measured      ")
    if target.postgres:
        # Every commit waits for the server's WAL flush: the rate is the server's disk.
        print(f"append (no target: the server's fsync)  {worst_append:>10,.0f}")
        print(
            f"warm context <= {TARGET_PG_WARM_MS:.0f} ms at {large['size']:.0e}"
            f"            {large['warm_s'] * 1e3:>8.2f} ms    {mark(large['warm_s'] * 1e3 <= TARGET_PG_WARM_MS)}"
        )
    else:
        print(
            f"append >= {TARGET_APPEND:,} entries/s             {worst_append:>10,.0f}    {mark(worst_append >= TARGET_APPEND)}"
        )
    print(
        f"warm context within {TARGET_FLOOR_RATIO:.0f}x of floor        {worst_warm:>9.2f}x    {mark(worst_warm <= TARGET_FLOOR_RATIO)}"
    )
    print(
        f"cold context within {TARGET_FLOOR_RATIO:.0f}x of floor        {worst_cold:>9.2f}x    {mark(worst_cold <= TARGET_FLOOR_RATIO)}"
    )
    print(
        f"warm {span} <= {TARGET_GROWTH}              {warm_growth:>10.2f}    {mark(warm_growth <= TARGET_GROWTH)}"
    )
    print(
        f"cold {span} <= {TARGET_GROWTH}              {cold_growth:>10.2f}    {mark(cold_growth <= TARGET_GROWTH)}"
    )
    print(
        f"RSS growth <= {TARGET_RSS_MB:.0f} MB (VmRSS after read)  {rss_growth:>8.1f} MB    {mark(rss_growth <= TARGET_RSS_MB)}"
    )
    print(
        f"RSS growth <= {TARGET_RSS_MB:.0f} MB (peak, incl. build)  {peak_growth:>7.1f} MB    {mark(peak_growth <= TARGET_RSS_MB)}"
    )


def parse_sizes(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,100000,1000000", type=parse_sizes)
    parser.add_argument("--sample", type=int, default=20_000, help="entries in the append sample")
    parser.add_argument("--warm-runs", type=int, default=50)
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the databases go (default: a temp dir)")
    parser.add_argument(
        "--store",
        default=None,
        help="postgresql://user:password@host:port/db to measure PostgreSQL (default: SQLite)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        import asyncio

        kind, db, *rest = args.child
        if kind == "build":
            size, sample, warm_runs = (int(x) for x in rest)
            out = asyncio.run(child_build(db, size, sample, warm_runs))
        elif kind == "cold-ours":
            out = asyncio.run(child_cold_ours(db))
        else:
            out = asyncio.run(child_cold_floor(db))
        print(json.dumps(out))
        return

    if any(size < TAIL + 6 for size in args.sizes):
        parser.error(f"every size must be at least {TAIL + 6}")
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="tape-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        target = Target(args.store, workdir)
        measure(args.sizes, args.sample, args.warm_runs, args.cold_runs, target)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
