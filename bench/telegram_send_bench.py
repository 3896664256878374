"""Telegram sends under the Bot API's limits (prints figures, asserts nothing).

    .venv/bin/python bench/telegram_send_bench.py [--chats 300] [--messages 3]
        [--groups 3] [--group-messages 30] [--scale 10] [--no-pacing]

The real `TelegramChannel` (aiogram) sends to the fake Bot API from `tests/fakes`, which
enforces Telegram's limits (30 messages/s overall, 1/s per chat, 20/min per group), all
`--scale` times faster; the channel is configured with the same scaled limits. Every private
chat sends its messages one after another (like the runtime sends the pieces of an answer)
while every group has its whole backlog queued at once.

Printed: wall time (and what the overall limit alone allows), sends/s, 429s and their ratio
to requests, requests that came back before their retry_after, whether every chat got its
messages once and in order, and when the private chats and the groups were done (chats take
turns, so the private chats finish near what the overall limit allows while the groups'
backlog drains at 20 a minute).
`--no-pacing` turns the limits off in the channel (429s are still honoured) for comparison.
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

from bub_bot.config import load_settings
from channels.base import DeliveryError, Received
from channels.telegram import TelegramChannel
from tests.fakes.telegram_api import FakeTelegram

TOKEN = "123:ABC"


class NoRuntime:
    """The channel only sends here; nothing is received."""

    async def receive(self, inbound: Any) -> Received:
        return Received(new=False)

    async def session_known(self, session_id: str) -> bool:
        return False

    async def move_session(self, old: str, new: str) -> None:
        return None

    def note_inbound(self, channel: str, outcome: str) -> None:
        return None


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> None:
    scale = args.scale
    async with FakeTelegram(token=TOKEN) as tg:
        limits = tg.enforce_limits(time_scale=scale)
        rates = {
            "telegram_rate_global": f"30/{1 / scale:g}s",
            "telegram_rate_chat": f"1/{1 / scale:g}s",
            "telegram_rate_group": f"20/{60 / scale:g}s",
        }
        if args.no_pacing:
            rates = dict.fromkeys(rates, "off")
        with tempfile.TemporaryDirectory() as home:
            settings = load_settings(
                require_model=False,
                _env_file=None,
                home=Path(home),
                telegram_token=TOKEN,
                telegram_api_base=tg.base_url,
                **rates,
            )
            channel = TelegramChannel(settings, poll_timeout=1)
            await channel.start(NoRuntime())  # type: ignore[arg-type]
            try:
                await measure(args, tg, limits, channel, scale)
            finally:
                await channel.stop()


async def measure(
    args: argparse.Namespace, tg: FakeTelegram, limits: Any, channel: TelegramChannel, scale: float
) -> None:
    privates = [1000 + n for n in range(args.chats)]
    groups = [-1000 - n for n in range(1, args.groups + 1)]
    lost = 0
    private_done: list[float] = []
    group_done = 0.0
    started = time.perf_counter()

    async def private(chat: int) -> None:
        nonlocal lost
        for n in range(args.messages):
            try:
                await channel.send({"chat_id": chat}, f"answer {n}")
            except DeliveryError:
                lost += 1
        private_done.append(time.perf_counter() - started)

    async def group_topic(chat: int, topic: int, count: int) -> None:
        nonlocal lost, group_done
        for n in range(count):
            try:
                await channel.send({"chat_id": chat, "thread_id": topic}, f"group {topic} {n}")
            except DeliveryError:
                lost += 1
        group_done = max(group_done, time.perf_counter() - started)

    topics = 10  # the group's backlog comes from ten forum topics at once
    per_topic = max(1, args.group_messages // topics)
    await asyncio.gather(
        *(group_topic(g, 100 + t, per_topic) for g in groups for t in range(topics)),
        *(private(c) for c in privates),
    )
    wall = time.perf_counter() - started

    sends = args.chats * args.messages + len(groups) * topics * per_topic
    in_order = all(
        [m["text"] for m in tg.sent_to(c)] == [f"answer {n}" for n in range(args.messages)]
        for c in privates
    ) and all(
        [m["text"] for m in tg.sent_to(g, 100 + t)]
        == [f"group {100 + t} {n}" for n in range(per_topic)]
        for g in groups
        for t in range(topics)
    )
    bound = (-(-sends // 30) - 1) / scale  # 30 in any window: the first 30 at once
    requests = limits.accepted + limits.rejected
    print(f"pacing:              {'off' if args.no_pacing else 'on'} (limits {scale:g}x faster)")
    print(
        f"messages:            {sends} ({args.chats} chats x {args.messages}, {len(groups)} groups x {topics * per_topic})"
    )
    print(f"delivered:           {len(tg.sent)}  lost: {lost}  once and in order: {in_order}")
    print(f"wall time:           {wall:.2f} s  (the overall limit alone allows >= {bound:.2f} s)")
    print(f"sends/s:             {len(tg.sent) / wall:.1f}  (limit {30:g} in any {1 / scale:g} s)")
    print(
        f"429s:                {limits.rejected} of {requests} requests ({100 * limits.rejected / max(requests, 1):.2f} %)"
    )
    print(f"came back too early: {limits.ignored_retry_after}")
    print(
        f"private chats done:  p50 {pct(private_done, 50):.2f} s  p95 {pct(private_done, 95):.2f} s"
        f"  max {max(private_done, default=float('nan')):.2f} s"
    )  # fmt: skip
    print(f"groups done:         {group_done:.2f} s (20 a minute each, sliding window)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=300)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--group-messages", type=int, default=30)
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--no-pacing", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
