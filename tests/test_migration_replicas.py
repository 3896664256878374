"""A Telegram group that becomes a supergroup stays one conversation across two `bub-bot serve`
replicas on the real PostgreSQL of the tests: replica B heard from the supergroup's new id
before replica A recorded the migration, and still continues the group's tape afterwards
(it no longer trusts "not moved" for the life of the process)."""

from __future__ import annotations

import asyncio

from bub_bot.runtime.placement import MOVE_RECHECK_SECONDS
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram
from tests.test_replicas import replicas, tg, wait_until, webhook
from tests.test_telegram_migration import service

__all__ = ["replicas", "tg"]  # fixtures

OLD, NEW = -4242, -1004242
USER = 88
BOT = "@bub_replica_bot"
_ids = iter(range(50_000, 10**9))


def numbered(update: dict) -> dict:
    return update | {"update_id": next(_ids)}


async def test_a_migration_recorded_on_one_replica_holds_on_the_other(
    replicas, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    a, b = replicas(**webhook()), replicas(**webhook())
    await asyncio.gather(a.start(), b.start())
    assert await a.post_update(numbered(tg.group_text(OLD, USER, f"{BOT} remember 42"))) == 200
    await wait_until(lambda: len(tg.sent_to(OLD)) == 1)
    # B hears from the new id before the migration is recorded: a conversation of its own.
    assert await b.post_update(numbered(tg.group_text(NEW, USER, f"{BOT} early hello"))) == 200
    await wait_until(lambda: len(tg.sent_to(NEW)) == 1)
    # Telegram announces the migration; A records it.
    assert await a.post_update(numbered(service(tg, OLD, migrate_to_chat_id=NEW))) == 200
    assert await a.post_update(numbered(service(tg, NEW, migrate_from_chat_id=OLD))) == 200
    # Past the re-read interval, whether or not B heard A's notice.
    await asyncio.sleep(MOVE_RECHECK_SECONDS + 0.5)
    assert await b.post_update(numbered(tg.group_text(NEW, USER, f"{BOT} which number?"))) == 200
    await wait_until(lambda: len(tg.sent_to(NEW)) == 2)
    users = [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"]
    assert users == [f"{BOT} remember 42", f"{BOT} which number?"]
    assert "session.moved" in a.log.read_text()
