"""The Telegram channel in-process: BotServer + the real aiogram Bot against FakeTelegram,
FakeOpenAI as the model, real SQLite."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp
import pytest

from bub_bot.config import Settings
from bub_bot.server import Bot, BotServer
from channels.telegram import TelegramChannel
from channels.telegram_format import utf16_len
from tests.channel_harness import StoredTapes
from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.fakes.telegram_api import FakeTelegram
from tests.runtime_channel import inbound_users, until

TOKEN = "123:ABC"
BOT = "bub_test_bot"
USER = 42
GROUP = -100555
SECRET = "s3cret_token-1"


wait_until = partial(until, timeout=8.0, interval=0.02)


@dataclass
class Harness(StoredTapes):
    tg: FakeTelegram
    model: FakeOpenAI
    server: BotServer
    channel: TelegramChannel

    @property
    def bot(self) -> Bot:
        return self.server.bot

    async def idle(self, session_id: str) -> None:
        """Pushed updates are stored and the session has finished its work."""
        if not self.tg.webhook.get("url"):
            await self.handled()
        await self.bot.runtime.wait_idle(session_id, timeout=10)

    async def handled(self) -> None:
        """Every pushed update has been stored (polling: the offset moved past it)."""
        await wait_until(lambda: not self.tg.pending_updates)

    async def replies(self, chat_id: int, count: int, thread_id: int | None = None) -> list:
        await wait_until(lambda: len(self.tg.sent_to(chat_id, thread_id)) >= count)
        return self.tg.sent_to(chat_id, thread_id)


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as fake:
        yield fake


@pytest.fixture
async def start(
    tg: FakeTelegram, fake_openai: FakeOpenAI, settings: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    servers: list[BotServer] = []

    async def make(**overrides: Any) -> Harness:
        values: dict[str, Any] = {
            "telegram_token": TOKEN,
            "telegram_api_base": tg.base_url,
            "telegram_allow_users": "*",
            "shutdown_grace_seconds": 3,
            # Telegram's limits twenty times faster (1/s per chat would make a long answer
            # take seconds); the limits themselves are tested in test_telegram_limits.py.
            "telegram_rate_chat": "1/0.05s",
            "telegram_rate_group": "20/3s",
        }
        values.update(overrides)
        conf = settings(**values)
        channel = TelegramChannel(conf, poll_timeout=5, retry_base=0.05, typing_interval=0.2)
        bot = await Bot.open(conf, [channel])
        server = BotServer(bot, host="127.0.0.1", port=0)
        await server.start()
        servers.append(server)
        return Harness(tg, fake_openai, server, channel)

    yield make
    for server in servers:
        if server.ready:
            await server.stop()


# -- private chats ----------------------------------------------------------------------------
async def test_private_round_trip(start, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    h = await start()
    assert [c["command"] for c in next(iter(tg.commands.values()))] == [
        "handoff", "reset", "status", "anchors", "tools", "skills", "schedules", "unschedule",
        "usage", "stop", "help"
    ]  # fmt: skip
    assert tg.calls_of("deleteWebhook")[-1].get("drop_pending_updates") in (None, False)
    fake_openai.script(slow(text("Hello **Ann**, see `x < y`"), 0.5))
    update = tg.push_update(tg.private_text(USER, "hi there", username="ann"))
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "Hello Ann, see x < y"
    assert [e["type"] for e in reply["entities"]] == ["bold", "code"]
    assert reply["reply_to_message"]["message_id"] == update["message"]["message_id"]
    assert tg.calls_of("sendChatAction")[0]["action"] == "typing"
    assert fake_openai.last_messages()[-1] == {"role": "user", "content": "hi there"}
    await h.idle(f"telegram:{USER}")
    assert await h.user_messages(f"telegram:{USER}") == ["hi there"]
    [stored] = await inbound_users(h.tape(f"telegram:{USER}"))
    assert stored.meta["sent_at"] == update["message"]["date"]  # Telegram's message time


async def test_same_update_twice_is_answered_once(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    update = tg.private_text(USER, "only once")
    tg.push_update(update)
    await h.replies(USER, 1)
    tg.push_update(update)  # Telegram re-delivers the same message (a new update_id)
    await h.handled()
    await h.idle(f"telegram:{USER}")
    await asyncio.sleep(0.2)
    assert len(tg.sent_to(USER)) == 1
    assert len(fake_openai.completion_requests()) == 1
    assert await h.user_messages(f"telegram:{USER}") == ["only once"]


async def test_unauthorised_private_user_gets_the_id_hint_once(start, tg: FakeTelegram) -> None:
    h = await start(telegram_allow_users="7,@friend")
    tg.push_update(tg.private_text(USER, "let me in"))
    tg.push_update(tg.private_text(USER, "please"))
    await h.handled()
    [hint] = tg.sent_to(USER)
    assert str(USER) in hint["text"] and "BUB_TELEGRAM_ALLOW_USERS" in hint["text"]
    assert not await h.bot.runtime.session_known(f"telegram:{USER}")
    # An allowed username gets through.
    tg.push_update(tg.private_text(99, "hello", username="Friend"))
    [reply] = await h.replies(99, 1)
    assert reply["text"] == "echo: hello"
    assert len(tg.sent_to(USER)) == 1


async def test_reply_to_a_message_carries_the_quote(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.push_update(tg.private_text(USER, "first"))
    [answer] = await h.replies(USER, 1)
    tg.push_update(tg.private_text(USER, "why?", reply_to=answer["message_id"]))
    await h.replies(USER, 2)
    content = fake_openai.last_messages()[-1]["content"]
    assert content == "[In reply to you: echo: first]\nwhy?"


async def test_photo_reaches_the_model_as_an_image(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(telegram_max_image_bytes=1000)
    big, small = b"B" * 5000, b"\xff\xd8\xff\xe0small-jpeg"
    tg.add_file("P1", big, "photos/p1.jpg")
    tg.add_file("P1-0", small, "photos/p1-small.jpg")
    tg.push_update(
        tg.photo_message(USER, USER, "P1", sizes=[(90, 90, len(small)), (800, 800, len(big))], caption="what is it?")
    )  # fmt: skip
    await h.replies(USER, 1)
    # The caption, then the photo (fetched in the turn, saved in inbox/), the largest size
    # within BUB_TELEGRAM_MAX_IMAGE_BYTES.
    caption, photo = fake_openai.last_messages()[-2:]
    assert caption["content"] == "what is it?"
    url = photo["content"][1]["image_url"]["url"]
    assert url == "data:image/jpeg;base64," + base64.b64encode(small).decode()
    # Only a size over the cap: the model is told a photo came, not shown it.
    tg.add_file("P2", big, "photos/p2.jpg")
    tg.push_update(tg.photo_message(USER, USER, "P2", sizes=[(800, 800, len(big))]))
    await h.replies(USER, 2)
    assert fake_openai.last_messages()[-1]["content"] == "[photo, too large to show: 5 KB]"
    # A sticker: a placeholder the model can read (files: test_files_telegram.py).
    sticker = tg.message_update(
        {"chat": {"id": USER, "type": "private", "first_name": "Ann"},
         "from": {"id": USER, "is_bot": False, "first_name": "Ann"},
         "sticker": {"file_id": "S", "file_unique_id": "s", "type": "regular", "width": 1,
                     "height": 1, "is_animated": False, "is_video": False, "emoji": "🙂"}}
    )  # fmt: skip
    tg.push_update(sticker)
    await h.replies(USER, 3)
    assert fake_openai.last_messages()[-1]["content"] == "[sticker: 🙂]"


async def test_edited_messages_and_service_messages_are_ignored(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    edited = tg.private_text(USER, "edited")["message"] | {"edit_date": 1}
    tg.push_update({"edited_message": edited})
    tg.push_update(tg.message_update(
        {"chat": {"id": GROUP, "type": "supergroup", "title": "G"},
         "from": {"id": USER, "is_bot": False, "first_name": "Ann"},
         "new_chat_members": [{"id": tg.bot_id, "is_bot": True, "first_name": "Bub"}]}
    ))  # fmt: skip
    await h.handled()
    assert fake_openai.completion_requests() == []
    assert await h.bot.store.list_tapes() == []


# -- groups and topics ------------------------------------------------------------------------
async def test_group_without_mention_is_ignored_and_not_stored(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.push_update(tg.group_text(GROUP, USER, "just chatting"))
    tg.push_update(tg.group_text(GROUP, USER, "/status@other_bot"))
    tg.push_update(tg.group_text(GROUP, USER, f"hey @{BOT} what's up"))
    [reply] = await h.replies(GROUP, 1)
    assert reply["text"] == f"echo: hey @{BOT} what's up"
    await h.idle(f"telegram:{GROUP}")
    assert await h.user_messages(f"telegram:{GROUP}") == [f"hey @{BOT} what's up"]
    assert len(fake_openai.completion_requests()) == 1


async def test_group_reply_to_bot_and_text_mention_are_answered(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} one"))
    [first] = await h.replies(GROUP, 1)
    tg.push_update(tg.group_text(GROUP, USER, "two", reply_to_message=first["message_id"]))
    await h.replies(GROUP, 2)
    ent = {"type": "text_mention", "offset": 0, "length": 3,
           "user": {"id": tg.bot_id, "is_bot": True, "first_name": "Bub"}}  # fmt: skip
    tg.push_update(tg.group_text(GROUP, USER, "Bub three", entities=[ent]))
    replies = await h.replies(GROUP, 3)
    assert [r["text"] for r in replies][1:] == [
        "echo: [In reply to you: echo: @bub_test_bot one]\ntwo",
        "echo: Bub three",
    ]


async def test_unauthorised_group_sender_is_ignored_silently(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(telegram_allow_users="7", telegram_allow_chats=str(GROUP - 1))
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} hello"))
    tg.push_update(tg.group_text(GROUP - 1, USER, f"@{BOT} allowed chat"))
    [reply] = await h.replies(GROUP - 1, 1)
    assert reply["text"] == f"echo: @{BOT} allowed chat"
    await h.handled()
    assert tg.sent_to(GROUP) == []
    assert not await h.bot.runtime.session_known(f"telegram:{GROUP}")
    # The metrics tell "not for us" apart from "not allowed".
    tg.push_update(tg.group_text(GROUP - 1, USER, "chatter not addressed to the bot"))
    await h.handled()
    async with aiohttp.ClientSession() as http:
        async with http.get(h.server.url + "/metrics") as resp:
            text = await resp.text()
    assert 'bub_inbound_messages_total{channel="telegram",outcome="denied"} 1.0' in text
    assert 'bub_inbound_messages_total{channel="telegram",outcome="ignored"} 1.0' in text
    assert 'bub_inbound_messages_total{channel="telegram",outcome="new"} 1.0' in text


async def test_forum_topic_has_its_own_session_and_is_answered_in_the_topic(
    start, tg: FakeTelegram
) -> None:
    h = await start()
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} in topic", thread_id=7, is_forum=True))
    [in_topic] = await h.replies(GROUP, 1, thread_id=7)
    assert in_topic["text"] == f"echo: @{BOT} in topic"
    # The General topic (id 1): same chat session, sent without message_thread_id.
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} general", thread_id=1, is_forum=True))
    await h.replies(GROUP, 2)
    general = tg.sent_to(GROUP)[-1]
    assert general["text"] == f"echo: @{BOT} general" and "message_thread_id" not in general
    await h.idle(f"telegram:{GROUP}:7")
    await h.idle(f"telegram:{GROUP}")
    assert await h.user_messages(f"telegram:{GROUP}:7") == [f"@{BOT} in topic"]
    assert await h.user_messages(f"telegram:{GROUP}") == [f"@{BOT} general"]


async def test_chat_commands_in_a_group(start, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    h = await start()
    session = f"telegram:{GROUP}"
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} remember the number 7"))
    await h.replies(GROUP, 1)
    tg.push_update(tg.group_text(GROUP, USER, "/status"))
    status = (await h.replies(GROUP, 2))[-1]["text"]
    assert status.startswith("Entries:") and "Last anchor: session/start" in status
    tg.push_update(tg.group_text(GROUP, USER, f"/handoff@{BOT} name=phase-2 we chose 7"))
    handoff = (await h.replies(GROUP, 3))[-1]["text"]
    assert handoff.startswith("Handed off (phase-2)") and "we chose 7" in handoff
    tg.push_update(tg.group_text(GROUP, USER, "/help"))
    help_text = (await h.replies(GROUP, 4))[-1]["text"]
    assert "/handoff" in help_text and "/reset" in help_text
    fake_openai.script(text("- the number is 7"))
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} /handoff"))
    summary = (await h.replies(GROUP, 5))[-1]["text"]
    assert "• the number is 7" in summary  # the model's summary, Markdown rendered
    tg.push_update(tg.group_text(GROUP, USER, "/reset"))
    reset = (await h.replies(GROUP, 6))[-1]["text"]
    assert reset.startswith("Started a fresh conversation") and "__" in reset
    await h.idle(session)
    anchors = [e.payload["name"] for e in await h.entries(session) if e.kind == "anchor"]
    assert anchors == ["session/start"]
    assert len(fake_openai.completion_requests()) == 2  # one turn + one summary
    info = await h.tape(session).info()
    assert info.entries >= 1


# -- replies ----------------------------------------------------------------------------------
def long_reply() -> str:
    prose = " ".join(f"Point {i}: **bold** words and emoji 🎉🚀." for i in range(100))
    code = "\n".join(f"    total += values[{i}]  # 🐍 <{i}>" for i in range(120))
    outro = prose.replace("Point", "Finally")
    answer = f"{prose}\n\n```python\ndef total(values):\n{code}\n```\n\n{outro}"
    assert len(answer) >= 9000
    return answer


async def test_long_reply_is_split_into_valid_messages(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    answer = long_reply()
    fake_openai.script(text(answer))
    tg.push_update(tg.private_text(USER, "tell me everything"))
    await h.idle(f"telegram:{USER}")
    sent = tg.sent_to(USER)
    assert len(sent) >= 3
    for message in sent:
        assert utf16_len(message["text"]) <= 4096  # the fake enforces it after parsing
        assert tg.calls_of("sendMessage")[0]["parse_mode"] == "HTML"
    shown = "".join(m["text"] for m in sent).replace("\n", "").replace(" ", "")
    assert shown.count("🎉🚀") == 200 and shown.count("total+=values[") == 120
    code_pieces = [m for m in sent if "values[" in m["text"]]
    assert all(any(e["type"] == "pre" for e in m["entities"]) for m in code_pieces)
    sent_events = [
        e for e in await h.entries(f"telegram:{USER}")
        if e.kind == "event" and e.payload["name"] == "reply.sent"
    ]  # fmt: skip
    assert [e.payload["data"]["chunk"] for e in sent_events] == list(range(len(sent)))


async def test_parse_error_falls_back_to_the_original_markdown(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.script(text("Some **bold** & <stuff>"))
    tg.fail_next("sendMessage", description="Bad Request: can't parse entities: boom")
    tg.push_update(tg.private_text(USER, "hi"))
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "Some **bold** & <stuff>"
    first, second = tg.calls_of("sendMessage")
    assert first["parse_mode"] == "HTML" and "parse_mode" not in second


async def test_429_resends_only_the_failed_chunk(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    original = tg.methods["sendMessage"]

    async def rate_limit_second(params: dict[str, Any]) -> Any:
        result = await original(params)
        if len(tg.sent) == 1:
            tg.fail_next("sendMessage", retry_after=1)
        return result

    tg.methods["sendMessage"] = rate_limit_second
    fake_openai.script(text(long_reply()))
    tg.push_update(tg.private_text(USER, "long please"))
    await h.idle(f"telegram:{USER}")
    sent = tg.sent_to(USER)
    texts = [m["text"] for m in sent]
    assert len(texts) == len(set(texts)) == len(h.channel.split(long_reply())) >= 3
    assert len(tg.calls_of("sendMessage")) == len(sent) + 1
    assert tg.calls_of("sendMessage")[1]["text"] == tg.calls_of("sendMessage")[2]["text"]


async def test_ambiguous_network_error_is_not_resent(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.drop_next("sendMessage", after_processing=True)
    tg.push_update(tg.private_text(USER, "hello"))
    await wait_until(lambda: len(tg.calls_of("sendMessage")) == 1)
    await h.idle(f"telegram:{USER}")
    await asyncio.sleep(0.3)
    assert len(tg.calls_of("sendMessage")) == 1 and len(tg.sent_to(USER)) == 1
    events = [e.payload["name"] for e in await h.entries(f"telegram:{USER}") if e.kind == "event"]
    assert "reply.unknown" in events and "reply.sent" not in events
    for entry in await h.entries(f"telegram:{USER}"):
        assert "ABC" not in str(entry.payload)  # the token never reaches the tape


async def test_migrated_group_is_answered_in_the_new_chat(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.fail_next("sendMessage", migrate_to_chat_id=GROUP - 7)
    tg.push_update(tg.group_text(-555, USER, f"@{BOT} hi"))
    [reply] = await h.replies(GROUP - 7, 1)
    assert reply["text"] == f"echo: @{BOT} hi"
    tg.push_update(tg.group_text(-555, USER, f"@{BOT} again"))
    await h.replies(GROUP - 7, 2)
    assert tg.sent_to(-555) == []


async def test_polling_conflict_is_retried(start, tg: FakeTelegram) -> None:
    tg.conflict_next_polls(3)
    h = await start()
    tg.push_update(tg.private_text(USER, "after the conflict"))
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "echo: after the conflict"
    assert h.bot.started["telegram"]


# -- webhook ----------------------------------------------------------------------------------
async def test_webhook_secret_json_and_ack_after_persistence(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(
        telegram_webhook_url="https://bot.example.test/tg/hook", telegram_webhook_secret=SECRET
    )
    assert tg.webhook["url"] == "https://bot.example.test/tg/hook"
    assert tg.webhook["secret_token"] == SECRET and tg.webhook["allowed_updates"] == [
        "message",
        "callback_query",
    ]
    assert not tg.webhook.get("drop_pending_updates")
    assert tg.calls_of("getUpdates") == []
    url = h.server.url + "/tg/hook"
    session = f"telegram:{USER}"
    update = tg.private_text(USER, "via webhook") | {"update_id": 500}
    fake_openai.script(slow(text("done"), 0.3))
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"X-Telegram-Bot-Api-Secret-Token": "wrong"}):
            async with http.post(url, json=update, headers=headers) as resp:
                assert resp.status == 401
        assert not await h.bot.runtime.session_known(session)
        good = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        async with http.post(url, data=b"{not json", headers=good) as resp:
            assert resp.status == 400
        async with http.post(url, json=update, headers=good) as resp:
            assert resp.status == 200
            # The 200 arrives only once the message is on the tape.
            assert await h.user_messages(session) == ["via webhook"]
            assert await resp.read() == b""
        async with http.post(url, json=update | {"update_id": 501}, headers=good) as resp:
            assert resp.status == 200  # a re-delivery: acknowledged, not stored again
        async with http.post(url, json={"update_id": 502, "edited_message": update["message"]}, headers=good) as resp:  # fmt: skip
            assert resp.status == 200
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "done"
    await h.idle(session)
    assert await h.user_messages(session) == ["via webhook"]
    assert len(fake_openai.completion_requests()) == 1


async def test_switching_from_webhook_back_to_polling_keeps_the_backlog(
    start, tg: FakeTelegram
) -> None:
    h = await start(
        telegram_webhook_url="https://bot.example.test/hook", telegram_webhook_secret=SECRET
    )
    await h.server.stop()
    tg.push_update(tg.private_text(USER, "sent while switching"))
    h = await start()
    [reply] = await h.replies(USER, 1)
    assert reply["text"] == "echo: sent while switching"
    assert tg.webhook["url"] == "" and tg.webhook["drop_pending_updates"] is False
