"""Self-test of the fake Telegram Bot API, driven by a real aiogram Bot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    TelegramBadRequest,
    TelegramConflictError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.types import BotCommand, ReplyParameters

from tests.fakes.telegram_api import FakeTelegram

TOKEN = "123:ABC"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username="bub_test_bot") as fake:
        yield fake


@pytest.fixture
async def bot(tg: FakeTelegram) -> AsyncIterator[Bot]:
    session = AiohttpSession(api=TelegramAPIServer.from_base(tg.base_url))
    bot = Bot(TOKEN, session=session)
    yield bot
    await session.close()


async def test_get_me_and_wrong_token(tg: FakeTelegram, bot: Bot) -> None:
    me = await bot.get_me()
    assert (me.id, me.username, me.is_bot) == (tg.bot_id, "bub_test_bot", True)
    other = Bot("999:XYZ", session=AiohttpSession(api=TelegramAPIServer.from_base(tg.base_url)))
    with pytest.raises(TelegramUnauthorizedError):
        await other.get_me()
    await other.session.close()


async def test_long_poll_and_offset(tg: FakeTelegram, bot: Bot) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=5))
    await asyncio.sleep(0.05)
    assert not poll.done()
    pushed = tg.push_update(tg.private_text(42, "/start hi", username="ann"))
    updates = await asyncio.wait_for(poll, 2)
    assert [u.update_id for u in updates] == [pushed["update_id"]]
    msg = updates[0].message
    assert msg is not None and msg.text == "/start hi" and msg.chat.type == "private"
    assert msg.entities is not None and msg.entities[0].type == "bot_command"
    # Unconfirmed updates are redelivered; offset confirms them.
    assert len(await bot.get_updates(timeout=0)) == 1
    assert await bot.get_updates(offset=pushed["update_id"] + 1, timeout=0) == []
    assert tg.pending_updates == []
    tg.conflict_next_polls(1)
    with pytest.raises(TelegramConflictError):
        await bot.get_updates(timeout=0)


async def test_group_mention_and_reply_to_bot(tg: FakeTelegram, bot: Bot) -> None:
    sent = await bot.send_message(-100777, "hello", message_thread_id=5)
    assert sent.message_thread_id == 5 and tg.bot_message_ids[-100777] == [sent.message_id]
    text = "👋 @bub_test_bot ping"
    ents = tg.mention_entities(text)
    assert ents == [{"type": "mention", "offset": 3, "length": 13}]
    upd = tg.group_text(
        -100777,
        7,
        text,
        entities=ents,
        reply_to_message=sent.message_id,
        thread_id=5,
        is_forum=True,
    )
    assert upd["message"]["reply_to_message"]["from"]["id"] == tg.bot_id
    assert upd["message"]["is_topic_message"] is True
    reply = await bot.send_message(
        -100777, "pong", reply_parameters=ReplyParameters(message_id=upd["message"]["message_id"])
    )
    assert reply.reply_to_message is not None and reply.reply_to_message.text == text
    with pytest.raises(TelegramBadRequest, match="message to be replied not found"):
        await bot.send_message(-100777, "x", reply_parameters=ReplyParameters(message_id=999))
    with pytest.raises(TelegramBadRequest, match="message thread not found"):
        await bot.send_message(-100777, "x", message_thread_id=1)
    assert [m["text"] for m in tg.sent_to(-100777, thread_id=5)] == ["hello"]


async def test_send_message_html_validation(tg: FakeTelegram, bot: Bot) -> None:
    msg = await bot.send_message(
        42, "<b>hi</b> &lt;x&gt; <a href='https://e.x'>link</a>", parse_mode="HTML"
    )
    assert msg.text == "hi <x> link"
    assert [(e.type, e.offset, e.length) for e in msg.entities or []] == [
        ("bold", 0, 2),
        ("text_link", 7, 4),
    ]
    assert tg.calls_of("sendMessage")[-1]["chat_id"] == 42
    with pytest.raises(
        TelegramBadRequest, match='can\'t parse entities: Unsupported start tag "p"'
    ):
        await bot.send_message(42, "<p>hi</p>", parse_mode="HTML")
    with pytest.raises(TelegramBadRequest, match="can't parse entities"):
        await bot.send_message(42, "<b><i>x</b></i>", parse_mode="HTML")
    edited = await bot.edit_message_text("new", chat_id=42, message_id=msg.message_id)
    assert not isinstance(edited, bool) and edited.text == "new"
    with pytest.raises(TelegramBadRequest, match="message is not modified"):
        await bot.edit_message_text("new", chat_id=42, message_id=msg.message_id)
    assert len(tg.sent) == 1


async def test_utf16_length(tg: FakeTelegram, bot: Bot) -> None:
    with pytest.raises(TelegramBadRequest, match="message is too long"):
        await bot.send_message(42, "😀" * 2100)
    await bot.send_message(42, "😀" * 2048)
    await bot.send_message(42, "<b>" + "a" * 4096 + "</b>", parse_mode="HTML")
    assert len(tg.sent) == 2


async def test_fault_injection(tg: FakeTelegram, bot: Bot) -> None:
    tg.fail_next("sendMessage", retry_after=2)
    with pytest.raises(TelegramRetryAfter) as exc:
        await bot.send_message(42, "hi")
    assert exc.value.retry_after == 2
    tg.drop_next("sendMessage", after_processing=True)
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(42, "ambiguous")
    tg.drop_next("sendMessage", after_processing=False)
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(42, "lost")
    await bot.send_message(42, "ok")
    assert [m["text"] for m in tg.sent_to(42)] == ["ambiguous", "ok"]
    assert len(tg.calls_of("sendMessage")) == 4


async def test_commands_webhook_and_files(tg: FakeTelegram, bot: Bot) -> None:
    await bot.set_my_commands([BotCommand(command="help", description="Help")])
    assert [c.command for c in await bot.get_my_commands()] == ["help"]
    tg.push_update(tg.private_text(1, "queued"))
    await bot.set_webhook("https://example.test/hook", secret_token="s3", drop_pending_updates=True)
    assert tg.webhook["secret_token"] == "s3" and tg.webhook["drop_pending_updates"] is True
    info = await bot.get_webhook_info()
    assert info.url == "https://example.test/hook" and info.pending_update_count == 0
    await bot.delete_webhook()
    tg.add_file("F1", b"\x89PNG-bytes", file_path="photos/file_1.png")
    f = await bot.get_file("F1")
    assert (f.file_path, f.file_size) == ("photos/file_1.png", 10)
    data = await bot.download_file("photos/file_1.png")
    assert data is not None and data.read() == b"\x89PNG-bytes"
    photo = tg.photo_message(42, 42, "F1", caption="look")["message"]
    assert photo["photo"][-1]["file_id"] == "F1"
