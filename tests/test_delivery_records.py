"""Records of delivery (bub_bot/runtime/records.py) through a database outage: a write that
fails is retried until the database is back, whether or not its caller still waits; a retry
writes only what the tape does not have yet and never moves the session's cursor back; the
writes waiting are bounded. The real PostgreSQL of the tests, one store's connection through
a TCP proxy the test cuts (connections reset)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bub_bot.runtime.facts import DONE, REPLY_SENDING, REPLY_SENT, read_cursor
from bub_bot.runtime.records import Records, RecordsFull
from bub_bot.tape import Tape, TapeEntry, TapeStore, open_store
from tests.pg import PostgresCluster
from tests.runtime_channel import idle, make_runtime, tape_of
from tests.tcp_proxy import TcpProxy

__all__ = ["make_runtime"]  # the fixture

SESSION = "test:records"


@pytest.fixture
async def stores(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> AsyncIterator[tuple[TapeStore, TapeStore, TcpProxy]]:
    url = pg_cluster.fresh_url()
    with TcpProxy("127.0.0.1", pg_cluster.port) as proxy:
        async with open_store(proxy.route(url)) as cut, open_store(url) as direct:
            yield cut, direct, proxy


def sent(reply: int, chunk: int = 0) -> TapeEntry:
    return TapeEntry.event(REPLY_SENT, {"reply": reply, "chunk": chunk, "ids": ["m1"]})


def done(through: int, reply: int) -> TapeEntry:
    return TapeEntry.event(DONE, {"through": through, "reply": reply}, context=False)


async def test_a_record_is_written_once_the_database_is_back(
    stores: tuple[TapeStore, TapeStore, TcpProxy], tmp_path: Path
) -> None:
    cut, direct, proxy = stores
    tape = Tape.for_session(cut, SESSION, tmp_path)
    records = Records()
    [user] = await tape.append_many([TapeEntry.message({"role": "user", "content": "q"})])
    proxy.cut(reset=True)
    caller = asyncio.create_task(records.write(tape, [sent(user.id + 1), done(user.id, 2)]))
    await asyncio.sleep(0.3)
    assert records.pending(tape.name)
    caller.cancel()  # the worker lost its lease: the record still goes to the tape
    proxy.restore()
    await records.settled(tape.name)
    assert not records.pending(tape.name)
    seen = Tape.for_session(direct, SESSION, tmp_path)
    assert [e.payload["name"] for e in await seen.query(kinds=["event"])] == [REPLY_SENT, DONE]
    assert await read_cursor(seen) == user.id


async def test_a_retry_writes_only_what_the_tape_lacks(
    stores: tuple[TapeStore, TapeStore, TcpProxy], tmp_path: Path
) -> None:
    cut, direct, proxy = stores
    tape = Tape.for_session(cut, SESSION, tmp_path)
    other = Tape.for_session(direct, SESSION, tmp_path)
    records = Records()
    proxy.cut(reset=True)
    late = asyncio.create_task(records.write(tape, [sent(7), done(5, 7)]))
    await asyncio.sleep(0.3)
    # Meanwhile another replica recorded the piece and answered a later message.
    await other.append_many([sent(7), done(5, 7)])
    await other.append(done(9, 8))
    proxy.restore()
    assert await asyncio.wait_for(late, 10) == []
    names = [e.payload["name"] for e in await other.query(kinds=["event"])]
    assert names == [REPLY_SENT, DONE, DONE]
    assert await read_cursor(other) == 9  # the late marker did not move the cursor back


async def test_waiting_records_are_bounded(
    stores: tuple[TapeStore, TapeStore, TcpProxy], tmp_path: Path
) -> None:
    cut, _, proxy = stores
    tape = Tape.for_session(cut, SESSION, tmp_path)
    records = Records(limit=1)
    proxy.cut(reset=True)
    first = asyncio.create_task(records.write(tape, [sent(1)]))
    await asyncio.sleep(0.3)
    with pytest.raises(RecordsFull):
        await records.write(tape, [sent(2)])
    proxy.restore()
    assert len(await asyncio.wait_for(first, 10)) == 1


async def test_only_a_reply_delivered_by_the_queue_writes_a_sending_mark(
    make_runtime, fake_openai
) -> None:
    """A plain turn's answer marks itself (no write of its own, fewer transactions); the
    /reset reply, delivered by whoever runs the queue next, is marked before it goes out."""
    runtime, channel = make_runtime()
    await channel.say("hello", key="upd-1")
    await idle(runtime, "test:a")
    tape = tape_of(runtime, "test:a")
    assert await tape.query(kinds=["event"], names=[REPLY_SENDING]) == []
    await channel.say("/reset", key="upd-2")
    await idle(runtime, "test:a")
    names = [e.payload["name"] for e in await tape.query(kinds=["event"])]
    assert names.index(REPLY_SENDING) < names.index(REPLY_SENT)
    assert channel.texts("a")[0] == "echo: hello" and len(channel.texts("a")) == 2
