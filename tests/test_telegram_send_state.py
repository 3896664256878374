"""The Telegram channel says when a piece's request leaves (`channels.base.watch_send`): a send
cancelled while it waits for its turn (here: after a 429, which posted nothing) is safe to
send again; one whose request reached Telegram is not. Real aiogram against the fake Bot API."""

from __future__ import annotations

import asyncio

from channels.base import watch_send
from tests.fakes.telegram_api import FakeTelegram
from tests.runtime_channel import until
from tests.test_telegram import USER, start, tg

__all__ = ["start", "tg"]  # fixtures


async def test_a_send_cancelled_in_the_queue_after_a_429_has_not_left(
    start, tg: FakeTelegram
) -> None:
    h = await start()
    tg.fail_next("sendMessage", retry_after=30)  # refused: Telegram posted nothing
    with watch_send() as sending:
        task = asyncio.create_task(h.channel.send({"chat_id": USER}, "hello"))
        await until(lambda: h.channel._outbox.pacer.waiting == 1, timeout=10)  # waits its turn
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(tg.calls_of("sendMessage")) == 1
    assert not sending.left
    assert tg.sent_to(USER) == []


async def test_a_send_that_reached_telegram_has_left(start, tg: FakeTelegram) -> None:
    h = await start()
    with watch_send() as sending:
        await h.channel.send({"chat_id": USER}, "hello")
    assert sending.left
    assert [m["text"] for m in tg.sent_to(USER)] == ["hello"]
