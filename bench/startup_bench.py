"""Start-up time: process start -> /readyz 200, per channel mix, against local fakes; and
process start -> the first Telegram `getUpdates` (long polling).

Run: .venv/bin/python bench/startup_bench.py [--runs 3] [--first-poll-only]
Prints the median time per configuration, exec -> first getUpdates against the fake Bot API
(Telegram alone, and with the web chat and Slack), and the most expensive imports (python
-X importtime). Targets: <= 5 s to ready with both channels on the project's 2-core
machines; <= 1.5 s to the first getUpdates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.slack_api import FakeSlack  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402
from tests.serve_process import free_port  # noqa: E402

BIN = Path(sys.executable).parent / "bub-bot"
TG_TOKEN = "123456:bench-token"


async def time_to_ready(env: dict[str, str], expect_exit: bool = False) -> float:
    port = free_port()
    env = {**env, "PORT": str(port), "BUB_HOST": "127.0.0.1"}
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        str(BIN),
        "serve",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None or expect_exit:
                    if expect_exit:
                        await proc.wait()
                        return time.perf_counter() - started
                    err = (await proc.stderr.read()).decode()[-500:]  # type: ignore[union-attr]
                    raise RuntimeError(f"serve exited {proc.returncode}: {err}")
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        if resp.status == 200:
                            return time.perf_counter() - started
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def time_to_first_poll(env: dict[str, str], tg: FakeTelegram) -> float:
    """exec -> the fake Bot API receives the first getUpdates (the bot can hear messages)."""
    port = free_port()
    env = {**env, "PORT": str(port), "BUB_HOST": "127.0.0.1"}
    seen = len(tg.timed("getUpdates"))
    started = time.monotonic()  # the fake records arrival times on the same clock
    proc = await asyncio.create_subprocess_exec(
        str(BIN),
        "serve",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        while len(tg.timed("getUpdates")) <= seen:
            if proc.returncode is not None:
                err = (await proc.stderr.read()).decode()[-500:]  # type: ignore[union-attr]
                raise RuntimeError(f"serve exited {proc.returncode}: {err}")
            await asyncio.sleep(0.005)
        return tg.timed("getUpdates")[seen][0] - started
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def top_imports(count: int = 12) -> list[tuple[float, str]]:
    code = "import bub_bot.server, channels.telegram, channels.slack"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, cwd=ROOT
    ).stderr
    rows = []
    for line in out.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        try:
            rows.append((int(cumulative) / 1e6, name.rstrip()))
        except ValueError:
            continue
    top_level = [(t, n) for t, n in rows if not n.startswith("  ")]
    return sorted(top_level, reverse=True)[:count]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-poll-only", action="store_true")
    args = parser.parse_args()
    async with (
        FakeOpenAI() as model,
        FakeTelegram(token=TG_TOKEN) as tg,
        FakeSlack(bot_token="xoxb-bench", app_token="xapp-bench") as slack,
    ):
        home = tempfile.mkdtemp(prefix="bub-startup-")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))} | {
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": "sk-bench",
            "BUB_HOME": home,
            "BUB_LOG_LEVEL": "WARNING",
        }
        telegram = {
            "BUB_TELEGRAM_TOKEN": TG_TOKEN,
            "BUB_TELEGRAM_API_BASE": tg.base_url,
            "BUB_TELEGRAM_ALLOW_USERS": "*",
        }
        slack_env = {
            "BUB_SLACK_BOT_TOKEN": "xoxb-bench",
            "BUB_SLACK_APP_TOKEN": "xapp-bench",
            "BUB_SLACK_API_URL": slack.api_url,
        }
        configs = [
            ("no channel (exits 2)", base | {"BUB_WEB": "off"}, True),
            ("web chat only", base, False),
            ("telegram", base | telegram, False),
            ("slack", base | slack_env, False),
            ("both", base | telegram | slack_env, False),
        ]
        polls = [
            ("telegram", base | telegram | {"BUB_WEB": "off"}),
            ("telegram + web", base | telegram),
            ("telegram + web + slack", base | telegram | slack_env),
        ]
        print(f"{'configuration':<22} {'median s':>9} {'min s':>7}  (exec -> first getUpdates)")
        for name, env in polls:
            times = [await time_to_first_poll(env, tg) for _ in range(args.runs)]
            print(f"{name:<22} {statistics.median(times):>9.2f} {min(times):>7.2f}")
        print("target: <= 1.5 s\n")
        if args.first_poll_only:
            return
        print(f"{'configuration':<22} {'median s':>9} {'min s':>7}  (process start -> /readyz 200)")
        for name, env, exits in configs:
            times = [await time_to_ready(env, exits) for _ in range(args.runs)]
            print(f"{name:<22} {statistics.median(times):>9.2f} {min(times):>7.2f}")
    print("\ntarget: both <= 5.0 s")
    print("\ntop imports by cumulative time (python -X importtime):")
    for seconds, name in top_imports():
        print(f"  {seconds:6.2f} s  {name.strip()}")


if __name__ == "__main__":
    asyncio.run(main())
