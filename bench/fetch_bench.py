"""web.fetch of a large HTML page, and skill discovery per model step (prints figures,
asserts nothing).

    .venv/bin/python bench/fetch_bench.py [--size 1000000] [--runs 30] [--skills 50]

Fetch: an aiohttp server on loopback (allowed through BUB_FETCH_ALLOW, as in the tests)
serves a generated HTML page of about `--size` bytes (headings, paragraphs, links, lists,
a table per section). Timed: `web.fetch` through `ToolRegistry.call` - the checks, the
pinned connection, the read, the HTML-to-Markdown conversion and the result text. For
comparison a bare aiohttp GET of the same page; the difference is what web.fetch adds
(mostly the conversion).

Skills: a workspace with `--skills` valid skills; the time `skills.catalog` takes at each
model step once its cache is warm (a stat per root and per SKILL.md), and cold (every file
read and parsed, as after a change of all of them).
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


def page(size: int) -> bytes:
    parts = ["<!doctype html><html><head><title>Bench page</title>"]
    parts.append("<style>p { margin: 0 }</style><script>var x = 1;</script></head><body>")
    index = 0
    while sum(len(p) for p in parts) < size:
        parts.append(
            f"<section><h2>Section {index}</h2><p>Some <b>bold</b> text with a"
            f" <a href='/page/{index}'>relative link</a> and more words to fill the line.</p>"
            "<ul><li>first item</li><li>second item</li></ul>"
            "<table><tr><th>key</th><th>value</th></tr><tr><td>a</td><td>1</td></tr></table>"
            "</section>"
        )
        index += 1
    parts.append("</body></html>")
    return "".join(parts).encode()


async def fetch_bench(size: int, runs: int) -> None:
    import aiohttp
    from aiohttp import web

    from bub_bot.agent import ToolContext, ToolRegistry
    from bub_bot.agent.web_fetch import register_web_fetch
    from bub_bot.config import load_settings
    from bub_bot.tape import SQLiteTapeStore, Tape

    body = page(size)
    app = web.Application()
    app.router.add_get("/", lambda _r: web.Response(body=body, content_type="text/html"))
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}/"

    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(
            require_model=False,
            home=Path(tmp),
            workspace=Path(tmp),
            fetch_allow=f"127.0.0.1:{port}",
            fetch_max_bytes=max(size * 2, 1024),
            _env_file=None,
        )
        store = await SQLiteTapeStore.open(Path(tmp) / "bub.db")
        registry = ToolRegistry()
        register_web_fetch(registry)
        ctx = ToolContext(
            tape=Tape.for_session(store, "bench", Path(tmp)), workspace=Path(tmp), settings=settings
        )
        args = json.dumps({"url": url, "max_chars": 1_000_000})

        fetched, bare = [], []
        out_chars = 0
        async with aiohttp.ClientSession() as session:
            for index in range(runs + 2):
                started = time.perf_counter()
                ok, result = await registry.call(ctx, "web.fetch", args)
                elapsed = (time.perf_counter() - started) * 1000
                assert ok, result
                out_chars = len(result)
                started = time.perf_counter()
                async with session.get(url) as resp:
                    await resp.read()
                bare_ms = (time.perf_counter() - started) * 1000
                if index >= 2:  # warm-up: imports, first connections
                    fetched.append(elapsed)
                    bare.append(bare_ms)
        await store.close()
    await runner.cleanup()
    p50, bare50 = statistics.median(fetched), statistics.median(bare)
    print(f"web.fetch of a {len(body) / 1e6:.2f} MB HTML page from loopback ({runs} runs):")
    print(
        f"  web.fetch   p50 {p50:7.1f} ms   p99 {pct(fetched, 99):7.1f} ms   -> {out_chars} chars of Markdown"
    )
    print(f"  bare GET    p50 {bare50:7.1f} ms   p99 {pct(bare, 99):7.1f} ms")
    print(f"  ratio web.fetch / bare GET (p50): {p50 / bare50:.1f}x")


def skills_bench(count: int) -> None:
    from bub_bot.agent.skills import SkillIndex

    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        for i in range(count):
            folder = workspace / "skills" / f"skill-{i}"
            folder.mkdir(parents=True)
            (folder / "SKILL.md").write_text(
                f"---\nname: skill-{i}\ndescription: What skill {i} does and when to use it.\n"
                f"metadata:\n  author: bench\n---\n# Skill {i}\n\n" + "Step.\n" * 100
            )
        cold, warm = [], []
        for _ in range(20):
            index = SkillIndex()
            started = time.perf_counter()
            found = index.catalog(workspace)
            cold.append((time.perf_counter() - started) * 1000)
            for _ in range(10):
                started = time.perf_counter()
                index.catalog(workspace)
                warm.append((time.perf_counter() - started) * 1000)
        assert len(found.skills) == count
    print(f"skill discovery, {count} skills in the workspace:")
    print(
        f"  per step, cache warm  p50 {statistics.median(warm):6.3f} ms   p99 {pct(warm, 99):6.3f} ms"
    )
    print(
        f"  cold (all parsed)     p50 {statistics.median(cold):6.3f} ms   p99 {pct(cold, 99):6.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--skills", type=int, default=50)
    options = parser.parse_args()
    asyncio.run(fetch_bench(options.size, options.runs))
    skills_bench(options.skills)


if __name__ == "__main__":
    main()
