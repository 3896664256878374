"""Telegram sends under the Bot API's limits (prints figures, asserts nothing).

    .venv/bin/python bench/telegram_send_bench.py [--chats 300] [--messages 3]
        [--groups 3] [--group-messages 30] [--scale 10] [--no-pacing]
        [--stream [--model-ms 200] [--chunks 10]]

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

`--stream`: every answer is streamed as the server does it with its defaults (BUB_STREAM on):
the model writes it in `--chunks` steps over `--model-ms` (scaled like the limits), the
runtime's `TurnStream` hands the text to the channel's stream (drafts in private chats, a
message edited in place in groups) once per interval, then the answer goes out as without
streaming; "typing…" is on meanwhile. Printed besides: the private chats' time against the
floor (their answers / 30 per second), drafts sent and dropped, typing sent, and a quiet
chat's first draft: on an idle bot before the load, and one that starts in the middle of it.
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

from bub_bot.agent import Progress
from bub_bot.config import load_settings
from bub_bot.runtime.streaming import TurnStream
from channels.base import DeliveryError, Received
from channels.telegram import TelegramChannel
from tests.fakes.telegram_api import FakeTelegram

TOKEN = "123:ABC"
FILLER = (
    " is streamed while the model writes it: the user reads the first words while the rest"
    " is still on its way, and the final message then carries the whole formatted text."
)
QUIET = 999_999
"""The quiet private chat (one message, on an idle bot and again in the middle of the load)."""


class NoTape:
    """Where TurnStream records the ids of partial messages (nothing is kept here)."""

    async def append(self, entry: Any) -> Any:
        return entry


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
                stream=args.stream,
                stream_interval_ms=round(1000 / scale),  # the channel's 1 s, scaled
                **rates,
            )
            channel = TelegramChannel(settings, poll_timeout=1, typing_interval=4.0 / scale)
            await channel.start(NoRuntime())  # type: ignore[arg-type]
            answer = Answerer(args, channel, settings, scale)
            try:
                await measure(args, tg, limits, channel, scale, answer)
            finally:
                await channel.stop()


class Answerer:
    """Sends one answer the way the runtime does: streamed (`--stream`) or just sent."""

    def __init__(self, args: argparse.Namespace, channel: TelegramChannel, settings: Any,
                 scale: float) -> None:  # fmt: skip
        self.args = args
        self.channel = channel
        self.settings = settings
        self.model_seconds = args.model_ms / 1000 / scale
        self.first_text: dict[int, float] = {}
        """Chat -> seconds from its model's first chunk to the first draft the stream sent
        (reported by TurnStream once per turn; only the quiet chat's are read)."""

    async def __call__(self, target: dict[str, Any], text: str) -> None:
        if not self.args.stream:
            await self.channel.send(target, text)
            return
        chat = int(target["chat_id"])
        async with self.channel.working(target):
            stream = self.channel.stream(target, [])
            started = time.perf_counter()

            def emit(event: str, **data: Any) -> None:
                if event == "first_text" and data.get("streamed"):
                    self.first_text.setdefault(chat, time.perf_counter() - started)

            shown = TurnStream(
                stream,
                tape=NoTape(),  # type: ignore[arg-type]
                turn_id=f"{chat}:{text[:12]}",
                channel="telegram",
                settings=self.settings,
                emit=emit,
            )
            chunks = max(1, self.args.chunks)
            async with shown:
                for n in range(1, chunks + 1):
                    shown.progress(Progress("text", text=text[: len(text) * n // chunks]))
                    await asyncio.sleep(self.model_seconds / chunks)
            pieces = self.channel.split(text)
            for index, piece in enumerate(pieces):
                ids = await stream.deliver(index, piece) if stream is not None else None
                if ids is None:
                    await self.channel.send(target, piece)
            if stream is not None:
                await stream.end(len(pieces))


def answer_text(name: str, stream: bool) -> str:
    return name + FILLER if stream else name


async def quiet_chat(
    args: argparse.Namespace, answer: Answerer, at: float, started: float
) -> tuple[float | None, float]:
    """The quiet chat's one message `at` seconds after `started`: (first draft, answer) in
    seconds from its start (no draft: None)."""
    await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
    begun = time.perf_counter()
    answer.first_text.pop(QUIET, None)
    try:
        await answer({"chat_id": QUIET}, answer_text("quiet answer", args.stream))
    except DeliveryError:
        return answer.first_text.get(QUIET), float("nan")  # lost (only without pacing)
    return answer.first_text.get(QUIET), time.perf_counter() - begun


async def measure(
    args: argparse.Namespace,
    tg: FakeTelegram,
    limits: Any,
    channel: TelegramChannel,
    scale: float,
    answer: Answerer,
) -> None:
    privates = [1000 + n for n in range(args.chats)]
    groups = [-1000 - n for n in range(1, args.groups + 1)]
    lost = 0
    private_done: list[float] = []
    group_done = 0.0
    idle_quiet = (None, 0.0)
    if args.stream:  # on an idle bot first; then the chat's windows clear
        idle_quiet = await quiet_chat(args, answer, 0.0, time.perf_counter())
        await asyncio.sleep(2 / scale)
    before = limits.accepted + limits.rejected, limits.rejected, len(tg.drafts), len(tg.sent)
    typing_before = len(tg.calls_of("sendChatAction"))
    started = time.perf_counter()

    async def private(chat: int) -> None:
        nonlocal lost
        for n in range(args.messages):
            try:
                await answer({"chat_id": chat}, answer_text(f"answer {n}", args.stream))
            except DeliveryError:
                lost += 1
        private_done.append(time.perf_counter() - started)

    async def group_topic(chat: int, topic: int, count: int) -> None:
        nonlocal lost, group_done
        for n in range(count):
            text = answer_text(f"group {topic} {n}", args.stream)
            try:
                await answer({"chat_id": chat, "thread_id": topic}, text)
            except DeliveryError:
                lost += 1
        group_done = max(group_done, time.perf_counter() - started)

    topics = 10  # the group's backlog comes from ten forum topics at once
    per_topic = max(1, args.group_messages // topics) if groups else 0
    private_floor = args.chats * args.messages / 30 / scale
    loaded = asyncio.gather(
        *(group_topic(g, 100 + t, per_topic) for g in groups for t in range(topics)),
        *(private(c) for c in privates),
    )
    busy_quiet = asyncio.ensure_future(quiet_chat(args, answer, private_floor / 2, started))
    await loaded
    wall = time.perf_counter() - started
    load_quiet = await busy_quiet

    sends = args.chats * args.messages + len(groups) * topics * per_topic
    delivered = len(tg.sent) - before[3] - 1  # not the quiet chat's answer mid-load

    def shows(chat: int, thread: int | None, names: list[str]) -> bool:
        got = [m["text"] for m in tg.sent_to(chat, thread)]
        return len(got) == len(names) and all(
            t.startswith(n) for t, n in zip(got, names, strict=True)
        )

    in_order = all(
        shows(c, None, [f"answer {n}" for n in range(args.messages)]) for c in privates
    ) and all(
        shows(g, 100 + t, [f"group {100 + t} {n}" for n in range(per_topic)])
        for g in groups
        for t in range(topics)
    )
    bound = (-(-sends // 30) - 1) / scale  # 30 in any window: the first 30 at once
    requests = limits.accepted + limits.rejected - before[0]
    rejected = limits.rejected - before[1]
    print(f"pacing:              {'off' if args.no_pacing else 'on'} (limits {scale:g}x faster)")
    print(f"streaming:           {'on' if args.stream else 'off'}")
    print(
        f"messages:            {sends} ({args.chats} chats x {args.messages}, {len(groups)} groups x {topics * per_topic})"
    )
    print(f"delivered:           {delivered}  lost: {lost}  once and in order: {in_order}")
    print(f"wall time:           {wall:.2f} s  (the overall limit alone allows >= {bound:.2f} s)")
    print(f"sends/s:             {delivered / wall:.1f}  (limit {30:g} in any {1 / scale:g} s)")
    by_method = ", ".join(f"{m} {n}" for m, n in sorted(limits.rejected_by_method.items()))
    print(
        f"429s:                {rejected} of {requests} requests ({100 * rejected / max(requests, 1):.2f} %)"
        + (f"  (by method: {by_method})" if by_method else "")
    )
    print(f"came back too early: {limits.ignored_retry_after}")
    print(
        f"private chats done:  p50 {pct(private_done, 50):.2f} s  p95 {pct(private_done, 95):.2f} s"
        f"  max {max(private_done, default=float('nan')):.2f} s"
    )  # fmt: skip
    print(f"groups done:         {group_done:.2f} s (20 a minute each, sliding window)")
    if private_done:
        done = max(private_done)
        print(
            f"private vs floor:    {done:.2f} s / {private_floor:.2f} s"
            f" = {done / private_floor:.3f} x  (floor: {args.chats * args.messages} answers at 30/s)"
        )  # fmt: skip
    if args.stream:
        drafts = len(tg.drafts) - before[2]
        typing = len(tg.calls_of("sendChatAction")) - typing_before
        pacer = channel._outbox.pacer
        print(
            f"drafts:              {drafts} sent, {pacer.dropped} dropped (their answer was ready)"
        )
        print(f"typing:              {typing} sent (only when no answer waits for the budget)")
        for label, (draft, done_in) in (("idle bot", idle_quiet), ("mid-load", load_quiet)):
            shown = (
                f"{draft * scale:.3f} s" if draft is not None else "none (the answer came first)"
            )
            print(
                f"quiet chat, {label + ':':10}first draft {shown}, answer {done_in * scale:.2f} s"
                f"  (unscaled seconds)"
            )  # fmt: skip
    else:
        print(f"quiet chat, mid-load: answer {load_quiet[1] * scale:.2f} s  (unscaled seconds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=300)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--group-messages", type=int, default=30)
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--no-pacing", action="store_true")
    parser.add_argument("--stream", action="store_true", help="stream every answer")
    parser.add_argument("--model-ms", type=float, default=200.0, help="model time per answer")
    parser.add_argument("--chunks", type=int, default=10, help="model chunks per answer")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
