"""Firing delay of scheduled jobs (prints figures, asserts nothing).

    .venv/bin/python bench/schedule_bench.py [--jobs 1000] [--replicas 1,2] [--sqlite]

1 000 jobs in 1 000 conversations, all due within one minute, on one PostgreSQL database (a
throwaway server, fsync on; BENCH_PG_FAST=1 turns it off), fired by 1 and by 2 replicas.
Each replica is its own process: the real `Runtime` (timer, ingress, leases, turns) with the
in-process test channel and the fake model (`tests/fakes`, in a child process, no latency),
so the turns the jobs start compete for the same CPU as the timer, as in production.

Two shapes per replica count: every job due at the same second (`0 9 * * *` for everyone),
and the due times spread evenly over the minute. Printed per run: the firing delay (the
job's due time to the commit of the transaction that wrote its entry and advanced it)
p50 / p99 / max, and the answer delay (due time to the answer handed to the channel)
p50 / p99. The jobs are written before the replicas start and fall due 15 s later, so the
timers sleep until their time (no poll) and wake by themselves. `--sqlite` adds one run on a
SQLite file with one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.runtime_bench import ModelServer, pct  # noqa: E402
from bub_bot.agent import Agent, ModelClient, default_registry  # noqa: E402
from bub_bot.config import load_settings  # noqa: E402
from bub_bot.runtime import Runtime  # noqa: E402
from bub_bot.tape import Tape, open_store  # noqa: E402
from bub_bot.tape.jobs import Job  # noqa: E402
from tests.runtime_channel import RuntimeChannel  # noqa: E402

LEAD = 15.0
"""Seconds from writing the jobs to the first due time (the replicas start meanwhile)."""


def _replica(url: str, model_url: str, owner: str, home: str, queue: Any, stop: Any) -> None:
    asyncio.run(_run_replica(url, model_url, owner, home, queue, stop))


async def _run_replica(
    url: str, model_url: str, owner: str, home: str, queue: Any, stop: Any
) -> None:
    if os.environ.get("BENCH_LOG"):
        import logging

        logging.basicConfig(
            filename=f"{os.environ['BENCH_LOG']}.{owner}", level=logging.INFO, force=True
        )
    settings = load_settings(
        _env_file=None,
        openai_base_url=model_url,
        openai_api_key="sk-bench",
        model="fake-model",
        model_retries=0,
        home=Path(home),
        workspace=Path(home) / "ws",
        stream=False,
        max_concurrent_turns=64,
    )
    store = await open_store(url)
    agent = Agent(settings, ModelClient(settings), default_registry())
    channel = RuntimeChannel()
    runtime = Runtime(settings, store, agent, {channel.name: channel}, store.leases(owner, 15))
    channel.runtime = runtime
    fired: list[tuple[str, float]] = []
    answered: list[tuple[str, float]] = []
    runtime.observers.append(
        lambda event, data: fired.append((owner, data["delay"])) if event == "job" else None
    )
    channel.on_send = lambda chat, piece: answered.append((chat, time.time()))
    await runtime.start()
    queue.put(("ready", owner))
    await asyncio.to_thread(stop.wait)
    queue.put(("done", owner, fired, answered))
    await runtime.shutdown(grace=5)
    await agent.model.close()
    await store.close()


async def write_jobs(url: str, workspace: Path, count: int, spread: bool) -> dict[str, float]:
    """`count` one-off prompt jobs in as many conversations; chat -> due time."""
    dues: dict[str, float] = {}
    start = time.time() + LEAD
    async with open_store(url) as store:
        for i in range(count):
            chat = f"c{i}"
            session = f"test:{chat}"
            due = start + (60.0 * i / count if spread else 0.0)
            tape = Tape.for_session(store, session, workspace)
            await store.add_job(
                Job(
                    id=f"bench{i}",
                    kind="prompt",
                    session_id=session,
                    tape=tape.name,
                    workspace=str(workspace),
                    channel="test",
                    due=due,
                    data={"prompt": f"job {i}", "reply_target": {"chat": chat}},
                )
            )
            dues[chat] = due
    return dues


async def one_run(
    url: str, model: ModelServer, replicas: int, count: int, spread: bool, home: Path
) -> dict[str, Any]:
    workspace = home / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    async with open_store(url):
        pass  # the schema, before the replicas race to make it
    dues = await write_jobs(url, workspace, count, spread)
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_replica, args=(url, model.base_url, f"r{n}", str(home), queue, stop))
        for n in range(replicas)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        await asyncio.to_thread(queue.get)
    last_due = max(dues.values())
    # Wait for every answer: the model's request count reaches the job count.
    deadline = last_due + 120
    while await model.requests() < count and time.time() < deadline:  # noqa: ASYNC110 (another process)
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)
    stop.set()
    fired: list[tuple[str, float]] = []
    answered: list[tuple[str, float]] = []
    for _ in procs:
        message = await asyncio.to_thread(queue.get)
        fired += message[2]
        answered += message[3]
    for proc in procs:
        await asyncio.to_thread(proc.join, 30)
    delays = [d for _, d in fired]
    first_answer: dict[str, float] = {}
    for chat, at in answered:
        first_answer.setdefault(chat, at)
    answer_delays = [at - dues[chat] for chat, at in first_answer.items()]
    by_replica = {owner: sum(1 for o, _ in fired if o == owner) for owner, _ in fired}
    return {
        "fired": len(fired),
        "answered": len(first_answer),
        "twice": len(answered) - len(first_answer),
        "p50": pct(delays, 50),
        "p99": pct(delays, 99),
        "max": max(delays, default=float("nan")),
        "answer_p50": pct(answer_delays, 50),
        "answer_p99": pct(answer_delays, 99),
        "split": by_replica,
    }


def show(label: str, r: dict[str, Any]) -> None:
    split = " + ".join(str(n) for n in sorted(r["split"].values(), reverse=True))
    print(
        f"{label:<38} fired {r['fired']:>5} ({split})  delay p50 {r['p50'] * 1000:7.0f} ms"
        f"  p99 {r['p99'] * 1000:7.0f} ms  max {r['max'] * 1000:7.0f} ms   answer p50"
        f" {r['answer_p50']:5.2f} s  p99 {r['answer_p99']:5.2f} s  twice {r['twice']}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",") if n.strip()]

    from tests.pg import PostgresCluster

    cluster = PostgresCluster(durable=not os.environ.get("BENCH_PG_FAST")).start()
    print(
        f"{args.jobs} jobs due within one minute; PostgreSQL {'(fsync off)' if os.environ.get('BENCH_PG_FAST') else '(fsync on)'},"
        f" {os.cpu_count()} CPUs"
    )
    try:
        for spread in (False, True):
            shape = "spread over the minute" if spread else "all at the same second"
            for replicas in counts:
                async with ModelServer(0.0, in_process=False) as model:
                    with tempfile.TemporaryDirectory(prefix="bub-sched-bench-") as home:
                        url = cluster.fresh_url()
                        result = await one_run(url, model, replicas, args.jobs, spread, Path(home))
                show(f"{replicas} replica{'s' if replicas > 1 else ''}, {shape}", result)
        if args.sqlite:
            async with ModelServer(0.0, in_process=False) as model:
                with tempfile.TemporaryDirectory(prefix="bub-sched-bench-") as home:
                    url = f"sqlite:///{home}/bench.db"
                    result = await one_run(url, model, 1, args.jobs, False, Path(home))
            show("SQLite, 1 replica, all at the same second", result)
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
