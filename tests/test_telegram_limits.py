"""Telegram's send limits: the channel (real aiogram, real runtime, SQLite) against a fake Bot
API that enforces them with 429 + retry_after.

Time runs ten times faster than on Telegram: the fake allows 30 messages per 0.1 s overall,
one per 0.1 s in a chat and 20 per 6 s in a group, and the bot is configured with the same
limits (`BUB_TELEGRAM_RATE_*`). `retry_after` stays whole seconds, as Telegram sends it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from bub_bot.config import Settings
from bub_bot.server import Bot, BotServer
from channels.pacing import FLOOD_KEYS
from channels.telegram import TelegramChannel
from channels.telegram_outbox import MAX_RETRY_AFTER
from tests.fakes.openai_server import FakeOpenAI, Reply, echo_default, text
from tests.fakes.telegram_api import FakeTelegram, FloodControl
from tests.runtime_channel import until
from tests.test_telegram import BOT, TOKEN, tg

__all__ = ["tg"]  # the fixture

SCALE = 10
SCALED = {  # what the fake enforces at SCALE, as the bot's settings
    "telegram_rate_global": "30/0.1s",
    "telegram_rate_chat": "1/0.1s",
    "telegram_rate_group": "20/6s",
}
LONG = "long"
PIECES = 3
_LONG_RE = re.compile(rf"{LONG}(\d?) (\S+)$")


def long_answer(label: str, pieces: int = PIECES) -> str:
    """An answer Telegram needs `pieces` messages for (paragraphs of 3 000 characters)."""
    return "\n\n".join(f"{label} part {n}: " + "x" * 3000 for n in range(pieces))


def answer(body: dict[str, Any]) -> Reply:
    """The model: echo, or for "long[N] <label>" a long answer of N (default 3) pieces."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    content = str(users[-1].get("content")) if users else ""
    if match := _LONG_RE.search(content):
        return text(long_answer(match.group(2), int(match.group(1) or PIECES)))
    return echo_default(body)


wait_until = partial(until, timeout=30.0, interval=0.02)


@dataclass
class Harness:
    tg: FakeTelegram
    limits: FloodControl
    server: BotServer

    @property
    def bot(self) -> Bot:
        return self.server.bot

    def texts(self, chat_id: int, thread_id: int | None = None) -> list[str]:
        return [m["text"] for m in self.tg.sent_to(chat_id, thread_id)]


