"""Web chat and tape viewer over HTTP (prints figures, asserts nothing).

    .venv/bin/python bench/web_bench.py [--conversations 200] [--messages 3] [--latency 0.2]
        [--stream-seconds 0.5] [--chunks 10] [--modes on,off] [--entries 100000] [--repeat 20]

`bub-bot serve` runs as a real process with the web channel only (BUB_MAX_CONCURRENT_TURNS =
the number of conversations), the fake OpenAI server from `tests/fakes` in a child process
with a fixed latency per request, then (to a streamed request) the answer of about 60 words
in `--chunks` pieces spread over `--stream-seconds`; the clients (this process) speak the
page's API: one event stream per conversation, messages POSTed one after another (the next
when the previous answer arrived).

1. Chat, once per `--modes` (BUB_STREAM=on / off, a fresh `serve` each), after one message
   that warms the server up (its first model call imports the SDK): wall time vs the
   ideal (messages x the model's time; target <= 2x), and serve's CPU time vs the same
   ideal (one event loop runs all turns: its CPU time is a floor of the wall); with streaming the time from a POST to
   its first `partial` event with text (p50/p99, and the model's own time to its first text
   chunk for comparison); the time from a POST to the first byte of the event that carries
   its answer (p50/p99), plus the POST's own time (persist before acknowledge); serve CPU per
   message.
2. Viewer: a web tape of N entries (default 1e5, one anchor at its start, so "since the last
   anchor" is the whole tape) written before the server starts; time to answer its default
   view and one page of "all" (newest, and one from the middle), as HTML and JSON
   (target <= 50 ms for the default view).

BENCH_PROFILE=/tmp/serve.prof runs the chat's `serve` under cProfile, one file per mode
(/tmp/serve.prof.on, /tmp/serve.prof.off; read them with pstats). BENCH_PYSPY=/tmp/serve.txt
samples the timed part with py-spy instead (`py-spy` on PATH or BENCH_PYSPY_BIN; all threads,
the store's included, which cProfile does not see; collapsed stacks, one file per mode).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bub_bot.tape import SQLiteTapeStore, Tape, TapeEntry  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI, streamed, text  # noqa: E402
from tests.serve_process import free_port  # noqa: E402
from tests.web_client import WebChat, has_item  # noqa: E402

TOKEN = "bench-token-0123456789"
PROFILE = os.environ.get("BENCH_PROFILE")
PYSPY = os.environ.get("BENCH_PYSPY")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


FILLER = (
    "the answer goes on for a while so that streaming has something to show: a few plain"
    " sentences, some **bold** words, a `code` span and a list\n\n- one\n- two\n\nand the end"
    " of it, about sixty words in all, which is a short answer for a real model"
)


def _serve_fake(latency: float, chunks: int, seconds: float, conn: Any) -> None:
    def answer(body: dict[str, Any]) -> Any:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        said = users[-1].get("content") if users else ""
        return streamed(text(f"echo: {said}. {FILLER}"), chunks=chunks, seconds=seconds)

    async def main() -> None:
        async with FakeOpenAI(latency=latency) as fake:
            fake.default = answer
            conn.send(fake.base_url)
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    asyncio.run(main())


async def write_big_tape(db: Path, workspace: Path, entries: int) -> str:
    """A web session tape with `entries` entries after its first anchor; returns its name."""
    async with await SQLiteTapeStore.open(db) as store:
        tape = Tape.for_session(store, "web:bench-big-tape", workspace)
        await tape.ensure_bootstrap_anchor()
        batch: list[TapeEntry] = []
        for i in range(entries - 1):
            if i % 4 == 0:
                batch.append(TapeEntry.message({"role": "user", "content": f"question {i}"}))
            elif i % 4 == 1:
                batch.append(
                    TapeEntry.event("loop.step", {"step": 1, "status": "ok"}, context=False)
                )
            else:
                text = f"Answer {i}: **bold**, a list\n\n- one\n- two\n\n`code` and more text."
                batch.append(TapeEntry.message({"role": "assistant", "content": text}, turn="t"))
            if len(batch) >= 2000:
                await tape.append_many(batch)
                batch = []
        if batch:
            await tape.append_many(batch)
        return tape.name


async def start_serve(
    home: Path, model_url: str, conversations: int, stream: str, profile: str | None = None
) -> tuple[Any, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        BUB_HOME=str(home),
        BUB_WORKSPACE=str(home / "ws"),
        BUB_HOST="127.0.0.1",
        PORT=str(port),
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="sk-bench",
        BUB_MODEL="fake-model",
        BUB_MODEL_RETRIES="0",
        BUB_WEB_TOKEN=TOKEN,
        BUB_MAX_CONCURRENT_TURNS=str(conversations),
        # All the bench's event streams come from one address (this process), the warm-up's too.
        BUB_WEB_MAX_STREAMS_PER_CLIENT=str(max(conversations + 8, 32)),
        BUB_STREAM=stream,
        BUB_LOG_LEVEL="WARNING",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []),
        "-m", "bub_bot", "serve", cwd=home, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert "web chat: open" in line, line
    return proc, f"http://127.0.0.1:{port}"


async def warm_up(chat: WebChat) -> float:
    """One message answered before the timed part: the first model call of a fresh `serve`
    imports the model SDK (about 0.8 s here, on the event loop), once per process life, not
    per message. Returns its POST -> answer time (seconds)."""
    conversation = await chat.new_conversation()
    stream = await chat.events(conversation)
    try:
        await stream.until(lambda e: e.event == "sync")
        started = time.perf_counter()
        status, _ = await chat.post(conversation, "warm up")
        assert status == 202, status
        await stream.until(has_item("bot"), timeout=60)
        return time.perf_counter() - started
    finally:
        await stream.close()


async def chat_bench(chat: WebChat, conversations: int, messages: int) -> dict[str, Any]:
    warm = await warm_up(chat)
    ids = [await chat.new_conversation() for _ in range(conversations)]
    streams = await asyncio.gather(*(chat.events(c) for c in ids))
    for stream in streams:
        await stream.until(lambda e: e.event == "sync")
    answer_ms: list[float] = []
    partial_ms: list[float] = []
    post_ms: list[float] = []

    async def converse(conversation: str, stream: Any) -> None:
        for n in range(messages):
            client_id = uuid.uuid4().hex
            started = time.perf_counter()
            # Each conversation's own words: no two answers (or partials) are the same text.
            said = f"{conversation[-8:]} message {n}"
            status, _ = await chat.post(conversation, said, client_id)
            post_ms.append((time.perf_counter() - started) * 1000)
            assert status == 202, status
            event = await stream.until(
                lambda e: has_item("bot")(e) or (e.event == "partial" and e.data["html"]),
                timeout=60,
            )
            if event.event == "partial":
                partial_ms.append((time.perf_counter() - started) * 1000)
                await stream.until(has_item("bot"), timeout=60)
            answer_ms.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(converse(c, s) for c, s in zip(ids, streams, strict=True)))
    wall = time.perf_counter() - started
    for stream in streams:
        await stream.close()
    return {
        "warm": warm,
        "wall": wall,
        "answer_ms": answer_ms,
        "partial_ms": partial_ms,
        "post_ms": post_ms,
    }


async def timed_get(http: aiohttp.ClientSession, url: str, accept: str, repeat: int) -> list[float]:
    times = []
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": accept}
    for _ in range(repeat):
        started = time.perf_counter()
        async with http.get(url, headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, (url, resp.status)
        times.append((time.perf_counter() - started) * 1000)
    return times


def own_cpu() -> float:
    """User + system CPU time of this process (the bench's clients) so far."""
    times = os.times()
    return times.user + times.system


async def chat_report(
    http: aiohttp.ClientSession,
    home: Path,
    model_url: str,
    args: argparse.Namespace,
    mode: str,
    fake_pid: int,
) -> None:
    """The chat part against a fresh `serve` with BUB_STREAM=`mode`: prints its figures."""
    profile = f"{PROFILE}.{mode}" if PROFILE else None
    proc, base = await start_serve(home, model_url, args.conversations, mode, profile)
    try:
        chat = WebChat(http, base, TOKEN)
        spy = None
        if PYSPY:
            spy = await asyncio.create_subprocess_exec(
                os.environ.get("BENCH_PYSPY_BIN", "py-spy"), "record", "--pid", str(proc.pid),
                "--threads", "--idle", "--format", "raw", "-r", "250", "-o", f"{PYSPY}.{mode}",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(1.0)  # attached
        cpu_before = cpu_seconds(proc.pid)
        client_before, fake_before = own_cpu(), cpu_seconds(fake_pid)
        res = await chat_bench(chat, args.conversations, args.messages)
        server_cpu = cpu_seconds(proc.pid) - cpu_before
        client_cpu = own_cpu() - client_before
        fake_cpu = cpu_seconds(fake_pid) - fake_before
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await spy.wait()
    finally:
        proc.terminate()
        await proc.wait()
    # A streamed request gets the answer over --stream-seconds, a plain one at once.
    model = args.latency + (args.stream_seconds if mode == "on" else 0.0)
    first_chunk = args.latency + args.stream_seconds / (args.chunks + 1)
    ideal = args.messages * model
    total = args.conversations * args.messages
    print(
        f"\nchat, BUB_STREAM={mode}: {args.conversations} conversations x {args.messages}"
        f" messages, model {args.latency * 1000:.0f} ms"
        + (f" + {args.stream_seconds * 1000:.0f} ms streaming" if mode == "on" else "")
    )
    print(f"  wall time            {res['wall']:.2f} s   (ideal {ideal:.2f} s)")
    print(f"  ratio to ideal       {res['wall'] / ideal:.2f}   (target <= 2)")
    # One event loop runs every turn: the wall cannot be shorter than serve's CPU time.
    print(
        f"  serve CPU / ideal    {server_cpu / ideal:.2f}   (the floor one process sets;"
        f" first message after start {res['warm'] * 1000:.0f} ms, not timed)"
    )
    print(f"  messages/s           {total / res['wall']:.0f}")
    a, f, p = res["answer_ms"], res["partial_ms"], res["post_ms"]
    if f:
        print(
            f"  POST -> first partial p50 {pct(f, 50):.0f} ms   p99 {pct(f, 99):.0f} ms"
            f"   ({len(f)} of {total}; the model's first text chunk at {first_chunk * 1000:.0f} ms)"
        )
    print(f"  POST -> answer event p50 {pct(a, 50):.0f} ms   p99 {pct(a, 99):.0f} ms")
    print(f"  POST acknowledged    p50 {pct(p, 50):.1f} ms   p99 {pct(p, 99):.1f} ms")
    print(
        f"  serve CPU            {server_cpu * 1000 / total:.2f} ms per message"
        f" ({server_cpu:.2f} s, event streams opened and read included)"
    )
    # The clients and the fake model run on the same cores: their CPU is part of the wall.
    print(
        f"  bench CPU            clients {client_cpu:.2f} s, fake model {fake_cpu:.2f} s"
        f" (all three: {(server_cpu + client_cpu + fake_cpu) / res['wall']:.2f} cores"
        f" of {os.cpu_count()})"
    )


async def viewer_report(
    http: aiohttp.ClientSession, base: str, big: str, args: argparse.Namespace
) -> None:
    print(f"\nviewer: tape of {args.entries} entries, median of {args.repeat} requests")
    views = [
        ("default view (since the last anchor)", f"/tapes/{big}"),
        ("all, newest page", f"/tapes/{big}?view=all"),
        ("all, a middle page", f"/tapes/{big}?view=all&before={args.entries // 2}"),
        ("tape list", "/tapes"),
        ("chat history (page load)", "/api/conversations/bench-big-tape/messages"),
    ]
    for label, path in views:
        html = await timed_get(http, base + path, "text/html", args.repeat)
        data = await timed_get(http, base + path, "application/json", args.repeat)
        print(
            f"  {label:<38} HTML {statistics.median(html):6.1f} ms"
            f"   JSON {statistics.median(data):6.1f} ms"
            f"   (max {max(html + data):.1f} ms)"
        )
    print("  target: default view <= 50 ms")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bub-web-bench-") as tmp:
        home = Path(tmp)
        (home / "ws").mkdir()
        big = ""
        if not args.no_viewer:
            started = time.perf_counter()
            big = await write_big_tape(home / "bub.db", home / "ws", args.entries)
            print(
                f"wrote a tape of {args.entries} entries in {time.perf_counter() - started:.1f} s"
            )

        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        fake = ctx.Process(
            target=_serve_fake,
            args=(args.latency, args.chunks, args.stream_seconds, child),
            daemon=True,
        )
        fake.start()
        model_url = await asyncio.to_thread(conn.recv)
        try:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:
                for mode in args.modes.split(","):
                    assert fake.pid is not None
                    await chat_report(http, home, model_url, args, mode.strip(), fake.pid)
                if args.no_viewer:
                    return
                proc, base = await start_serve(home, model_url, 1, "on")
                try:
                    await viewer_report(http, base, big, args)
                finally:
                    proc.terminate()
                    await proc.wait()
        finally:
            conn.send("stop")
            await asyncio.to_thread(fake.join, 5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--stream-seconds", type=float, default=0.5)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--modes", default="on,off", help="BUB_STREAM values to run the chat with")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--no-viewer", action="store_true", help="the chat part only")
    parser.add_argument("--repeat", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
