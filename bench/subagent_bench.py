"""Fork merge time and the overhead of a temp subagent call (prints figures, asserts nothing).

    .venv/bin/python bench/subagent_bench.py [--merges 20] [--calls 200]
        [--store postgresql://user:password@host:5432/db]

1. Merge: a tape with 200 entries is forked, 1 000 entries (messages, tool round trips) are
   appended to the fork, and `merge()` moves them to the parent in one transaction (plus the
   `fork.merge` event, the fork dropped). Printed: p50 / max ms over `--merges` runs, on a
   SQLite file (and on PostgreSQL with `--store`).
2. Temp subagent: the fake OpenAI server from `tests/fakes` answering instantly over loopback
   HTTP. A one-step turn with no subagent, and `Subagents.run` of a temp subagent call (a
   fresh tape, the prompt, one model step, the tape archived), each `--calls` times. The
   overhead of the subagent = p50(subagent run) - p50(plain turn): what the subagent costs
   on top of the model step it makes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.agent.subagent import SubagentCall, Subagents
from bub_bot.config import load_settings
from bub_bot.tape import Tape, TapeEntry, fork, open_store
from tests.fakes.openai_server import FakeOpenAI, text


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def entries(n: int) -> list[TapeEntry]:
    made: list[TapeEntry] = []
    for i in range(n):
        if i % 3 == 0:
            made.append(TapeEntry.message({"role": "user", "content": f"question {i} " * 10}))
        elif i % 3 == 1:
            made.append(
                TapeEntry.tool_call(
                    [
                        {
                            "id": f"c{i}",
                            "type": "function",
                            "function": {"name": "fs_list", "arguments": "{}"},
                        }
                    ]
                )
            )
        else:
            made.append(
                TapeEntry.tool_result([{"tool_call_id": f"c{i - 1}", "content": "x" * 200}])
            )
    return made


async def bench_merge(url: str, runs: int) -> list[float]:
    times = []
    async with open_store(url) as store:
        for run in range(runs):
            tape = Tape(store, f"bench-merge-{run}-{time.time_ns()}", "bench")
            await tape.append_many(entries(200), bootstrap=True)
            child = await fork(tape)
            for _ in range(4):
                await child.append_many(entries(250))
            started = time.perf_counter()
            merged = await child.merge()
            times.append((time.perf_counter() - started) * 1000)
            assert merged.entries == 1000
    return times


async def bench_subagent(calls: int, home: Path) -> tuple[list[float], list[float]]:
    async with FakeOpenAI() as fake:
        fake.default = lambda body: text("done")
        settings = load_settings(
            _env_file=None, openai_base_url=fake.base_url, openai_api_key="sk-bench",
            model="fake-model", home=home, workspace=home / "ws", model_retries=0,
        )  # fmt: skip
        (home / "ws").mkdir(parents=True, exist_ok=True)
        async with open_store(settings) as store:
            agent = Agent(settings, ModelClient(settings), default_registry())
            subagents = Subagents(agent)
            parent = Tape.for_session(store, "bench:parent", settings.workspace)
            await parent.ensure_bootstrap_anchor()
            plain, sub = [], []
            for i in range(calls + 10):
                tape = Tape.for_session(store, f"bench:plain{i}", settings.workspace)
                started = time.perf_counter()
                await agent.run_turn(tape, [{"role": "user", "content": "hi"}])
                if i >= 10:
                    plain.append((time.perf_counter() - started) * 1000)
                call = SubagentCall(
                    id=f"sa-{i:08d}", prompt="hi", session="temp", allowed=[], model=None,
                    depth=1, parent_tape=parent.name, parent_session="bench:parent",
                    workspace=str(settings.workspace), payer={}, origin={},
                )  # fmt: skip
                started = time.perf_counter()
                outcome = await subagents.run(store, call)
                if i >= 10:
                    sub.append((time.perf_counter() - started) * 1000)
                assert outcome.ok, outcome
            await agent.model.close()
    return plain, sub


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--merges", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[tuple[str, Any]] = [("sqlite", f"sqlite:///{tmp}/bench.db")]
        if args.store:
            stores.append(("postgresql", args.store))
        for kind, url in stores:
            times = await bench_merge(url, args.merges)
            print(f"merge of a 1 000-entry fork ({kind}): p50 {pct(times, 50):.1f} ms,"
                  f" max {max(times):.1f} ms over {len(times)} merges")  # fmt: skip
        plain, sub = await bench_subagent(args.calls, Path(tmp) / "home")
        p_plain, p_sub = pct(plain, 50), pct(sub, 50)
        print(f"one-step turn, no subagent: p50 {p_plain:.2f} ms")
        print(f"temp subagent run (fresh tape, one step, archived): p50 {p_sub:.2f} ms,"
              f" p99 {pct(sub, 99):.2f} ms")  # fmt: skip
        print(f"overhead of a temp subagent call: p50 {p_sub - p_plain:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
