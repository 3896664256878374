"""Streaming replies: how soon the user sees text, and what streaming costs (prints figures,
asserts nothing).

    .venv/bin/python bench/stream_bench.py [--turns 200] [--chats 20] [--seconds 1.0]
        [--chunks 20] [--chat private|group] [--telegram-rates off|default]

`bub-bot serve` runs as a real process (Telegram channel, long polling) against the fake Bot
API and the fake model, both in this process (so their CPU is not the bot's, and one
monotonic clock times both). Each turn the model streams an answer of about 450 characters in
`--chunks` chunks over `--seconds`; `--chats` private chats (or groups) talk at once, each
sending its next message when the previous answer arrived, `--turns` turns in all.

Printed, for the streamed run:
- first visible: from the model's first chunk to the first platform call that shows text
  (a draft in a private chat; the first message in a group, where the bot deliberately waits
  0.8 s so that a quick answer is just sent), p50 / p99 (targets: p50 <= 50 ms in private
  chats);
- final: from the model's last chunk (its finish) to the call that makes the chat show the
  final answer: the `sendMessage` in a private chat, the last post or edit in a group
  (negative when a partial edit already showed all of it), p50 / p99 (target: p50 <= 100 ms);
- platform calls per turn;
then the same turns with BUB_STREAM=off, and the bot's CPU time per turn in both runs (from
/proc: user + system; target: streamed <= 2x non-streamed).

`--telegram-rates off` (default) lifts the outbound pacer's limits so the figures are the
bot's own latency; `default` keeps Telegram's 1/s per chat and 20/min per group, where a
final message may wait for the chat's window after the last draft or edit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from channels.telegram_format import html_to_text, markdown_to_html
from tests.fakes.openai_server import FakeOpenAI, Reply, slow, streamed, text
from tests.fakes.telegram_api import FakeTelegram
from tests.serve_process import free_port, wait_ready

TOKEN = "123456:BENCH-token"
WORDS = (
    "Streaming shows the answer while the model writes it, so the user reads the first"
    " words while the rest is still on its way; the final message then carries the"
    " formatted text. "
)
ANSWER = (WORDS * 3).strip()
ANSWER_SHOWN = html_to_text(markdown_to_html(ANSWER))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def until(check: Any, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 (polls the fakes)
            await asyncio.sleep(0.01)


class Serve:
    """`bub-bot serve` in a child process."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Serve:
        exe = Path(sys.executable).with_name("bub-bot")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bub_bot"]
        if os.environ.get("STREAM_BENCH_PROFILE"):  # a cProfile of the bot, for digging
            out = f"{os.environ['STREAM_BENCH_PROFILE']}.{self.env['BUB_STREAM']}"
            cmd = [sys.executable, "-m", "cProfile", "-o", out, "-m", "bub_bot"]
        log = (self.cwd / "serve.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, "serve", env=self.env, cwd=self.cwd, stdout=log, stderr=log
        )
        url = f"http://127.0.0.1:{self.env['PORT']}"
        await wait_ready(url, self.proc, self.cwd / "serve.log", timeout=30)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        await asyncio.wait_for(self.proc.wait(), 30)


