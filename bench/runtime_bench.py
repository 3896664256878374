"""Runtime throughput under many concurrent conversations (prints figures, asserts nothing).

    .venv/bin/python bench/runtime_bench.py [--conversations 500] [--messages 5]
        [--latency 0.2] [--burst 50] [--in-process-model]

The model is the fake OpenAI server from `tests/fakes` with a fixed latency per request
(default 200 ms), run in a child process so its HTTP work does not share the runtime's event
loop (`--in-process-model` runs it in the same loop instead). The bot side is the real
`Runtime` with a real SQLite file, the real openai SDK and the in-process test channel from
`tests/runtime_channel.py`, `BUB_MAX_CONCURRENT_TURNS` = the number of conversations.

1. Conversations: N conversations at once, each sending M messages one after another (the
   next when the previous reply arrives). Ideal wall time is M x latency; printed: wall time,
   the ratio to the ideal (target <= 1.3), messages/s, reply latency percentiles, peak RSS.
2. Burst: one session receives B messages at once (and again 20 ms apart); printed: how
   many model calls (turns) it took to answer all of them.

After the warm-up the collector is tuned as `bub-bot serve` tunes it once started
(`bub_bot.server.tune_gc`; `--no-gc-tuning` keeps Python's defaults, for comparison).
`--profile FILE` runs the conversations (not the warm-up) under cProfile and writes the stats
to FILE (read them with pstats). The store's transaction counter gives transactions per turn.

`--postgres` runs the conversations and bursts on a throwaway PostgreSQL server (fsync on;
BENCH_PG_FAST=1 turns it off) instead of the SQLite file, in this one process; with
`--shared-leases` the runtime takes its leases in the database as `serve` does with several
replicas (one replica here: what the leases cost a turn). Its transactions per turn are the
pool acquires (see tape/postgres.py).

`--http aiohttp` gives `ModelClient` an SDK client on the aiohttp transport instead of the
SDK's default httpx one (for comparison; the bot uses the default).

`--replicas 1,2,3` measures whole `bub-bot serve` processes instead: for each count, that many
replicas on one PostgreSQL database (a throwaway server, fsync on), Telegram webhook mode
against the fake Bot API, each conversation's messages posted to the replicas in turn (as a
round-robin load balancer would). Printed per count: wall time vs ideal, messages/s and the
speedup over one replica, and the CPU seconds used by the replicas, by the PostgreSQL server
(all its processes, from /proc) and by this process (fake Bot API and load), and what bounds
the rate. Defaults there: 400 conversations x 5 messages, enough to keep one replica's event
loop busy; BENCH_PG_FAST=1 turns the database's fsync off. See bench/replicas.py.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.config import load_settings
from bub_bot.runtime import Runtime
from bub_bot.server import tune_gc
from bub_bot.tape import SQLiteTapeStore, Tape, TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI
from tests.runtime_channel import RuntimeChannel


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def child_cpu(pid: int | None) -> float:
    """CPU seconds a child process (the fake model) has used so far, from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- the fake model in a child process ---------------------------------------------------------


def _serve_fake(latency: float, conn: Any) -> None:
    async def main() -> None:
        async with FakeOpenAI(latency=latency) as fake:
            conn.send(fake.base_url)
            loop = asyncio.get_running_loop()
            while True:
                # "count" -> number of completion requests so far; "stop" -> exit
                msg = await loop.run_in_executor(None, conn.recv)
                if msg == "stop":
                    return
                conn.send(len(fake.completion_requests()))

    asyncio.run(main())


class ModelServer:
    """The fake model either in a child process (default) or in this event loop."""

    def __init__(self, latency: float, in_process: bool) -> None:
        self.latency = latency
        self.in_process = in_process
        self.fake: FakeOpenAI | None = None
        self.proc: Any = None
        self.conn: Any = None
        self.base_url = ""

    async def __aenter__(self) -> ModelServer:
        if self.in_process:
            self.fake = FakeOpenAI(latency=self.latency)
            await self.fake.start()
            self.base_url = self.fake.base_url
            return self
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_fake, args=(self.latency, child), daemon=True)
        self.proc.start()
        self.base_url = await asyncio.to_thread(self.conn.recv)
        return self

    async def requests(self) -> int:
        if self.fake is not None:
            return len(self.fake.completion_requests())
        self.conn.send("count")
        return await asyncio.to_thread(self.conn.recv)

    async def __aexit__(self, *exc: object) -> None:
        if self.fake is not None:
            await self.fake.stop()
            return
        self.conn.send("stop")
        await asyncio.to_thread(self.proc.join, 5)


# -- the bot side ---------------------------------------------------------------------------------


DATABASE: dict[str, Any] = {"cluster": None, "shared": False}
"""Where the runtimes' tapes go: `cluster` (a PostgreSQL server: each runtime gets a fresh
schema; None: a SQLite file in its home) and whether leases are in the database
(`--postgres`, `--shared-leases`)."""


