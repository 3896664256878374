"""Agent loop overhead per model step, on small and large tapes (prints figures, asserts nothing).

    .venv/bin/python bench/agent_bench.py [--one-step 200] [--two-step 100] [--sizes 1000,100000]

The model is the fake OpenAI server from `tests/fakes` answering instantly (latency 0) over
loopback HTTP. For each tape size the tape is bulk-loaded with `append_many` in big batches,
with an anchor about 20 entries before the end, then turns run through `Agent.run_turn`:
1-step turns (plain answer) and 2-step turns (a `tape_info` tool call, then an answer).

"Our overhead" per step = (turn wall time - time spent inside the model call) / steps, where
the model call's time is the client-observed latency of each `ModelClient.complete` (SDK + HTTP
round trip + the fake). A second figure subtracts instead the time a bare `AsyncOpenAI` client
takes to send each of the turn's recorded requests again (replayed after the run), which also
charges our model-client wrapper to us but is noisier (two separate measurements). Every 10 turns a new anchor is written (outside the timed region) so the context
stays "recent" as it would in a conversation that hands off now and then.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.config import load_settings
from bub_bot.tape import SQLiteTapeStore, Tape, TapeEntry
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls

BATCH = 10_000
RECENT = 20
REANCHOR_EVERY = 10
WARMUP = 10


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def filler(i: int) -> TapeEntry:
    """A realistic mix: chat messages, tool calls and results, run events."""
    k = i % 6
    if k == 0:
        return TapeEntry.message({"role": "user", "content": f"question {i}: " + "words " * 30})
    if k == 1:
        return TapeEntry.tool_call(
            [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": "fs_read", "arguments": "{}"},
                }
            ]
        )
    if k == 2:
        return TapeEntry.tool_result([{"tool_call_id": f"c{i - 1}", "content": "data " * 40}])
    if k == 3:
        return TapeEntry.message({"role": "assistant", "content": f"answer {i}: " + "text " * 40})
    if k == 4:
        return TapeEntry.event("run", {"model": "fake-model", "usage": {"total_tokens": 10}})
    return TapeEntry.event("loop.step", {"step": 1, "status": "ok"}, context=False)


async def bulk_load(tape: Tape, size: int) -> float:
    """Fill `tape` to `size` entries with an anchor RECENT entries before the end."""
    started = time.perf_counter()
    await tape.ensure_bootstrap_anchor()
    written = 1
    before_anchor = size - RECENT
    while written < before_anchor:
        n = min(BATCH, before_anchor - written)
        await tape.append_many([filler(written + j) for j in range(n)])
        written += n
    recent = [TapeEntry.anchor("bench/phase", {"summary": "recent phase"})]
    recent += [filler(6 * k + (0 if k % 2 == 0 else 3)) for k in range(RECENT - 1)]
    await tape.append_many(recent)
    return time.perf_counter() - started


@dataclass
class Turn:
    wall_ms: float
    steps: int
    model_ms: float
    requests: range  # indices into the fake's recorded requests

    @property
    def overhead_per_step(self) -> float:
        return (self.wall_ms - self.model_ms) / self.steps


class Timer:
    """Collects the client-observed latency of each model call (agent hook)."""

    def __init__(self) -> None:
        self.model_ms: list[float] = []

    def __call__(self, name: str, data: dict[str, Any]) -> None:
        if name == "model_call":
            self.model_ms.append(data["latency_ms"])


async def run_turns(
    agent: Agent, fake: FakeOpenAI, tape: Tape, timer: Timer, turns: int, two_step: bool
) -> list[Turn]:
    """Run timed turns (after WARMUP untimed ones)."""
    timed: list[Turn] = []
    for i in range(turns + WARMUP):
        if i % REANCHOR_EVERY == 0:
            await tape.handoff("bench/phase", {"summary": f"phase {i}"})
        if two_step:
            fake.script(tool_calls([("tape_info", {})]), text("done"))
        else:
            fake.script(text("ok"))
        timer.model_ms.clear()
        first = len(fake.completion_requests())
        started = time.perf_counter()
        result = await agent.run_turn(tape, [{"role": "user", "content": f"turn {i} please"}])
        wall = (time.perf_counter() - started) * 1000
        assert result.status == "ok", result
        if i >= WARMUP:
            requests = range(first, len(fake.completion_requests()))
            timed.append(Turn(wall, result.steps, sum(timer.model_ms), requests))
    return timed


async def bare_round_trip(fake: FakeOpenAI, bodies: list[dict[str, Any]]) -> list[float]:
    """Each recorded request again through a bare AsyncOpenAI client (ms per request)."""
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    times: list[float] = []
    try:
        for body in bodies:
            fake.script(text("ok"))
            kwargs = {k: v for k, v in body.items() if k in ("model", "messages", "tools")}
            started = time.perf_counter()
            await client.chat.completions.create(**kwargs)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await client.close()
    return times


async def bench_size(
    fake: FakeOpenAI, root: Path, size: int, one_step: int, two_step: int
) -> dict[str, Any]:
    workspace = root / f"ws{size}"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Be brief.\n", encoding="utf-8")
    settings = load_settings(
        openai_base_url=fake.base_url,
        openai_api_key="sk-test",
        model="fake-model",
        workspace=workspace,
        home=root / f"home{size}",
        model_retries=0,
        _env_file=None,
    )
    store = await SQLiteTapeStore.open(settings.database_path)
    model = ModelClient(settings)
    try:
        tape = Tape.for_session(store, f"bench:{size}", workspace)
        load_s = await bulk_load(tape, size)
        agent = Agent(settings, model, default_registry())
        timer = Timer()
        agent.hooks.append(timer)
        one = await run_turns(agent, fake, tape, timer, one_step, two_step=False)
        two = await run_turns(agent, fake, tape, timer, two_step, two_step=True)
        bodies = [r.body for r in fake.completion_requests()]
        bare = await bare_round_trip(fake, bodies)
        stats = await store.stats(tape.name)
    finally:
        await model.close()
        await store.close()

    def vs_bare(turn: Turn) -> float:
        return (turn.wall_ms - sum(bare[i] for i in turn.requests)) / turn.steps

    return {
        "size": size,
        "load_s": load_s,
        "entries_after": stats.entries,
        "one": [t.overhead_per_step for t in one],
        "two": [t.overhead_per_step for t in two],
        "one_vs_bare": [vs_bare(t) for t in one],
        "two_vs_bare": [vs_bare(t) for t in two],
        "bare": [bare[i] for t in one + two for i in t.requests],
        "wall": [t.wall_ms / t.steps for t in one + two],
    }


def line(label: str, values: list[float]) -> str:
    return (
        f"  {label:<38} p50 {pct(values, 50):6.2f} ms   p99 {pct(values, 99):6.2f} ms"
        f"   (n={len(values)})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-step", type=int, default=200, help="1-step turns per size")
    parser.add_argument("--two-step", type=int, default=100, help="2-step turns per size")
    parser.add_argument("--sizes", default="1000,100000", help="tape sizes, comma separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    results = []
    async with FakeOpenAI(latency=0.0) as fake:
        with tempfile.TemporaryDirectory(prefix="bub-bench-") as tmp:
            for size in sizes:
                results.append(
                    await bench_size(fake, Path(tmp), size, args.one_step, args.two_step)
                )

    print("agent loop overhead per model step (our time, the model's time excluded)")
    print(f"python {sys.version.split()[0]}, openai {openai.__version__}, fake latency 0")
    for r in results:
        print(
            f"\ntape of {r['size']:,} entries (bulk load {r['load_s']:.2f} s; anchor {RECENT} "
            f"entries before the end; {r['entries_after']:,} entries after the run)"
        )
        print(line("1-step turns: wall - model call", r["one"]))
        print(line("2-step turns: (wall - model calls)/2", r["two"]))
        print(line("all steps: wall - model call(s)", r["one"] + r["two"]))
        print(line("1-step turns: wall - bare replay", r["one_vs_bare"]))
        print(line("2-step turns: (wall - bare replays)/2", r["two_vs_bare"]))
        print(line("bare AsyncOpenAI call, same request", r["bare"]))
        print(line("turn wall time per step (reference)", r["wall"]))
    if len(results) >= 2:
        small, large = results[0], results[-1]
        ratio = pct(large["one"] + large["two"], 50) / pct(small["one"] + small["two"], 50)
        ratio99 = pct(large["one"] + large["two"], 99) / pct(small["one"] + small["two"], 99)
        print(
            f"\nratio {large['size']:,} / {small['size']:,} entries: p50 {ratio:.2f}x,"
            f" p99 {ratio99:.2f}x   (target: p50 <= 5 ms, same at both sizes)"
        )
    print(
        json.dumps({"p50_ms": {r["size"]: round(pct(r["one"] + r["two"], 50), 3) for r in results}})
    )


if __name__ == "__main__":
    asyncio.run(main())