async def run(args: argparse.Namespace, stream: bool, home: Path) -> dict[str, Any]:
    (home / "ws").mkdir(parents=True)
    async with FakeOpenAI() as model, FakeTelegram(token=TOKEN, username="bench_bot") as tg:

        def answer(body: dict[str, Any]) -> Reply:
            if body.get("stream"):
                return streamed(text(ANSWER), chunks=args.chunks, seconds=args.seconds)
            return slow(text(ANSWER), args.seconds)

        model.default = answer
        rates = (
            {}
            if args.telegram_rates == "default"
            else {
                "BUB_TELEGRAM_RATE_GLOBAL": "off",
                "BUB_TELEGRAM_RATE_CHAT": "off",
                "BUB_TELEGRAM_RATE_GROUP": "off",
            }
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
        env.update(
            BUB_TELEGRAM_TOKEN=TOKEN,
            BUB_TELEGRAM_API_BASE=tg.base_url,
            BUB_TELEGRAM_ALLOW_USERS="*",
            BUB_WEB="off",
            OPENAI_BASE_URL=model.base_url,
            OPENAI_API_KEY="sk-bench",
            BUB_MODEL="fake-model",
            BUB_MODEL_RETRIES="0",
            BUB_HOME=str(home),
            BUB_WORKSPACE=str(home / "ws"),
            BUB_HOST="127.0.0.1",
            BUB_LOG_LEVEL="WARNING",
            BUB_STREAM="on" if stream else "off",
            BUB_MAX_CONCURRENT_TURNS=str(args.chats * 2),
            PORT=str(free_port()),
            **rates,
        )
        async with Serve(env, home) as serve:
            group = args.chat == "group"
            chats = [(-1_000_000 - i if group else 1000 + i) for i in range(args.chats)]
            per_chat = args.turns // args.chats
            # One turn first: the model SDK is imported on the first call (a second of CPU).
            tg.push_update(tg.private_text(999, "warm up"))
            await until(lambda: tg.sent_to(999))
            await asyncio.sleep(0.2)
            cpu_before = cpu_seconds(serve.pid)
            started = time.perf_counter()

            async def talk(chat: int) -> None:
                for n in range(per_chat):
                    words = f"turn {chat} {n}"
                    if group:
                        update = tg.group_text(chat, 42, f"@bench_bot {words}")
                    else:
                        update = tg.private_text(chat, words)
                    tg.push_update(update)
                    await until(
                        lambda n=n, chat=chat: (
                            len(tg.sent_to(chat)) >= n + 1
                            and (not group or tg.visible(chat)[-1:] == [ANSWER_SHOWN])
                        )
                    )
                    await asyncio.sleep(0.05)  # the final record and cursor settle

            await asyncio.gather(*(talk(c) for c in chats))
            wall = time.perf_counter() - started
            cpu = cpu_seconds(serve.pid) - cpu_before
        turns = per_chat * len(chats)
        result: dict[str, Any] = {"turns": turns, "wall": wall, "cpu_per_turn": cpu / turns}
        if not stream:
            return result
        # Pair each turn's stream with the platform calls in its chat between its first chunk
        # and the next turn's.
        calls: dict[int, list[tuple[float, str, dict[str, Any]]]] = defaultdict(list)
        for t, method, params in tg.timed("sendMessageDraft", "sendMessage", "editMessageText"):
            calls[int(params["chat_id"])].append((t, method, params))
        first_visible, final, per_turn = [], [], []
        for log in model.streams:
            if not log.user.startswith(("turn ", "@bench_bot turn ")):
                continue  # the warm-up
            _, chat_text, n_text = log.user.rsplit(" ", 2)
            chat, n = int(chat_text), int(n_text)
            mine = [c for c in calls[chat] if c[0] >= log.first]
            nxt = next((s for s in model.streams if s.user.endswith(f" {chat} {n + 1}")), None)
            if nxt is not None:
                mine = [c for c in mine if c[0] < nxt.first]
            shown = [c for c in mine if c[2].get("text")]
            if shown:
                first_visible.append(shown[0][0] - log.first)
            last_call = [c for c in mine if c[1] != "sendMessageDraft"][-1]
            final.append(last_call[0] - log.ended)
            per_turn.append(len(mine))
        result.update(first=first_visible, final=final, calls=per_turn)
        return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--chat", choices=["private", "group"], default="private")
    parser.add_argument("--telegram-rates", choices=["off", "default"], default="off")
    args = parser.parse_args()
    print(
        f"{args.turns} turns in {args.chats} {args.chat} chats; the model streams"
        f" {len(ANSWER)} characters in {args.chunks} chunks over {args.seconds:g} s;"
        f" Telegram rates {args.telegram_rates}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        on = await run(args, True, Path(tmp) / "on")
        off = await run(args, False, Path(tmp) / "off")

    def ms(values: list[float], q: float) -> str:
        return f"{pct(values, q) * 1000:7.1f} ms"

    print(f"streamed:     {on['turns']} turns in {on['wall']:.1f} s")
    print(
        f"  first visible after the first chunk   p50 {ms(on['first'], 50)}   p99 {ms(on['first'], 99)}"
    )
    print(
        f"  final after the last chunk            p50 {ms(on['final'], 50)}   p99 {ms(on['final'], 99)}"
    )
    print(
        f"  platform calls per turn               p50 {pct(on['calls'], 50):.0f}   max {max(on['calls'])}"
    )
    print(f"not streamed: {off['turns']} turns in {off['wall']:.1f} s")
    ratio = on["cpu_per_turn"] / off["cpu_per_turn"]
    print(
        f"bot CPU per turn: streamed {on['cpu_per_turn'] * 1000:.1f} ms, not streamed"
        f" {off['cpu_per_turn'] * 1000:.1f} ms: {ratio:.2f}x (target <= 2x)"
    )


if __name__ == "__main__":
    asyncio.run(main())
