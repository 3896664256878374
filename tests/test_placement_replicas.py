"""A session moved on one replica (a Telegram group that became a supergroup) is seen moved by
every replica, on the real PostgreSQL of the tests: a replica that cached "not moved" before
the move re-reads it after `MOVE_RECHECK_SECONDS` (its clock moved by the test instead of
waiting), and at once when the moving replica's broadcast arrives; two runtimes on one
database then keep one conversation on one tape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.runtime.placement import MOVE_RECHECK_SECONDS, MOVED_TOPIC, Placement
from bub_bot.tape import Tape, TapeEntry, TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI
from tests.runtime_channel import until
from tests.test_leases import leases, replicas

__all__ = ["leases", "replicas"]  # fixtures

OLD, NEW = "test:old", "test:new"


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[TapeStore]:
    async with open_store(pg_url) as store:
        yield store


class Clock:
    """Monotonic seconds the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_not_moved_is_read_again_after_a_while(
    pg_store: TapeStore, settings: Callable[..., Any]
) -> None:
    conf = settings()
    clock = Clock()
    mover, other = Placement(conf, pg_store, shared=True), Placement(conf, pg_store, shared=True, clock=clock)  # fmt: skip
    await Tape.for_session(pg_store, NEW, conf.workspace).append(TapeEntry.event("seen", {}))
    assert await other.moved_to(NEW, None) is None  # cached: not moved
    await mover.move(OLD, NEW)
    assert await other.moved_to(NEW, None) is None  # still trusted for a moment
    clock.now += MOVE_RECHECK_SECONDS + 0.1
    assert await other.moved_to(NEW, None) == OLD
    clock.now += 3600
    assert await other.moved_to(NEW, None) == OLD  # a move is for good
    # One process alone (SQLite) moves everything itself: "not moved" is kept.
    alone = Placement(conf, pg_store, clock=clock)
    assert await alone.moved_to("test:never", None) is None
    clock.now += 3600
    assert await alone.moved_to("test:never", None) is None


async def test_a_move_broadcast_reaches_the_other_replica_at_once(
    pg_store: TapeStore, settings: Callable[..., Any], leases
) -> None:
    conf = settings()
    frozen = Clock()  # never moves: only the broadcast can tell the other replica
    mover, other = Placement(conf, pg_store, shared=True), Placement(conf, pg_store, shared=True, clock=frozen)  # fmt: skip
    theirs, ours = leases("mover"), leases("other")
    mover.announce = theirs.broadcast
    ours.subscribe(MOVED_TOPIC, other.heard_move)
    await ours.listen(lambda key: None)
    assert await other.moved_to(NEW, None) is None
    await mover.move(OLD, NEW)
    await until(lambda: NEW not in other._moved, timeout=5)
    assert await other.moved_to(NEW, None) == OLD
    other.heard_move("not json")  # an unreadable notice changes nothing
    assert await other.moved_to(NEW, None) == OLD


async def test_two_runtimes_keep_a_moved_conversation_on_one_tape(
    replicas, fake_openai: FakeOpenAI
) -> None:
    (one, ch1), (two, ch2) = await replicas("one"), await replicas("two")

    def sent(chat: str) -> list[str]:
        """What either replica sent to `chat` (whichever ran the session)."""
        return ch1.texts(chat) + ch2.texts(chat)

    await ch1.say("remember 42", chat="old", key="m1")
    await until(lambda: len(sent("old")) == 1)
    # Replica two hears from the new id before the move is recorded: its own tape, for now.
    await ch2.say("hello before the move", chat="new", key="m2")
    await until(lambda: len(sent("new")) == 1)
    assert (await two.session_tape(NEW)).name != (await two.session_tape(OLD)).name
    await until(lambda: two.lease_keeper.held == 0 and one.lease_keeper.held == 0)
    await one.move_session(OLD, NEW)
    old_tape = (await one.session_tape(OLD)).name

    async def two_sees_the_move() -> bool:
        return (await two.session_tape(NEW)).name == old_tape

    async with asyncio.timeout(5):  # the broadcast, or at worst the re-read
        while not await two_sees_the_move():  # noqa: ASYNC110 (polls the other replica)
            await asyncio.sleep(0.05)
    await ch2.say("which number?", chat="new", key="m3")
    await until(lambda: len(sent("new")) == 2)
    users = [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"]
    assert "remember 42" in users and "which number?" in users
    assert "hello before the move" not in users