async def open_runtime(base_url: str, home: Path, concurrency: int, http: str = "httpx"):
    settings = load_settings(
        openai_base_url=base_url,
        openai_api_key="sk-bench",
        model="fake-model",
        model_retries=0,
        workspace=home,
        home=home,
        max_concurrent_turns=concurrency,
        _env_file=None,
    )
    store: TapeStore
    if DATABASE["cluster"] is not None:
        url = DATABASE["cluster"].fresh_url()
        store = await open_store(url, pool_size=settings.database_pool_size)  # as `serve`
    else:
        store = await SQLiteTapeStore.open(settings.database_path)
    client = None
    if http == "aiohttp":
        import openai

        client = openai.AsyncOpenAI(
            api_key="sk-bench",
            base_url=base_url,
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(),
        )
    agent = Agent(settings, ModelClient(settings, client), default_registry())
    channel = RuntimeChannel()
    leases = store.leases("bench", settings.lease_seconds) if DATABASE["shared"] else None
    runtime = Runtime(settings, store, agent, {channel.name: channel}, leases)
    channel.runtime = runtime
    if leases is not None:
        await runtime.start()  # the handover listener and the lease renewal
    model_calls = [0]

    def count(name: str, data: dict[str, Any]) -> None:
        if name == "model_call":
            model_calls[0] += 1

    agent.hooks.append(count)
    return runtime, channel, store, model_calls


async def close_runtime(runtime: Runtime, store: TapeStore) -> None:
    await runtime.shutdown(grace=5)
    await runtime.agent.model.close()
    await store.close()


async def conversations(
    model: ModelServer,
    home: Path,
    n: int,
    m: int,
    http: str = "httpx",
    profile: str = "",
    no_gc_tuning: bool = False,
) -> dict[str, float]:
    runtime, channel, store, model_calls = await open_runtime(model.base_url, home, n, http)
    arrived: dict[str, asyncio.Event] = {}
    channel.on_send = lambda chat, piece: arrived[chat].set()
    latencies: list[float] = []

    async def converse(chat: str) -> None:
        for i in range(m):
            arrived[chat] = asyncio.Event()
            sent = time.perf_counter()
            await channel.say(f"{chat} message {i}", chat)
            await arrived[chat].wait()
            latencies.append(time.perf_counter() - sent)

    # warm up: connections to the fake, SQLite pages, imports
    await asyncio.gather(*(converse(f"warm{i}") for i in range(min(n, 20))))
    if not no_gc_tuning:
        tune_gc()  # as `bub-bot serve` does once it has started
    calls_before = model_calls[0]
    latencies.clear()
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    transactions = store.transactions
    model_pid = None if model.proc is None else model.proc.pid
    model_cpu = child_cpu(model_pid)
    cpu = time.thread_time()
    process_cpu = time.process_time()  # the event loop and the database thread
    started = time.perf_counter()
    await asyncio.gather(*(converse(f"c{i}") for i in range(n)))
    wall = time.perf_counter() - started
    cpu = time.thread_time() - cpu
    process_cpu = time.process_time() - process_cpu
    transactions = store.transactions - transactions
    model_cpu = child_cpu(model_pid) - model_cpu
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    calls = model_calls[0] - calls_before
    for i in range(n):
        await runtime.wait_idle(f"test:c{i}", 30)
    lost = sum(len(channel.texts(f"c{i}")) != m for i in range(n))
    await close_runtime(runtime, store)
    return {
        "wall": wall,
        "calls": calls,
        "p50": pct(latencies, 50),
        "p95": pct(latencies, 95),
        "p99": pct(latencies, 99),
        "max": max(latencies),
        "lost": lost,
        "cpu_per_turn": cpu / max(calls, 1),
        "process_cpu_per_turn": process_cpu / max(calls, 1),
        "transactions_per_turn": transactions / max(calls, 1),
        "model_cpu": model_cpu,
        "process_cpu": process_cpu,
    }


