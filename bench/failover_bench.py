"""Failover between `bub-bot serve` replicas on one PostgreSQL database (prints figures).

    .venv/bin/python bench/failover_bench.py [--runs 5] [--lease 15]

Two replicas (Telegram webhook mode against the fake Bot API, the fake model in this
process). Each run posts a message to one replica, waits until its turn is at the model (which
takes a minute to answer it), SIGKILLs the replica running the turn, and measures the time
from the kill to the answer sent by the surviving replica; a fresh replica then replaces the
killed one. Expected: the lease lapses 2/3 to 3/3 of `--lease` after the kill (renewals every
third; here the turn has just taken it, so the full lease), the survivor looks right then, and
one model call: about the lease. Target: <= 30 s with the default lease of 15 s.

Then the same with SIGTERM (a rolling deploy): a turn running on the replica that stops, and
a second message queued behind it; printed: time from SIGTERM to the queued message's answer
on the other replica (the running turn finishes first, within the grace period).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from replicas import Serve, Telegram, serve_env  # bench/replicas.py (puts the repo on the path)

from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.pg import PostgresCluster


async def at_model(model: FakeOpenAI, requests: int) -> None:
    """Wait until the model has more than `requests` requests."""
    while len(model.completion_requests()) <= requests:  # noqa: ASYNC110 (foreign state)
        await asyncio.sleep(0.02)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lease", type=float, default=15.0, help="BUB_LEASE_SECONDS")
    args = parser.parse_args()

    cluster = PostgresCluster(durable=True).start()
    arrived: dict[int, asyncio.Event] = {}
    tg = Telegram(lambda chat: arrived[chat].set() if chat in arrived else None)
    ids = iter(range(1, 10**9))
    try:
        async with tg, FakeOpenAI() as model, aiohttp.ClientSession() as http:
            database = cluster.fresh_url()
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp)
                names = iter(range(1, 1000))

                def replica() -> Serve:
                    name = f"r{next(names)}"
                    env = serve_env(
                        name,
                        database,
                        tg.base_url,
                        model.base_url,
                        home,
                        BUB_LEASE_SECONDS=f"{args.lease:g}",
                        BUB_SHUTDOWN_GRACE_SECONDS="20",
                    )
                    return Serve(name, env, home / f"{name}.log")

                group = list(await asyncio.gather(replica().start(), replica().start()))
                print(f"2 replicas, BUB_LEASE_SECONDS={args.lease:g}; SIGKILL mid-turn:")
                kills: list[float] = []
                for run in range(args.runs):
                    user = 1000 + run
                    arrived[user] = asyncio.Event()
                    model.script(slow(text("never delivered"), 120))
                    requests = len(model.completion_requests())
                    target = group[run % 2]
                    await target.post(http, tg.update(user, "are you there?", next(ids)))
                    await at_model(model, requests)
                    running = [s for s in group if await s.metric("bub_running_turns") == 1]
                    if len(running) != 1:
                        raise RuntimeError(f"expected one replica running the turn: {running}")
                    killed = running[0]
                    await killed.stop(signal.SIGKILL)
                    started = time.perf_counter()
                    await asyncio.wait_for(arrived[user].wait(), 120)
                    kills.append(time.perf_counter() - started)
                    print(f"  run {run + 1}: answered by the survivor {kills[-1]:.1f} s after")
                    group[group.index(killed)] = await replica().start()
                print(
                    f"  median {statistics.median(kills):.1f} s, min {min(kills):.1f} s,"
                    f" max {max(kills):.1f} s  (target <= 30 s)"
                )

                print("SIGTERM mid-turn with a message queued behind it:")
                handovers: list[float] = []
                for run in range(args.runs):
                    user = 2000 + run
                    arrived[user] = asyncio.Event()
                    model.script(slow(text("finished while stopping"), 1.0))
                    requests = len(model.completion_requests())
                    leaving = group[run % 2]
                    await leaving.post(http, tg.update(user, "first", next(ids)))
                    await at_model(model, requests)
                    await leaving.post(http, tg.update(user, "second", next(ids)))
                    started = time.perf_counter()
                    stopping = asyncio.ensure_future(leaving.stop(signal.SIGTERM))
                    await asyncio.wait_for(arrived[user].wait(), 60)  # the first answer
                    arrived[user].clear()
                    await asyncio.wait_for(arrived[user].wait(), 60)  # the queued one
                    handovers.append(time.perf_counter() - started)
                    await stopping
                    print(f"  run {run + 1}: queued message answered {handovers[-1]:.1f} s after")
                    group[group.index(leaving)] = await replica().start()
                print(
                    f"  median {statistics.median(handovers):.1f} s (the running turn had"
                    " about 1 s left; no waiting for the lease to lapse)"
                )
                for s in group:
                    await s.stop()
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
