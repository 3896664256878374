"""What a plain turn costs PostgreSQL: store transactions (pool acquires) per plain turn,
counted, never timed; one process, and with the leases several replicas share."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.runtime import Runtime
from bub_bot.tape import Tape, TapeEntry, open_store
from bub_bot.tape.leases import LeaseKey, LocalLeases
from bub_bot.tape.postgres import PostgresTapeStore
from tests.fakes.openai_server import slow, text, tool_calls
from tests.runtime_channel import (
    RuntimeChannel,
    events,
    final_replies,
    idle,
    inbound_users,
    tape_of,
    until,
)
from tests.test_turn_cost import PLAIN_TURN_TRANSACTIONS

SHARED_TURN_TRANSACTIONS = 6
"""With shared leases, on top of the four: the lease taken (1), and its release in the
statement that reads the queue once more (a message another replica stored while we held
the lease is ours to answer) (1). What is pending is re-read after the answer only when the
model saw newer entries than the queue held (another replica stored a message mid-turn)."""


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[PostgresTapeStore]:
    async with open_store(pg_url) as opened:
        assert isinstance(opened, PostgresTapeStore)
        yield opened


@pytest.fixture
async def pg_runtime(
    pg_store: PostgresTapeStore, agent: Callable[..., Any]
) -> AsyncIterator[Callable[[bool], tuple[Runtime, RuntimeChannel]]]:
    """`pg_runtime(shared)`: a runtime on the PostgreSQL store, with this process's leases in
    the database (`shared`, as `serve` has them there) or granted locally."""
    made: list[Runtime] = []

    def make(shared: bool) -> tuple[Runtime, RuntimeChannel]:
        built = agent()
        channel = RuntimeChannel()
        leases = pg_store.leases("replica-a", built.settings.lease_seconds) if shared else None
        runtime = Runtime(built.settings, pg_store, built, {channel.name: channel}, leases)
        channel.runtime = runtime
        made.append(runtime)
        return runtime, channel

    yield make
    for runtime in made:
        await runtime.shutdown(grace=2)


async def second_turn_cost(
    runtime: Runtime, channel: RuntimeChannel, store: PostgresTapeStore
) -> int:
    """Transactions of a plain turn on a session that has had one already."""
    await channel.say("first", chat="a")
    await idle(runtime, "test:a")
    before = store.transactions
    await channel.say("second", chat="a")
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["echo: first", "echo: second"]
    return store.transactions - before


async def test_a_plain_turn_on_postgres_costs_four_transactions(
    pg_runtime, pg_store: PostgresTapeStore, fake_openai
) -> None:
    runtime, channel = pg_runtime(False)
    assert await second_turn_cost(runtime, channel, pg_store) <= PLAIN_TURN_TRANSACTIONS


async def test_a_plain_turn_with_shared_leases(
    pg_runtime, pg_store: PostgresTapeStore, fake_openai
) -> None:
    runtime, channel = pg_runtime(True)
    await runtime.start()
    assert await second_turn_cost(runtime, channel, pg_store) <= SHARED_TURN_TRANSACTIONS


async def test_query_many_reads_one_snapshot_in_one_transaction(
    pg_store: PostgresTapeStore, pg_url: str
) -> None:
    """The views of `query_many` see one snapshot, in one counted transaction: an entry
    another process commits between two views is in neither (the queue and the context a
    worker reads agree)."""
    tape = "snapshot-tape"
    await pg_store.append(tape, TapeEntry.message({"role": "user", "content": "a"}))

    async def write_elsewhere() -> None:
        async with open_store(pg_url) as other:
            await other.append(tape, TapeEntry.message({"role": "user", "content": "b"}))

    def between(found: list[list[TapeEntry]]) -> dict[str, Any]:
        # A view function cannot await: the other writer runs to its commit on a thread
        # with its own event loop and connection while this read waits.
        thread = threading.Thread(target=asyncio.run, args=(write_elsewhere(),))
        thread.start()
        thread.join(30)
        return {"after_id": 0}

    start = pg_store.transactions
    first, second = await pg_store.query_many(tape, [{"after_id": 0}, between])
    assert pg_store.transactions == start + 1
    assert [e.payload["content"] for e in first] == ["a"]
    assert second == first
    later = await pg_store.query(tape, after_id=0)
    assert [e.payload["content"] for e in later] == ["a", "b"]


async def test_a_message_another_replica_stores_mid_turn_is_still_answered(
    pg_runtime, pg_url: str, agent: Callable[..., Any], fake_openai
) -> None:
    """The holder reads no queue between its turn and the release: the read after the
    release finds what another replica stored meanwhile (its claim failed) and answers it."""
    runtime, channel = pg_runtime(True)
    await runtime.start()
    async with open_store(pg_url) as other_store:
        built = agent()
        other_channel = RuntimeChannel()
        other = Runtime(
            built.settings,
            other_store,
            built,
            {other_channel.name: other_channel},
            other_store.leases("replica-b", built.settings.lease_seconds),
        )
        other_channel.runtime = other
        await other.start()
        try:
            fake_openai.script(slow(text("answer one"), 0.5))
            await channel.say("one", chat="m")
            await until(lambda: len(fake_openai.completion_requests()) >= 1)
            # Replica B stores the next message while A's model is working: B's claim of the
            # lease fails, A holds it.
            await other_channel.say("two", chat="m", key="from-b")
            await channel.wait_sent("m", 2)
            await idle(runtime, "test:m")
            assert channel.texts("m") == ["answer one", "echo: two"]
            assert other_channel.texts("m") == []
        finally:
            await other.shutdown(grace=2)


async def test_a_message_the_model_saw_mid_turn_is_answered_once(
    pg_runtime, pg_url: str, agent: Callable[..., Any], fake_openai
) -> None:
    """A message another replica stores during a turn's first step reaches the model in the
    next step: the holder re-reads what is pending (the model saw newer than its queue), so
    that one answer covers it and no second turn answers it again."""
    runtime, channel = pg_runtime(True)
    await runtime.start()
    async with open_store(pg_url) as other_store:
        built = agent()
        other_channel = RuntimeChannel()
        other = Runtime(
            built.settings,
            other_store,
            built,
            {other_channel.name: other_channel},
            other_store.leases("replica-b", built.settings.lease_seconds),
        )
        other_channel.runtime = other
        await other.start()
        try:
            fake_openai.script(slow(tool_calls([("tape_info", {})]), 0.5), text("noted both"))
            await channel.say("one", chat="s")
            await until(lambda: len(fake_openai.completion_requests()) >= 1)
            await other_channel.say("two", chat="s", key="from-b")
            await channel.wait_sent("s", 1)
            tape = tape_of(runtime, "test:s")
            (two,) = [e for e in await inbound_users(tape) if e.payload["content"] == "two"]
            async with asyncio.timeout(10):
                # Until "two" is marked answered (by this answer, or a second turn's).
                while not await answered(tape, two):  # noqa: ASYNC110 (polls the tape)
                    await asyncio.sleep(0.01)
            await idle(runtime, "test:s")
            assert channel.texts("s") == ["noted both"]
            assert len(await final_replies(tape)) == 1
            second = fake_openai.completion_requests()[1].body["messages"]
            assert [m["content"] for m in second if m["role"] == "user"][-1] == "two"
            assert len(fake_openai.completion_requests()) == 2
        finally:
            await other.shutdown(grace=2)


async def answered(tape: Tape, entry: TapeEntry) -> bool:
    """Whether an `inbound.done` marker covers `entry`."""
    marks = await events(tape, "inbound.done")
    return any(int(m.payload["data"]["through"]) >= (entry.id or 0) for m in marks)


async def test_release_reading_lets_go_and_reads_in_one_statement(
    pg_store: PostgresTapeStore, pg_url: str
) -> None:
    """The holder's release reads what another replica stored meanwhile, in one counted
    round of work; the other replica then takes the lease."""
    key = LeaseKey("release-tape", "test:r")
    mine = pg_store.leases("replica-a", 30)
    async with open_store(pg_url) as other_store:
        theirs = other_store.leases("replica-b", 30)
        assert await mine.acquire(key)
        first = await pg_store.append(key.tape, TapeEntry.message({"role": "user", "content": "a"}))
        await other_store.append(key.tape, TapeEntry.message({"role": "user", "content": "b"}))
        assert not await theirs.acquire(key)  # A holds it: B relies on A's look after release
        start = pg_store.transactions
        found = await mine.release_reading(key, first.id or 0)
        assert pg_store.transactions == start + 1
        assert [e.payload["content"] for e in found or []] == ["b"]
        assert await theirs.acquire(key)
        # Only our own lease is released: B's stays.
        assert await mine.release_reading(key, 0) is not None
        assert not await mine.acquire(key)
    assert await LocalLeases().release_reading(key, 0) is None
