"""What budgets and rate limits add per message and per model call (prints figures, asserts
nothing).

    .venv/bin/python bench/budget_bench.py [--users 10000] [--rounds 2000]

On a SQLite file and on PostgreSQL (a throwaway server, fsync on; BENCH_PG_FAST=1 turns it
off), with the counters of `--users` people and as many conversations already in the store
(each with rows for 20 days of this month), p50 / p99 in µs of:

- check: `Budgets.check` before a model call with per-person, per-conversation and total
  budgets by day and by month (one indexed read of up to 3 × 31 rows);
- inbound: storing a user message as ingress does (dedupe key, bootstrap anchor) with and
  without its counters and a `20/min,200/day` rate per person and conversation (the counters
  and the refusal decision run inside the message's own transaction); the difference is what
  counting costs;
- step: appending a step's `run` event with and without its four counters (on PostgreSQL
  the counters join the append's one statement).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bub_bot.budgets import Budgets, Payer, StepUsage  # noqa: E402
from bub_bot.limits import (  # noqa: E402
    Limits,
    parse_budgets,
    parse_rates,
)
from bub_bot.tape import Tape, TapeEntry, TapeStore, UsageAdd, open_store  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fmt(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5):7.0f} µs  p99 {pct(values, 0.99):7.0f} µs"


LIMITS = Limits(
    user_rates=parse_rates("20/min,200/day", "X"),
    conversation_rates=parse_rates("20/min,200/day", "X"),
    user_budgets=parse_budgets("200000/day,5M/month", "X"),
    conversation_budgets=parse_budgets("500000/day", "X"),
    total_budgets=parse_budgets("50M/month", "X"),
)


async def populate(store: TapeStore, budgets: Budgets, users: int) -> None:
    now = budgets.now()
    month = now.local.strftime("%Y-%m")
    days = [f"d:{month}-{d:02d}" for d in range(1, 21)]
    batch: list[UsageAdd] = []
    for n in range(users):
        for window in days:
            batch.append(UsageAdd(f"u:bench:{n}", window, 3, 900, 300))
            batch.append(UsageAdd(f"c:bench:{n}", window, 3, 900, 300))
        if len(batch) >= 20_000:
            await store.add_usage(batch)
            batch = []
    if batch:
        await store.add_usage(batch)


async def timed(fn, rounds: int) -> list[float]:
    out = []
    for n in range(rounds):
        started = time.perf_counter()
        await fn(n)
        out.append((time.perf_counter() - started) * 1e6)
    return out


async def run(url: str, label: str, users: int, rounds: int) -> None:
    async with open_store(url) as store:
        budgets = Budgets(store, LIMITS)
        started = time.perf_counter()
        await populate(store, budgets, users)
        print(f"{label}: {users} people and conversations, 20 days each:"
              f" {time.perf_counter() - started:.1f} s to write")  # fmt: skip

        async def check(n: int) -> None:
            assert await budgets.check(Payer(f"bench:{n % users}", f"bench:{n % users}")) is None

        await timed(check, 50)
        print(f"  check before a model call   {fmt(await timed(check, rounds))}")

        def message(n: int) -> TapeEntry:
            return TapeEntry.message(
                {"role": "user", "content": f"hello {n}"},
                inbound=True,
                channel="bench",
                sender={"id": str(n % users)},
            )

        async def inbound(n: int, counted: bool) -> None:
            entry = message(n)
            session = f"bench:{n % 500}"
            await store.append_many(
                f"tape-{n % 500}",
                [entry],
                dedupe_keys=[f"bench:{label}:{counted}:{n}"],
                bootstrap=Tape.bootstrap_anchor("/tmp"),
                session_id=session,
                usage=budgets.inbound(session, entry) if counted else None,
            )

        await timed(lambda n: inbound(n + 10_000_000, False), 50)
        plain = await timed(lambda n: inbound(n, False), rounds)
        counted = await timed(lambda n: inbound(n + 5_000_000, True), rounds)
        print(f"  inbound message, uncounted  {fmt(plain)}")
        print(f"  inbound message, counted    {fmt(counted)}")
        print(f"  counting adds               p50 {pct(counted, 0.5) - pct(plain, 0.5):7.0f} µs")

        run_event = TapeEntry.event("run", {"model": "m", "usage": {}}, context=False)
        used = StepUsage(1200, 300)

        async def step(n: int, with_counts: bool) -> None:
            payer = Payer(f"bench:{n % 500}", f"bench:{n % users}", "bench")
            counting = budgets.step(payer, "m", used) if with_counts else None
            await store.append_many(f"tape-{n % 500}", [run_event], usage=counting)

        plain = await timed(lambda n: step(n, False), rounds)
        counted = await timed(lambda n: step(n, True), rounds)
        print(f"  run event, uncounted        {fmt(plain)}")
        print(f"  run event, counted          {fmt(counted)}")
        print(f"  counting adds               p50 {pct(counted, 0.5) - pct(plain, 0.5):7.0f} µs")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        await run(f"sqlite:///{tmp}/bench.db", "SQLite", args.users, args.rounds)
    from tests.pg import PostgresCluster

    cluster = PostgresCluster(durable=not os.environ.get("BENCH_PG_FAST")).start()
    try:
        fsync = "fsync off" if os.environ.get("BENCH_PG_FAST") else "fsync on"
        await run(cluster.fresh_url(), f"PostgreSQL ({fsync})", args.users, args.rounds)
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
