"""bash of `true` per sandbox backend against a bare subprocess (prints figures, asserts
nothing). fs.write and web.fetch rows can be added beside these.

    .venv/bin/python bench/tools_bench.py [--runs 200] [--files 0]

`--files N`: the workspace holds N small files (100 per directory) first — as root, the
workspace is handed over to the sandbox uid (a walk of the tree) once per start, not per
command, so N should not change the p50.

Timed: the `bash` tool through `ToolRegistry.call` (argument checks, the launch, the
sandbox's set-up and teardown, reading the output, the result) for `true`; for comparison
`/bin/sh -c true` started the same way (asyncio subprocess, new session, pipes) with nothing
around it. The overhead is the difference of the p50s (target: at most 25 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


async def bare(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "true", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        await proc.communicate()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def through_tool(backend: str, runs: int, home: Path, files: int = 0) -> list[float] | str:
    from bub_bot.agent import ToolContext, ToolRegistry
    from bub_bot.agent.bash import install_bash
    from bub_bot.config import ConfigError, load_settings
    from bub_bot.tape import SQLiteTapeStore, Tape

    ws = home / f"ws-{backend}"
    ws.mkdir(parents=True)
    for n in range(files):
        folder = ws / f"d{n // 100}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{n}").write_text("x")
    settings = load_settings(
        require_model=False, home=home, workspace=ws, shell_sandbox=backend, _env_file=None
    )
    registry = ToolRegistry()
    try:
        shell = await install_bash(registry, settings)
    except ConfigError as exc:
        return str(exc)
    store = await SQLiteTapeStore.open(str(home / f"{backend}.db"))
    ctx = ToolContext(tape=Tape.for_session(store, "bench", ws), workspace=ws, settings=settings)
    args = json.dumps({"cmd": "true"})
    times = []
    try:
        for _ in range(runs):
            started = time.perf_counter()
            ok, result = await registry.call(ctx, "bash", args)
            times.append((time.perf_counter() - started) * 1000)
            if not ok or result["exit_code"] != 0:
                return f"failed: {result}"
    finally:
        if shell is not None:
            await shell.close()
        await store.close()
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--files", type=int, default=0, help="files in the workspace first")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)
    base = await bare(args.runs)
    base_p50 = statistics.median(base)
    print(f"bash `true`, {args.runs} runs each (ms), {args.files} files in the workspace")
    print(f"{'':<22}{'p50':>8}{'p99':>8}{'overhead p50':>14}")
    print(f"{'bare subprocess':<22}{base_p50:>8.1f}{pct(base, 99):>8.1f}{'':>14}")
    with tempfile.TemporaryDirectory(prefix="bub-bench-") as tmp:
        Path(tmp).chmod(0o711)
        for backend in ("bwrap", "landlock"):
            found = await through_tool(backend, args.runs, Path(tmp), args.files)
            if isinstance(found, str):
                print(f"{'bash ' + backend:<22}  not available: {found[:200]}")
                continue
            p50 = statistics.median(found)
            print(
                f"{'bash ' + backend:<22}{p50:>8.1f}{pct(found, 99):>8.1f}{p50 - base_p50:>+14.1f}"
            )


if __name__ == "__main__":
    asyncio.run(main())