@pytest.fixture
async def start(
    tg: FakeTelegram, fake_openai: FakeOpenAI, settings: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    servers: list[BotServer] = []

    async def make(fake_limits: dict[str, Any] | None = None, **overrides: Any) -> Harness:
        limits = tg.enforce_limits(time_scale=SCALE, **(fake_limits or {}))
        fake_openai.default = answer
        values: dict[str, Any] = {
            "telegram_token": TOKEN,
            "telegram_api_base": tg.base_url,
            "telegram_allow_users": "*",
            "telegram_allow_chats": "*",
            "shutdown_grace_seconds": 3,
            **SCALED,
            **overrides,
        }
        conf = settings(**values)
        channel = TelegramChannel(conf, poll_timeout=5, retry_base=0.05)
        server = BotServer(await Bot.open(conf, [channel]), host="127.0.0.1", port=0)
        await server.start()
        servers.append(server)
        return Harness(tg, limits, server)

    yield make
    for server in servers:
        if server.ready:
            await server.stop()


def failed_replies(h: Harness) -> int:
    """How many reply pieces the runtime recorded as not delivered (metrics)."""
    registry = h.bot.metrics.registry
    value = registry.get_sample_value(
        "bub_replies_total", {"channel": "telegram", "outcome": "failed"}
    )
    return int(value or 0)


def on_sent(tg: FakeTelegram, react: Callable[[dict[str, Any]], None]) -> None:
    """Call `react(message)` after each message the fake accepted."""
    original = tg.methods["sendMessage"]

    async def send_message(params: dict[str, Any]) -> Any:
        message = await original(params)
        react(message)
        return message

    tg.methods["sendMessage"] = send_message


async def test_a_burst_of_conversations_is_answered_within_the_limits(
    start, tg: FakeTelegram
) -> None:
    """300 private chats x 3 messages and 3 busy forum groups (4 topics x 2 long answers):
    every answer arrives once and in order, with hardly any 429."""
    privates = [1000 + n for n in range(300)]
    groups = [-1001, -1002, -1003]
    topics = [11, 12, 13, 14]
    rounds = 3
    group_rounds = 2

    def ask(chat: int, n: int, topic: int | None = None) -> None:
        if topic is None:
            tg.push_update(tg.private_text(chat, f"message {n}"))
        else:
            words = f"@{BOT} {LONG} {chat}/{topic}/{n}"
            tg.push_update(tg.group_text(chat, 7, words, thread_id=topic, is_forum=True))

    def next_question(message: dict[str, Any]) -> None:
        # Like people: the next question once the answer is there.
        chat, topic = message["chat"]["id"], message.get("message_thread_id")
        answered = len(tg.sent_to(chat, topic))
        if topic is None and answered < rounds:
            ask(chat, answered + 1)
        elif topic is not None and answered % PIECES == 0 and answered // PIECES < group_rounds:
            ask(chat, answered // PIECES + 1, topic)

    h = await start()
    on_sent(tg, next_question)
    for group in groups:
        for topic in topics:
            ask(group, 1, topic)
    for chat in privates:
        ask(chat, 1)
    group_total = len(groups) * len(topics) * group_rounds * PIECES
    expected = len(privates) * rounds + group_total
    await wait_until(lambda: len(tg.sent) >= expected)
    await asyncio.sleep(0.3)  # nothing more comes

    assert len(tg.sent) == expected  # none lost, none twice
    for chat in privates:
        assert h.texts(chat) == [f"echo: message {n}" for n in range(1, rounds + 1)]
    for group in groups:
        for topic in topics:
            got = h.texts(group, topic)
            want = [long_answer(f"{group}/{topic}/{n}") for n in range(1, group_rounds + 1)]
            assert "\n\n".join(got) == "\n\n".join(want)  # every piece, in order
    sends = h.limits.accepted + h.limits.rejected
    assert h.limits.rejected <= sends / 100
    assert h.limits.ignored_retry_after == 0
    # The group limit was reached (24 messages per group): the pacing was really tested.
    assert group_total // len(groups) > 20


async def test_a_busy_group_does_not_hold_up_a_private_chat(start, tg: FakeTelegram) -> None:
    """A long answer in a group waits for the group's window; a private chat asking meanwhile
    is answered at once, between the group's pieces."""
    group, user = -1009, 77
    h = await start(telegram_rate_group="5/1s", fake_limits={"group": (5, 10.0)})  # 5 per 1 s
    pieces_per_group = 3 * PIECES
    for n in range(3):  # three topics: nine pieces for one group
        tg.push_update(
            tg.group_text(group, 7, f"@{BOT} {LONG} g{n}", thread_id=20 + n, is_forum=True)
        )
    await wait_until(lambda: len(tg.sent_to(group)) >= 1)
    tg.push_update(tg.private_text(user, "hello"))
    await wait_until(lambda: len(tg.sent_to(group)) >= pieces_per_group)
    order = [m["chat"]["id"] for m in tg.sent]
    # The private answer did not wait for the group's next window (its 6th piece).
    assert order.index(user) < [i for i, c in enumerate(order) if c == group][5]
    assert h.texts(user) == ["echo: hello"]
    assert h.limits.rejected == 0


async def test_a_429_pauses_the_chat_for_retry_after(start, tg: FakeTelegram) -> None:
    user = 42
    h = await start()
    tg.fail_next("sendMessage", retry_after=1)
    tg.push_update(tg.private_text(user, f"{LONG} one"))
    await wait_until(lambda: len(tg.sent_to(user)) >= PIECES)
    await asyncio.sleep(0.2)
    assert "\n\n".join(h.texts(user)) == long_answer("one")  # the refused piece once, in place
    assert len(tg.calls_of("sendMessage")) == PIECES + 1
    assert h.limits.ignored_retry_after == 0  # nothing came back before the second was over


async def test_a_very_long_retry_after_fails_the_answer_instead_of_waiting(
    start, tg: FakeTelegram
) -> None:
    """Telegram asking for more than MAX_RETRY_AFTER: the answer is recorded as failed, and
    later answers to that chat fail at once without a request, until the time has passed."""
    user = 43
    h = await start()
    tg.fail_next("sendMessage", retry_after=MAX_RETRY_AFTER + 100)
    for n, words in enumerate(["first", "second"], start=1):
        tg.push_update(tg.private_text(user, words))
        await wait_until(lambda n=n: failed_replies(h) == n)
    assert len(tg.calls_of("sendMessage")) == 1 and tg.sent_to(user) == []
    # Other chats are not held up.
    tg.push_update(tg.private_text(44, "hello"))
    await wait_until(lambda: h.texts(44) == ["echo: hello"])


async def test_429s_in_several_chats_pause_every_chat(start, tg: FakeTelegram) -> None:
    """When Telegram starts refusing the whole bot, the first few chats told to wait make
    the bot stop everywhere, so the other chats never get a 429 at all."""
    chats = [500 + n for n in range(10)]
    # One message at a time bot-wide, so the 429s arrive one after another.
    h = await start(telegram_rate_global="1/0.05s")
    tg.flood(1)
    for chat in chats:
        tg.push_update(tg.private_text(chat, "hi"))
    await wait_until(lambda: all(h.texts(c) == ["echo: hi"] for c in chats))
    assert h.limits.rejected == FLOOD_KEYS
    assert h.limits.ignored_retry_after == 0
    assert len(tg.sent) == len(chats)


async def test_the_fake_refuses_a_bot_that_ignores_the_limits(start, tg: FakeTelegram) -> None:
    """Without pacing (every limit `off`) the same fake answers 429s: the limits above are
    what keeps them away."""
    h = await start(telegram_rate_global="off", telegram_rate_chat="off", telegram_rate_group="off")
    tg.push_update(tg.private_text(42, f"{LONG}2 one"))
    await wait_until(lambda: len(tg.sent_to(42)) >= 2)
    assert h.limits.rejected == 1  # two pieces in a row are over one per 0.1 s
    assert h.limits.ignored_retry_after == 0  # a 429 still pauses the chat
    assert "\n\n".join(h.texts(42)) == long_answer("one", 2)
