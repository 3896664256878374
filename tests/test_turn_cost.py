"""What a turn costs the store: transactions per plain turn (counted, never timed), and the
pieces that keep it low (`query_many`, the store's transaction counter)."""

from __future__ import annotations

import asyncio

from bub_bot.tape import Tape, TapeEntry, TapeStore
from tests.fakes.openai_server import slow, text
from tests.runtime_channel import idle, make_runtime, tape_of

__all__ = ["make_runtime"]  # the fixture

PLAIN_TURN_TRANSACTIONS = 4
"""Message in (1), the worker's read of its queue and the turn's context (1), the answer with
the step's records (1), the piece sent with the queue's done marker (1)."""


async def test_a_plain_turn_costs_four_transactions(make_runtime, fake_openai, store) -> None:
    runtime, channel = make_runtime()
    await channel.say("first", chat="a")
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["echo: first"]

    before = store.transactions
    await channel.say("second", chat="a")
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["echo: first", "echo: second"]
    assert store.transactions - before <= PLAIN_TURN_TRANSACTIONS

    # Fewer writes, the same record: the turn's start, its answer and step, the piece sent
    # and the done marker, in that order after the message.
    entries = await tape_of(runtime, "test:a").query(after_id=0)
    second = next(e for e in entries if e.payload.get("content") == "second")
    after = [e for e in entries if e.id > second.id]
    assert [e.payload.get("name") or e.payload.get("role") for e in after] == [
        "loop.start",
        "assistant",
        "run",
        "loop.step",
        "reply.sent",
        "inbound.done",
    ]
    assert after[1].payload["content"] == "echo: second"
    assert after[-1].payload["data"]["through"] == second.id


async def test_a_message_during_the_turn_is_still_answered(make_runtime, fake_openai) -> None:
    """The worker skips reading its queue again after a turn only when nothing was stored
    for the session meanwhile: a message that arrives during the model call is answered."""
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("answer one"), 0.3))
    await channel.say("one", chat="b")
    await asyncio.sleep(0.1)  # the model is working on "one"
    await channel.say("two", chat="b")
    await channel.wait_sent("b", 2)
    await idle(runtime, "test:b")
    # "two" came after the model's context was read: the next turn answers it.
    assert channel.texts("b") == ["answer one", "echo: two"]
    tape = tape_of(runtime, "test:b")
    done = await tape.query(kinds=["event"], names=["inbound.done"])
    users = await tape.query(kinds=["message"], names=["user"])
    assert done[-1].payload["data"]["through"] == users[-1].id


async def test_transactions_count_rounds_of_work(any_store: TapeStore) -> None:
    tape = Tape(any_store, "cost-tape", "s")
    await tape.append(TapeEntry.message({"role": "user", "content": "new tape"}))
    start = any_store.transactions
    await tape.append(TapeEntry.message({"role": "user", "content": "hi"}))
    assert any_store.transactions == start + 1
    await tape.query(after_last_anchor=True)
    assert any_store.transactions == start + 2


async def test_query_many_reads_in_order_with_dependent_views(any_store: TapeStore) -> None:
    tape = Tape(any_store, "many-tape", "s")
    await tape.append_many(
        [
            TapeEntry.message({"role": "user", "content": "a"}),
            TapeEntry.event("mark", {"at": 1}),
            TapeEntry.message({"role": "user", "content": "b"}),
        ]
    )
    marks, after, none = await tape.query_many(
        {"kinds": ["event"], "names": ["mark"], "limit": 1},
        lambda found: {"after_id": found[0][0].id},
        lambda found: None,
    )
    assert [e.payload["data"]["at"] for e in marks] == [1]
    assert [e.payload["content"] for e in after] == ["b"]
    assert none == []
