"""/healthz latency under a slowloris attack (prints figures, asserts nothing).

    .venv/bin/python bench/slowloris_bench.py [--attackers 300] [--requests 200]

A real `BotServer` (CLI channel, SQLite in a temporary BUB_HOME) with the default limits
(BUB_HTTP_HEADER_TIMEOUT_SECONDS=10, BUB_HTTP_MAX_CONNECTIONS=1000, or `--max-connections`)
is attacked by `--attackers` connections that send one more header line every 0.5 s and
never finish their request (tests/slowloris.py). Meanwhile `--requests` GET /healthz, one
after another on new connections, are timed: p50/p95/max, and how many failed. The same
without the attack is printed first for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def probe(url: str, n: int) -> tuple[list[float], int]:
    import aiohttp

    times, failed = [], 0
    for _ in range(n):
        start = time.perf_counter()
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=30)) as resp,
            ):
                await resp.read()
                ok = resp.status == 200
        except Exception:
            ok = False
        if ok:
            times.append((time.perf_counter() - start) * 1000)
        else:
            failed += 1
        await asyncio.sleep(0.02)
    return times, failed


def show(label: str, times: list[float], failed: int) -> None:
    if not times:
        print(f"{label}: all {failed} failed")
        return
    print(
        f"{label}: p50 {statistics.median(times):.1f} ms  p95 {pct(times, 95):.1f} ms"
        f"  max {max(times):.1f} ms  failed {failed}/{len(times) + failed}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attackers", type=int, default=300)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-connections", type=int, default=1000)
    args = parser.parse_args()

    from bub_bot.config import load_settings
    from bub_bot.server import Bot, BotServer
    from channels.cli import CliChannel
    from tests.slowloris import Slowloris

    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(
            require_model=False,
            _env_file=None,
            home=Path(home),
            http_max_connections=args.max_connections,
        )
        bot = await Bot.open(settings, [CliChannel()])
        server = BotServer(bot, host="127.0.0.1", port=0)
        await server.start()
        try:
            show("healthz, no attack      ", *await probe(server.url, args.requests))
            attack = Slowloris("127.0.0.1", server.port, n=args.attackers, every=0.5)
            await attack.start()
            await asyncio.sleep(1.0)
            show(
                f"healthz, {args.attackers} slowloris",
                *await probe(server.url, args.requests),
            )
            print(
                f"open connections {len(server.guard.conns)} (cap"
                f" {server.guard.max_connections}), attackers closed by the server"
                f" {attack.closed}/{args.attackers}"
            )
            await attack.stop()
        finally:
            await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
