"""Background subagents across replicas on one PostgreSQL database (in process): a run one
replica started and lost (shut down mid-run) is picked up by exactly one of two replicas
starting at once, and its result reaches the conversation once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.agent.subagent import register_subagent_tool
from bub_bot.runtime import Runtime
from bub_bot.runtime.subagents import KIND
from bub_bot.tape import TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI
from tests.runtime_channel import RuntimeChannel, until
from tests.subagent_harness import Router


@pytest.fixture
async def replicas(pg_url: str, settings: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """`replica(owner)`: a started Runtime with its own store, leases and test channel."""
    made: list[tuple[Runtime, TapeStore, Agent]] = []

    async def make(owner: str, start: bool = True) -> tuple[Runtime, RuntimeChannel, TapeStore]:
        conf = settings(lease_seconds=2)
        store = await open_store(pg_url)
        agent = Agent(conf, ModelClient(conf), default_registry())
        channel = RuntimeChannel()
        runtime = Runtime(conf, store, agent, {channel.name: channel}, store.leases(owner, 2))
        register_subagent_tool(agent.tools, runtime.subagents)
        channel.runtime = runtime
        made.append((runtime, store, agent))
        if start:
            await runtime.start()
        return runtime, channel, store

    yield make
    for runtime, store, agent in made:
        await runtime.shutdown(grace=2)
        await agent.model.close()
        await store.close()


async def test_two_replicas_pick_up_an_interrupted_run_once(
    replicas, fake_openai: FakeOpenAI
) -> None:
    router = Router(child_delays=(30.0, 0.5, 0.5))
    fake_openai.default = router
    first, ch1, store = await replicas("one")
    await ch1.say("go")
    await ch1.wait_sent("a", 1)
    await until(lambda: router.child_calls == 1, timeout=10)
    await first.shutdown(grace=0.1)  # the run is cut off; its job stays
    assert len(await store.jobs(kinds=[KIND])) == 1

    (two, ch2, _), (three, ch3, _) = await replicas("two", False), await replicas("three", False)
    await asyncio.gather(two.start(), three.start())

    def results() -> list[str]:
        return [t for t in ch2.texts("a") + ch3.texts("a") if t.startswith("relay:")]

    await until(lambda: len(results()) == 1, timeout=20)
    await asyncio.sleep(2.5)  # past a lease period: a second run would have shown up
    assert results() == ["relay: child found 42"]
    assert router.child_calls == 2 and len(router.relayed) == 1
    assert await store.jobs(kinds=[KIND]) == []
