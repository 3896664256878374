"""Telegram streaming under the send limits: answers first, drafts only from spare budget.

The real channel (aiogram) against the fake Bot API enforcing the same limits as the bot is
configured with. To decide what is queued when, a test holds the bot-wide budget itself (a
turn of the channel's pacer, as any request takes one) and lets it go when everything is
queued; checks are on the order and number of calls the fake saw, never on times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.agent import Progress
from bub_bot.config import Settings
from bub_bot.runtime.streaming import TurnStream
from bub_bot.tape import Tape
from channels.base import Received
from channels.telegram import TelegramChannel
from channels.telegram_stream import TelegramStream
from tests.fakes.telegram_api import FakeTelegram
from tests.test_telegram import TOKEN, tg

__all__ = ["tg"]  # the fixture

LIMITED = ("sendMessage", "sendMessageDraft", "editMessageText")


class SendOnly:
    """The channel only sends in these tests; nothing comes in."""

    async def receive(self, inbound: Any) -> Received:
        return Received(new=False)

    async def session_known(self, session_id: str) -> bool:
        return False

    async def move_session(self, old: str, new: str) -> None:
        return None

    def note_inbound(self, channel: str, outcome: str) -> None:
        return None


@pytest.fixture
async def channel(
    tg: FakeTelegram, settings: Callable[..., Settings]
) -> AsyncIterator[TelegramChannel]:
    """One request at a time bot-wide (every 20 ms), the fake enforcing the same."""
    tg.enforce_limits(overall=(1, 0.02), chat=(1, 0.02), group=(20, 1.0))
    conf = settings(
        telegram_token=TOKEN,
        telegram_api_base=tg.base_url,
        telegram_rate_global="1/0.02s",
        telegram_rate_chat="1/0.02s",
        telegram_rate_group="20/1s",
    )
    made = TelegramChannel(conf, poll_timeout=1)
    await made.start(SendOnly())  # type: ignore[arg-type]
    yield made
    await made.stop()


def stream_to(channel: TelegramChannel, chat: int) -> TelegramStream:
    stream = channel.stream({"chat_id": chat, "chat_type": "private"}, [])
    assert stream is not None
    return stream


def limited_calls(tg: FakeTelegram) -> list[tuple[str, int]]:
    return [(m, int(p["chat_id"])) for m, p in tg.calls if m in LIMITED]


async def queued() -> None:
    """Let every task started so far reach the pacer's queue."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_an_answer_goes_before_the_drafts_queued_ahead_of_it(
    channel: TelegramChannel, tg: FakeTelegram
) -> None:
    pacer = channel._outbox.pacer
    streams = [stream_to(channel, 10 + n) for n in range(5)]
    async with pacer.turn("someone else"):  # the budget is taken while everything queues
        drafts = [asyncio.create_task(s.update(f"draft {n} so far")) for n, s in enumerate(streams)]
        await queued()
        answer = asyncio.create_task(channel.send({"chat_id": 99}, "the answer"))
        await queued()
        assert pacer.waiting == 6
    await answer
    for stream in streams:
        stream.final_ready()
    await asyncio.gather(*drafts)
    calls = limited_calls(tg)
    assert calls[0] == ("sendMessage", 99)
    assert all(method == "sendMessageDraft" for method, _ in calls[1:])
    assert tg.limits is not None and tg.limits.rejected == 0


async def test_a_draft_not_sent_when_its_answer_is_ready_is_dropped(
    channel: TelegramChannel, tg: FakeTelegram
) -> None:
    pacer = channel._outbox.pacer
    stream = stream_to(channel, 7)
    async with pacer.turn("someone else"):
        draft = asyncio.create_task(stream.update("half of the ans"))
        await queued()
        stream.final_ready()  # what the runtime does once the answer is complete
        assert await draft is False  # nothing was shown
    assert await stream.deliver(0, "half of the answer") is None  # no message holds it
    await channel.send({"chat_id": 7}, "half of the answer")
    assert await stream.end(1) == []
    assert tg.drafts == [] and [m["text"] for m in tg.sent_to(7)] == ["half of the answer"]
    assert pacer.dropped == 1
    assert await stream.update("more") is True and tg.drafts == []  # the stream is over