async def burst(
    model: ModelServer, home: Path, count: int, spacing: float = 0.0
) -> dict[str, float]:
    runtime, channel, store, model_calls = await open_runtime(model.base_url, home, 32)
    started = time.perf_counter()
    if spacing:
        for i in range(count):
            await channel.say(f"burst {i}", "burst")
            await asyncio.sleep(spacing)
    else:
        await asyncio.gather(*(channel.say(f"burst {i}", "burst") for i in range(count)))
    received = time.perf_counter() - started
    await runtime.wait_idle("test:burst", 60)
    # wait_idle covers the worker; all messages are answered once inbound.done reaches the last
    tape = Tape.for_session(store, "test:burst", runtime.settings.workspace)
    done = await tape.query(kinds=["event"], names=["inbound.done"])
    wall = time.perf_counter() - started
    result = {
        "received_s": received,
        "wall": wall,
        "calls": model_calls[0],
        "replies": len(channel.texts("burst")),
        "turns": len(done),
    }
    await close_runtime(runtime, store)
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--in-process-model", action="store_true")
    parser.add_argument("--http", choices=["httpx", "aiohttp"], default="httpx")
    parser.add_argument(
        "--no-gc-tuning", action="store_true", help="keep the collector's defaults (compare)"
    )
    parser.add_argument("--profile", default="", help="cProfile the conversations into FILE")
    parser.add_argument("--replicas", help="e.g. 1,2,3: serve processes on one PostgreSQL db")
    parser.add_argument("--postgres", action="store_true", help="tapes on a PostgreSQL server")
    parser.add_argument(
        "--shared-leases", action="store_true", help="with --postgres: leases in the database"
    )
    args = parser.parse_args()
    if args.postgres:
        from tests.pg import PostgresCluster

        cluster = PostgresCluster(durable=not os.environ.get("BENCH_PG_FAST")).start()
        DATABASE.update(cluster=cluster, shared=args.shared_leases)
        try:
            await bench(args)
        finally:
            cluster.stop()
        return
    await bench(args)


async def bench(args: argparse.Namespace) -> None:
    """The measurements of `main` once the database is chosen."""
    if args.replicas:
        from replicas import run_replicas

        counts = [int(c) for c in args.replicas.split(",")]
        talks = 400 if "--conversations" not in sys.argv else args.conversations
        async with ModelServer(args.latency, args.in_process_model) as model:
            print(f"fake model: {args.latency * 1000:.0f} ms per request, in a child process")
            pid = None if model.proc is None else model.proc.pid
            await run_replicas(counts, talks, args.messages, args.latency, model.base_url, pid)
        return
    n, m, latency = args.conversations, args.messages, args.latency

    async with ModelServer(latency, args.in_process_model) as model:
        where = "in this process" if args.in_process_model else "in a child process"
        print(
            f"fake model: {latency * 1000:.0f} ms per request, {where}; SDK transport {args.http}"
        )
        if DATABASE["cluster"] is not None:
            leases = "in the database" if DATABASE["shared"] else "local (one process)"
            print(f"tapes on PostgreSQL (one process, leases {leases})")
        with tempfile.TemporaryDirectory() as tmp:
            res = await conversations(
                model, Path(tmp) / "conv", n, m, args.http, args.profile, args.no_gc_tuning
            )
        ideal = m * latency
        total = n * m
        print(
            f"\n{n} conversations x {m} messages (next after each reply),"
            f" BUB_MAX_CONCURRENT_TURNS={n}"
        )
        print(f"  wall time        {res['wall']:.2f} s   (ideal {ideal:.2f} s)")
        print(f"  ratio to ideal   {res['wall'] / ideal:.2f}   (target <= 1.3)")
        print(f"  messages/s       {total / res['wall']:.0f}")
        print(f"  model calls      {res['calls']:.0f}   (messages {total})")
        print(
            f"  reply latency    p50 {res['p50'] * 1000:.0f} ms  p95 {res['p95'] * 1000:.0f} ms"
            f"  p99 {res['p99'] * 1000:.0f} ms  max {res['max'] * 1000:.0f} ms"
        )
        print(
            f"  event-loop CPU   {res['cpu_per_turn'] * 1000:.2f} ms per turn"
            f"   (budget for the target: {1.3 * ideal / total * 1000:.2f} ms)"
        )
        print(
            f"  process CPU      {res['process_cpu_per_turn'] * 1000:.2f} ms per turn"
            "   (event loop + the database thread)"
        )
        print(f"  transactions     {res['transactions_per_turn']:.2f} per turn (store round trips)")
        if not args.in_process_model:
            print(
                f"  CPU seconds      bot {res['process_cpu']:.2f}, fake model"
                f" {res['model_cpu']:.2f} (on {os.cpu_count()} cores shared with anything else)"
            )
        print(f"  conversations missing a reply: {res['lost']:.0f}")
        print(f"  peak RSS         {peak_rss_mb():.0f} MB (bot process)")

        for spacing in (0.0, 0.02):
            with tempfile.TemporaryDirectory() as tmp:
                res = await burst(model, Path(tmp) / "burst", args.burst, spacing)
            how = "at once" if not spacing else f"{spacing * 1000:.0f} ms apart"
            print(f"\none session, {args.burst} messages {how}")
            print(f"  all stored in    {res['received_s'] * 1000:.0f} ms")
            print(
                f"  model calls      {res['calls']:.0f}   (turns {res['turns']:.0f},"
                f" replies sent {res['replies']:.0f})"
            )
            print(f"  all answered in  {res['wall']:.2f} s")
        print(f"\npeak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    asyncio.run(main())
