"""Two replicas on one PostgreSQL database enforce one budget: each stands for a `serve`
process (its own pool, leases, budgets and channel), turns run on both at once, and the total
overshoots the budget by less than one step per replica (BUB_MAX_CONCURRENT_TURNS=1: one
model call in flight per replica)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.runtime import Runtime
from bub_bot.tape import TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI, tool_calls
from tests.runtime_channel import RuntimeChannel, until

STEP = {"prompt_tokens": 80, "completion_tokens": 30, "total_tokens": 110}
BUDGET = 1000


@pytest.fixture
async def replicas(pg_url: str, settings: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Runtime, TapeStore, Agent]] = []

    async def make(owner: str, **overrides: Any) -> tuple[Runtime, RuntimeChannel]:
        values = {"budget_total": f"{BUDGET}/day", "max_concurrent_turns": 1, **overrides}
        conf = settings(**values)
        store = await open_store(pg_url)
        agent = Agent(conf, ModelClient(conf), default_registry())
        channel = RuntimeChannel()
        runtime = Runtime(conf, store, agent, {channel.name: channel}, store.leases(owner, 15))
        channel.runtime = runtime
        made.append((runtime, store, agent))
        await runtime.start()
        return runtime, channel

    yield make
    for runtime, store, agent in made:
        await runtime.shutdown(grace=2)
        await agent.model.close()
        await store.close()


async def test_two_replicas_enforce_one_total_budget(replicas, fake_openai: FakeOpenAI) -> None:
    # Every step asks for another tool call: only the budget ends these turns.
    fake_openai.default = lambda body: tool_calls([("tape_info", {})], usage=STEP)
    fake_openai.latency = 0.03
    (one, ch1), (_two, ch2) = await replicas("one"), await replicas("two")
    chats = [f"c{n}" for n in range(6)]
    for n, chat in enumerate(chats):
        channel = ch1 if n % 2 == 0 else ch2
        await channel.say(f"work in {chat}", chat, key=f"{chat}-1")

    def answered() -> bool:
        return all(len(ch1.texts(c)) + len(ch2.texts(c)) >= 1 for c in chats)

    await until(answered, timeout=60)
    calls = len(fake_openai.completion_requests())
    rows = await one.store.usage(["t"], "d:0000", "d:9999")
    total = sum(r.tokens for r in rows)
    assert total == calls * 110  # every call counted, once
    # Stopped once spent; at worst each replica's one call in flight had passed the check
    # just before the budget was crossed: under BUDGET + 2 steps.
    assert BUDGET <= total < BUDGET + 2 * 110
    assert any(ch1.texts(c) for c in chats) and any(ch2.texts(c) for c in chats)  # both ran
    notes = [t for c in chats for t in ch1.texts(c) + ch2.texts(c)]
    assert all("The bot's daily budget (1000 tokens/day) is used up" in t for t in notes)
    # A restarted replica (a new store, new budgets) sees the same counters: still refused.
    _three, ch3 = await replicas("three")
    await ch3.say("anything?", "c9", key="c9-1")
    await until(lambda: len(ch3.texts("c9")) == 1, timeout=20)
    assert "is used up" in ch3.texts("c9")[0]
    assert len(fake_openai.completion_requests()) == calls


async def test_one_rate_note_per_window_across_replicas(replicas, fake_openai: FakeOpenAI) -> None:
    """Messages of one person in one conversation arrive at both replicas at once: two are
    answered, the rest stored refused, and exactly one of them gets the note."""
    fake_openai.latency = 0.02
    (one, ch1), (_two, ch2) = (
        await replicas("one", limit_user="2/hour"),
        await replicas("two", limit_user="2/hour"),
    )
    await asyncio.gather(
        *((ch1 if n % 2 else ch2).say(f"m{n}", "a", key=f"a-{n}", sender="u1") for n in range(8))
    )
    await until(lambda: len(ch1.texts("a")) + len(ch2.texts("a")) >= 2, timeout=20)
    await asyncio.sleep(0.5)  # nothing more comes
    texts = ch1.texts("a") + ch2.texts("a")
    notes = [t for t in texts if "faster than this bot allows" in t]
    assert len(notes) == 1
    entries = await one.store.query(
        (await one.session_tape("test:a")).name, kinds=["message"], names=["user"]
    )
    assert sum(1 for e in entries if "refused" not in e.meta) == 2
    assert sum(1 for e in entries if e.meta.get("refused", {}).get("note")) == 1
    sent = [str(r.body) for r in fake_openai.completion_requests()]
    refused = [e.payload["content"] for e in entries if "refused" in e.meta]
    assert len(refused) == 6 and not any(f"'{m}'" in b for m in refused for b in sent)
