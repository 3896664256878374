"""MCP tool calls and start-up (prints figures, asserts nothing).

    .venv/bin/python bench/mcp_bench.py [--calls 1000] [--concurrency 10] [--servers 3]

Calls: the test server (tests/mcp_servers/tools_server.py, official SDK) runs as its own
process, once over stdio and once over Streamable HTTP on loopback; its `echo` tool answers
instantly. `--calls` calls, `--concurrency` at a time, go through `ToolRegistry.call` - the
path a model's tool call takes (argument JSON, the tool, the SDK session, the transport, the
result conversion). Per call: p50/p99 ms. For comparison the same calls through a bare
`mcp.Client`: the difference is what bub-bot adds on top of the SDK.

Start-up: fresh interpreters open a bot (SQLite store, agent, runtime, the HTTP server of
`serve` with /readyz) without and with `--servers` stdio servers configured. Reported: time
to ready (the serve side does not wait for MCP servers: the first turn waits for them instead,
at most 10 s), and time until every server is connected with its tools listed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SERVER = ROOT / "tests" / "mcp_servers" / "tools_server.py"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def timed_calls(call: Any, calls: int, concurrency: int) -> tuple[list[float], float]:
    """Run `calls` calls, `concurrency` at a time; (per-call ms, wall seconds)."""
    latencies: list[float] = []
    queue = iter(range(calls))

    async def worker() -> None:
        for index in queue:
            started = time.perf_counter()
            await call(index)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def show(label: str, latencies: list[float], wall: float) -> None:
    print(
        f"  {label:<28} p50 {pct(latencies, 50):6.2f} ms   p99 {pct(latencies, 99):6.2f} ms"
        f"   mean {statistics.fmean(latencies):6.2f} ms   {len(latencies) / wall:7.0f} calls/s"
    )


async def start_http_server() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.mcp_servers.http_server",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    url = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
    return proc, url


async def bench_calls(calls: int, concurrency: int) -> None:
    from mcp import Client, StdioServerParameters

    from bub_bot.agent import ToolContext, default_registry
    from bub_bot.agent.mcp import McpManager, McpServerConfig
    from bub_bot.config import load_settings
    from bub_bot.tape import SQLiteTapeStore, Tape

    http_proc, url = await start_http_server()
    servers = [
        McpServerConfig("local", "stdio", command=sys.executable, args=(str(SERVER),)),
        McpServerConfig("remote", "http", url=url),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings = load_settings(require_model=False, home=work, workspace=work, _env_file=None)
        store = await SQLiteTapeStore.open(work / "bench.db")
        registry = default_registry()
        manager = McpManager(servers, work)
        registry.sources.append(manager)
        manager.start()
        await manager.wait_started(30)
        ctx = ToolContext(
            tape=Tape.for_session(store, "bench", work), workspace=work, settings=settings
        )
        print(f"MCP calls: {calls} calls of `echo`, {concurrency} concurrent")
        try:
            for name, transport in (("local", "stdio"), ("remote", "Streamable HTTP")):
                tool = f"mcp_{name}_echo"

                async def through_bub(index: int, tool: str = tool) -> None:
                    ok, result = await registry.call(ctx, tool, json.dumps({"text": f"m{index}"}))
                    assert ok and result == f"m{index}", result

                await timed_calls(through_bub, 50, concurrency)  # warm-up
                print(f" {transport}:")
                show(
                    "through bub-bot (registry)",
                    *await timed_calls(through_bub, calls, concurrency),
                )

                target: Any = (
                    StdioServerParameters(command=sys.executable, args=[str(SERVER)])
                    if name == "local"
                    else url
                )
                async with Client(target, mode="legacy", cache=None) as client:

                    async def bare(index: int, client: Any = client) -> None:
                        result = await client.call_tool("echo", {"text": f"m{index}"})
                        assert result.content[0].text == f"m{index}"

                    await timed_calls(bare, 50, concurrency)
                    show("bare mcp.Client (SDK only)", *await timed_calls(bare, calls, concurrency))

                async def sequential(index: int, tool: str = tool) -> None:
                    ok, _ = await registry.call(ctx, tool, json.dumps({"text": "x"}))
                    assert ok

                show("through bub-bot, one at a time", *await timed_calls(sequential, 200, 1))
        finally:
            await manager.close()
            await store.close()
            http_proc.terminate()
            await http_proc.wait()


CHILD = r"""
import asyncio, io, json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from bub_bot.config import load_settings
from bub_bot.server import Bot, BotServer
from channels.cli import CliChannel

async def main():
    settings = load_settings(
        openai_base_url="http://127.0.0.1:9/v1", home={home!r}, workspace={home!r},
        mcp_config={config!r} or None, _env_file=None,
    )
    bot = await Bot.open(settings, [CliChannel(out=io.StringIO())])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    ready = time.perf_counter() - t0
    tools = None
    if bot.mcp is not None:
        await bot.mcp.wait_started(30)
        states = [s["state"] for s in bot.mcp.status().values()]
        assert states == ["ready"] * len(states), bot.mcp.status()
        tools = len(bot.mcp.tools())
    connected = time.perf_counter() - t0
    await server.stop()
    print(json.dumps({{"ready": ready, "connected": connected, "tools": tools}}))

asyncio.run(main())
"""


def startup_once(home: Path, config: Path | None) -> dict[str, Any]:
    code = CHILD.format(root=str(ROOT), home=str(home), config=str(config) if config else "")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=home
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_startup(servers: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        config = home / "mcp.json"
        config.write_text(
            json.dumps(
                {
                    "mcpServers": {
                        f"s{i}": {"command": sys.executable, "args": [str(SERVER)]}
                        for i in range(servers)
                    }
                }
            )
        )
        without = [startup_once(home, None) for _ in range(runs)]
        with_mcp = [startup_once(home, config) for _ in range(runs)]
    ready0 = statistics.median(r["ready"] for r in without)
    ready1 = statistics.median(r["ready"] for r in with_mcp)
    connected = statistics.median(r["connected"] for r in with_mcp)
    print(f"Start-up ({runs} fresh interpreters each, medians; {servers} stdio servers):")
    print(f"  ready without MCP                {ready0 * 1000:7.0f} ms")
    print(
        f"  ready with MCP                   {ready1 * 1000:7.0f} ms   (added {1000 * (ready1 - ready0):+.0f} ms)"
    )
    print(
        f"  all {servers} servers connected          {connected * 1000:7.0f} ms"
        f"   (added over ready without MCP: {1000 * (connected - ready0):+.0f} ms;"
        f" {with_mcp[0]['tools']} tools)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(bench_calls(args.calls, args.concurrency))
    print()
    bench_startup(args.servers, args.runs)


if __name__ == "__main__":
    main()
