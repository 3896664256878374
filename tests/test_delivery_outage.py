"""A PostgreSQL restart while an answer is being sent: two `bub-bot serve` replicas on the
real PostgreSQL of the tests, the server shut down right after Telegram took the answer and
before the bot could record it, back after longer than a lease. The answer is on the chat
exactly once, from one model request: the sender records it once the database is back, and
a replica that takes the session over waits for that record instead of sending again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram
from tests.pg import PostgresCluster
from tests.test_replicas import (
    Replica,
    answered_on_the_tape,
    answers,
    message,
    replicas,
    tg,
    webhook,
)

__all__ = ["replicas", "tg"]  # fixtures

LEASE = 3.0


@pytest.fixture
def pg_cluster() -> Iterator[PostgresCluster]:
    """A server of this test's own: it is restarted mid-test, the shared one must not be."""
    cluster = PostgresCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_answer_sent_during_a_postgres_restart_is_sent_once(
    replicas: Any, tg: FakeTelegram, fake_openai: FakeOpenAI, pg_cluster: PostgresCluster
) -> None:
    group: list[Replica] = [replicas(**webhook()), replicas(**webhook())]
    await asyncio.gather(*(r.start() for r in group))
    user = 301
    reached, release = asyncio.Event(), asyncio.Event()
    send = tg.methods["sendMessage"]

    async def held(params: dict[str, Any]) -> Any:
        """Telegram takes the answer; its response comes once the database is down."""
        answer = await send(params)
        reached.set()
        await release.wait()
        return answer

    tg.methods["sendMessage"] = held
    assert await group[0].post_update(message(tg, user, "question")) == 200
    await asyncio.wait_for(reached.wait(), 20)
    await asyncio.to_thread(pg_cluster.shut_down)
    release.set()  # the sender learns the post went out: its record cannot be written now
    await asyncio.sleep(LEASE * 1.5)  # down for longer than a lease: the lease lapses
    await asyncio.to_thread(pg_cluster.start_again)

    session = f"telegram:{user}"
    await answered_on_the_tape(group[0], session, timeout=30)
    # Room for the replica that took over to send it again (it must not): its wait for the
    # sender's record is at most a lease period.
    await asyncio.sleep(LEASE * 1.5)
    assert answers(tg, user) == ["echo: question"]
    assert len(fake_openai.completion_requests()) == 1
    assert all(r.alive for r in group)
    logs = "".join(r.log.read_text() for r in group)
    assert "record.retry" in logs  # the record was written after the outage, not lost
