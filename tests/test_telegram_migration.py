"""A group that becomes a supergroup keeps its conversation: the new chat id continues the
old session's tape (issue 13 §4)."""

from __future__ import annotations

import asyncio

from bub_bot.tape import Tape
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.telegram_api import FakeTelegram
from tests.test_telegram import BOT, USER, start, tg, wait_until

__all__ = ["start", "tg"]  # fixtures

OLD, NEW = -555, -100555


def service(fake: FakeTelegram, chat_id: int, **fields: int) -> dict:
    chat = fake._group_chat(chat_id, is_forum=False)
    user = fake._user(USER, "Ann", None)
    return fake.message_update({"chat": chat, "from": user, **fields})


async def test_supergroup_continues_the_groups_conversation(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.script(text("noted"), text("it was 42"))
    tg.push_update(tg.group_text(OLD, USER, f"@{BOT} remember 42"))
    await h.replies(OLD, 1)
    await h.idle(f"telegram:{OLD}")
    # Telegram announces the migration in both chats
    tg.push_update(service(tg, OLD, migrate_to_chat_id=NEW))
    tg.push_update(service(tg, NEW, migrate_from_chat_id=OLD))
    await h.handled()
    tg.push_update(tg.group_text(NEW, USER, f"@{BOT} which number?"))
    [reply] = await h.replies(NEW, 1)
    assert reply["text"] == "it was 42"
    # the model saw the earlier phase: same tape, context since its last anchor
    users = [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"]
    assert users == [f"@{BOT} remember 42", f"@{BOT} which number?"]
    await h.idle(f"telegram:{OLD}")
    assert await h.user_messages(f"telegram:{OLD}") == [
        f"@{BOT} remember 42",
        f"@{BOT} which number?",
    ]
    # the move is on the tape, so a restarted process (another Runtime) finds it too
    runtime = h.bot.runtime
    new_tape = Tape.for_session(runtime.store, f"telegram:{NEW}", runtime.settings.workspace)
    [moved] = await new_tape.query(kinds=["anchor"])
    assert moved.payload == {"name": "session/moved", "state": {"to": f"telegram:{OLD}"}}
    await wait_until(lambda: len(tg.sent_to(OLD)) == 1)


async def test_a_migration_learned_while_sending_continues_the_conversation(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    fake_openai.script(text("noted"), text("it was 7"))
    tg.fail_next("sendMessage", migrate_to_chat_id=NEW)
    tg.push_update(tg.group_text(OLD, USER, f"@{BOT} remember 7"))
    [reply] = await h.replies(NEW, 1)
    assert reply["text"] == "noted"
    await h.idle(f"telegram:{OLD}")
    runtime = h.bot.runtime
    new_tape = Tape.for_session(runtime.store, f"telegram:{NEW}", runtime.settings.workspace)
    for _ in range(200):  # the move is recorded beside the send, not in the turn
        if await new_tape.query(kinds=["anchor"]):
            break
        await asyncio.sleep(0.02)
    tg.push_update(tg.group_text(NEW, USER, f"@{BOT} which number?"))
    await h.replies(NEW, 2)
    users = [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"]
    assert users == [f"@{BOT} remember 7", f"@{BOT} which number?"]
    assert tg.sent_to(OLD) == []
