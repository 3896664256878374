"""`bub-bot serve` replicas on one PostgreSQL database, for the benchmarks (not a test helper).

Used by `runtime_bench.py --replicas` and `failover_bench.py`: a throwaway PostgreSQL server
(tests/pg.py, durable by default: fsync on), the fake Bot API in the benchmark's own event
loop (Telegram webhook mode, so the benchmark picks the replica of each message), `serve`
processes with their logs in files, and CPU time read from /proc.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.telegram_api import FakeTelegram  # noqa: E402
from tests.serve_process import free_port, wait_ready  # noqa: E402

TOKEN = "123456:BENCH-token"
HOOK_SECRET = "bench-hook-secret"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """CPU time (user + system) of process `pid` from /proc; `children`: plus its reaped
    children's. 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command: state is fields[0], utime = field 14 of stat -> index 11 here.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / TICKS, sum(fields) / TICKS


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster with its exited backends, plus
    every live backend and auxiliary process (children of the postmaster)."""
    total = cpu_seconds(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
            total += cpu_seconds(int(entry.name))
    return total


class Telegram(FakeTelegram):
    """The fake Bot API; calls `on_send(chat_id)` for every message the bot sends."""

    def __init__(self, on_send: Callable[[int], None] | None = None) -> None:
        super().__init__(token=TOKEN, username="bub_bench_bot")
        self.on_send = on_send
        plain = self.methods["sendMessage"]

        async def send(params: dict[str, Any]) -> dict[str, Any]:
            sent = await plain(params)
            if self.on_send is not None:
                self.on_send(int(sent["chat"]["id"]))
            return sent

        self.methods["sendMessage"] = send

    def update(self, user: int, text: str, update_id: int) -> dict[str, Any]:
        return self.private_text(user, text) | {"update_id": update_id}


class Serve:
    """One `bub-bot serve` process in Telegram webhook mode."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name, self.env, self.log = name, env, log
        self.port = int(env["PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float = 60) -> Serve:
        # BENCH_PROFILE=/tmp/serve.prof: each replica under cProfile (file per replica).
        profile = os.environ.get("BENCH_PROFILE")
        wrap = ["-m", "cProfile", "-o", f"{profile}.{self.name}"] if profile else []
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *wrap,
                "-m",
                "bub_bot",
                "serve",
                env=self.env,
                stdout=out,
                stderr=out,
            )
        await wait_ready(self.url, self.proc, self.log, timeout=timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def post(self, http: aiohttp.ClientSession, update: dict[str, Any]) -> int:
        headers = {"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}
        async with http.post(f"{self.url}/tg/hook", json=update, headers=headers) as resp:
            return resp.status

    async def metric(self, name: str) -> float:
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/metrics") as resp:
            body = await resp.text()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()


def serve_env(
    name: str,
    database: str,
    telegram: str,
    model: str,
    home: Path,
    **extra: str,
) -> dict[str, str]:
    """The environment of one replica: the same settings and database for all, its own port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        BUB_DATABASE_URL=database,
        BUB_HOME=str(home / name),
        BUB_WORKSPACE=str(home / "workspace"),
        BUB_HOST="127.0.0.1",
        PORT=str(free_port()),
        BUB_TELEGRAM_TOKEN=TOKEN,
        BUB_TELEGRAM_API_BASE=telegram,
        BUB_TELEGRAM_ALLOW_USERS="*",
        BUB_TELEGRAM_WEBHOOK_URL="https://bench.example.test/tg/hook",
        BUB_TELEGRAM_WEBHOOK_SECRET=HOOK_SECRET,
        BUB_WEB="off",
        BUB_STREAM="off",
        # The fake Bot API has no send limits: measure the bot, not Telegram's 30 messages/s
        # (per bot) and 1/s per chat.
        BUB_TELEGRAM_RATE_GLOBAL="100000/s",
        BUB_TELEGRAM_RATE_CHAT="1000/s",
        OPENAI_BASE_URL=model,
        OPENAI_API_KEY="sk-bench",
        BUB_MODEL="fake-model",
        BUB_MODEL_RETRIES="0",
    )
    env.update(extra)
    (home / "workspace").mkdir(parents=True, exist_ok=True)
    return env


# -- runtime_bench.py --replicas ---------------------------------------------------------------


async def run_replicas(
    counts: list[int],
    conversations: int,
    messages: int,
    latency: float,
    model: str,
    model_pid: int | None = None,
) -> None:
    """For each count: that many replicas on a fresh database, `conversations` conversations
    of `messages` messages each (the next after each answer), posted to the replicas in turn."""
    import tempfile

    from tests.pg import PostgresCluster

    # BENCH_PG_FAST=1: fsync and synchronous commit off (what the tests use), for comparison.
    cluster = PostgresCluster(durable=not os.environ.get("BENCH_PG_FAST")).start()
    assert cluster.proc is not None
    results: list[dict[str, float]] = []
    try:
        for count in counts:
            with tempfile.TemporaryDirectory() as tmp:
                result = await _one_run(
                    count, conversations, messages, model, cluster, Path(tmp), model_pid
                )
            results.append(result)
            _print_run(result, conversations, messages, latency, results[0])
    finally:
        cluster.stop()
    print(
        "\nreplicas  wall s  x ideal  msg/s  speedup  serve CPU s  postgres CPU s  bench CPU s"
        "  machine busy"
    )
    for r in results:
        print(
            f"{r['replicas']:>8.0f}  {r['wall']:>6.2f}  {r['wall'] / (messages * latency):>7.2f}"
            f"  {r['rate']:>5.0f}  {r['rate'] / results[0]['rate']:>6.2f}x"
            f"  {r['serve_cpu']:>11.1f}  {r['pg_cpu']:>14.1f}  {r['bench_cpu']:>11.1f}"
            f"  {r['machine'] * 100:>11.0f}%"
        )


async def _one_run(
    count: int,
    conversations: int,
    messages: int,
    model: str,
    cluster: Any,
    home: Path,
    model_pid: int | None,
) -> dict[str, float]:
    arrived: dict[int, asyncio.Event] = {}
    tg = Telegram(lambda chat: arrived[chat].set() if chat in arrived else None)
    ids = iter(range(1, 10**9))
    async with tg:
        database = cluster.fresh_url()
        extra = {"BUB_MAX_CONCURRENT_TURNS": str(max(conversations, 1))}
        group = [
            Serve(
                f"r{i + 1}",
                serve_env(f"r{i + 1}", database, tg.base_url, model, home, **extra),
                home / f"r{i + 1}.log",
            )
            for i in range(count)
        ]
        await asyncio.gather(*(s.start() for s in group))
        latencies: list[float] = []
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def converse(user: int, n: int, record: bool) -> None:
                for i in range(n):
                    arrived[user] = asyncio.Event()
                    sent = time.perf_counter()
                    replica = group[(user + i) % count]
                    status = await replica.post(
                        http, tg.update(user, f"{user} says {i}", next(ids))
                    )
                    if status != 200:
                        raise RuntimeError(f"{replica.name} answered {status}")
                    await asyncio.wait_for(arrived[user].wait(), 120)
                    if record:
                        latencies.append(time.perf_counter() - sent)

            # Warm-up: connections, pools, first statements on every replica.
            await asyncio.gather(*(converse(900_000 + u, count, False) for u in range(20)))
            serve_cpu = sum(cpu_seconds(s.pid) for s in group)
            pg_cpu = postgres_cpu(cluster.proc.pid)
            bench_cpu = time.process_time()
            model_cpu = cpu_seconds(model_pid) if model_pid else 0.0
            busy, available = machine_busy()
            started = time.perf_counter()
            await asyncio.gather(
                *(converse(10_000 + u, messages, True) for u in range(conversations))
            )
            wall = time.perf_counter() - started
            serve_cpu = sum(cpu_seconds(s.pid) for s in group) - serve_cpu
            pg_cpu = postgres_cpu(cluster.proc.pid) - pg_cpu
            bench_cpu = time.process_time() - bench_cpu
            model_cpu = (cpu_seconds(model_pid) if model_pid else 0.0) - model_cpu
            now_busy, now_available = machine_busy()
            machine = (now_busy - busy) / max(now_available - available, 1e-9)
        for s in group:
            await s.stop()
    total = conversations * messages
    latencies.sort()
    return {
        "replicas": count,
        "wall": wall,
        "rate": total / wall,
        "serve_cpu": serve_cpu,
        "pg_cpu": pg_cpu,
        "bench_cpu": bench_cpu,
        "model_cpu": model_cpu,
        "machine": machine,
        "p50": latencies[len(latencies) // 2],
        "p95": latencies[int(len(latencies) * 0.95)],
        "total": total,
    }


def _print_run(
    r: dict[str, float], conversations: int, messages: int, latency: float, first: dict[str, float]
) -> None:
    ideal = messages * latency
    total = r["total"]
    print(
        f"\n{r['replicas']:.0f} replica(s) on one PostgreSQL database: {conversations}"
        f" conversations x {messages} messages, each posted to the next replica"
    )
    print(f"  wall time        {r['wall']:.2f} s   (ideal {ideal:.2f} s, x{r['wall'] / ideal:.2f})")
    print(f"  messages/s       {r['rate']:.0f}   ({r['rate'] / first['rate']:.2f}x one replica)")
    print(f"  reply latency    p50 {r['p50'] * 1000:.0f} ms  p95 {r['p95'] * 1000:.0f} ms")
    print(
        f"  CPU              replicas {r['serve_cpu']:.1f} s ({r['serve_cpu'] / total * 1000:.2f}"
        f" ms/msg), PostgreSQL {r['pg_cpu']:.1f} s ({r['pg_cpu'] / total * 1000:.2f} ms/msg),"
        f" this process (fake Bot API, load) {r['bench_cpu']:.1f} s,"
        f" fake model {r['model_cpu']:.1f} s"
    )
    print(
        f"  machine          {r['machine'] * 100:.0f}% busy over {os.cpu_count()} cores"
        " (everything running on it, other work included)"
    )
    # What bounds the rate: all the CPU a message costs here against the machine's cores,
    # and the replicas' own event loops (one core each at most).
    cost = (r["serve_cpu"] + r["pg_cpu"] + r["bench_cpu"] + r["model_cpu"]) / total
    cores = os.cpu_count() or 1
    print(
        f"  bounds           {cores / cost:.0f} msg/s if this machine's {cores} cores did"
        f" nothing else ({cost * 1000:.1f} ms of CPU per message, everything included);"
        f" {r['replicas'] / (r['serve_cpu'] / total):.0f} msg/s for"
        f" {r['replicas']:.0f} replica event loop(s) on cores of their own"
    )