async def test_the_runtime_settles_at_once_when_its_draft_still_waits_for_the_budget(
    channel: TelegramChannel, tg: FakeTelegram, tape: Tape, settings: Callable[..., Settings]
) -> None:
    """The runtime's TurnStream: the answer is complete while the stream's draft waits for
    the bot-wide budget; settling (what comes before the answer is sent) drops the draft and
    does not wait for the budget, so the answer is the next thing that goes."""
    pacer = channel._outbox.pacer
    shown = TurnStream(
        stream_to(channel, 8),
        tape=tape,
        turn_id="t1",
        channel="telegram",
        settings=settings(stream=True),
        emit=lambda *a, **k: None,
    )
    async with pacer.turn("someone else"):  # held until the answer is on its way
        async with shown:
            shown.progress(Progress("text", text="The answer so"))
            await queued()
            assert pacer.waiting == 1  # the draft, queued
            await asyncio.wait_for(shown.settle(), 10)  # what the runtime does first
        assert pacer.waiting == 0 and pacer.dropped == 1  # settled, budget still held
        answer = asyncio.create_task(channel.send({"chat_id": 8}, "The answer so far."))
        await queued()
    await answer
    assert tg.drafts == [] and [m["text"] for m in tg.sent_to(8)] == ["The answer so far."]
    assert shown.first_visible is None  # no partial text was ever shown


async def test_under_a_backlog_of_answers_drafts_wait_and_thin_out(
    channel: TelegramChannel, tg: FakeTelegram
) -> None:
    """Thirty answers queued at once and a stream updating all the time (as the runtime does:
    one update after the other): no draft goes while answers wait, the answers go back to
    back, and the stream catches up with fewer, larger steps once they are out."""
    pacer = channel._outbox.pacer
    stream = stream_to(channel, 5)
    words = [f"word{n}" for n in range(400)]
    latest = ""

    async def model() -> None:
        nonlocal latest
        for n in range(1, len(words) + 1):
            latest = " ".join(words[:n])
            await asyncio.sleep(0.001)

    async def pump(writing: asyncio.Task[None]) -> None:
        while not (writing.done() and tg.drafts and tg.drafts[-1]["text"] == latest):
            await stream.update(latest)
            await asyncio.sleep(0)

    async with pacer.turn("someone else"):
        answers = [
            asyncio.create_task(channel.send({"chat_id": 100 + n}, f"answer {n}"))
            for n in range(30)
        ]
        writing = asyncio.create_task(model())
        await asyncio.sleep(0.002)  # some text is there to show
        pumping = asyncio.create_task(pump(writing))
        await queued()
    await asyncio.gather(*answers)
    await asyncio.wait_for(pumping, 30)
    stream.final_ready()
    methods = [m for m, _ in limited_calls(tg)]
    first, last = methods.index("sendMessage"), len(methods) - methods[::-1].index("sendMessage")
    assert methods[first:last] == ["sendMessage"] * 30  # back to back, no draft between
    drafts = [d["text"] for d in tg.drafts]
    assert 2 <= len(drafts) < len(words) / 4  # far fewer steps than the model wrote words
    assert drafts == sorted(drafts, key=len)  # still growing, in larger steps
    assert tg.limits is not None and tg.limits.rejected == 0


async def test_typing_goes_only_when_no_answer_needs_the_budget(
    channel: TelegramChannel, tg: FakeTelegram
) -> None:
    pacer = channel._outbox.pacer
    async with pacer.turn("someone else"):  # the whole budget is in use
        async with channel.working({"chat_id": 3}):
            await queued()
        assert tg.calls_of("sendChatAction") == []
    await asyncio.sleep(0.05)  # the held turn leaves the window
    async with channel.working({"chat_id": 3}):
        await queued()
        await tg_calls(tg, "sendChatAction", 1)
    assert len(tg.calls_of("sendChatAction")) == 1


async def tg_calls(tg: FakeTelegram, method: str, count: int) -> None:
    """Wait (at most 10 s) until the fake saw `count` calls of `method`."""
    for _ in range(1000):
        if len(tg.calls_of(method)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{method} was called {len(tg.calls_of(method))} times")
