"""Background subagents through the runtime: the result arrives once as a message of its
own, a failure says so, /status lists and /stop cancels, an interrupted run restarts on the
next start and its result still arrives once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.agent.subagent import register_subagent_tool
from bub_bot.runtime import Runtime
from bub_bot.runtime.subagents import KIND, result_key
from bub_bot.tape import SQLiteTapeStore
from tests.fakes.openai_server import FakeOpenAI
from tests.runtime_channel import RuntimeChannel, idle, tape_of, until
from tests.subagent_harness import Router


@pytest.fixture
async def bot(store: SQLiteTapeStore, agent: Callable[..., Any]) -> AsyncIterator[Any]:
    """`bot(**settings)`: a started runtime with the subagent tool and a test channel."""
    made: list[Runtime] = []

    async def make(**overrides: Any) -> tuple[Runtime, RuntimeChannel]:
        built = agent(**overrides)
        channel = RuntimeChannel()
        runtime = Runtime(built.settings, store, built, {channel.name: channel})
        register_subagent_tool(built.tools, runtime.subagents)
        channel.runtime = runtime
        await runtime.start()
        made.append(runtime)
        return runtime, channel

    yield make
    for runtime in made:
        await runtime.shutdown(grace=2)


async def test_background_result_arrives_once_as_its_own_message(
    bot, fake_openai: FakeOpenAI
) -> None:
    router = Router()
    fake_openai.default = router
    runtime, channel = await bot()
    await channel.say("research this in the background")
    texts = await channel.wait_sent("a", 2)
    assert texts == ["started it", "relay: child found 42"]
    await idle(runtime, "test:a")
    await asyncio.sleep(0.2)
    assert channel.texts("a") == texts and router.child_calls == 1
    assert await runtime.store.jobs(kinds=[KIND]) == []
    tape = tape_of(runtime, "test:a")
    [result] = [
        e
        for e in await tape.query(kinds=["message"], names=["user"])
        if e.meta.get("origin") == "subagent"
    ]
    assert result.meta["inbound"] and result.meta["status"] == "ok"
    assert result.meta["reply_target"] == {"chat": "a"} and result.meta["sender"]["id"] == "u1"
    assert await runtime.store.is_duplicate(result_key(result.meta["subagent"]))


async def test_a_failing_background_subagent_says_so(bot, fake_openai: FakeOpenAI) -> None:
    router = Router(fail_child=True)
    fake_openai.default = router
    runtime, channel = await bot()
    await channel.say("go")
    texts = await channel.wait_sent("a", 2)
    assert texts[0] == "started it"
    assert "failed (error)" in router.relayed[0]
    assert await runtime.store.jobs(kinds=[KIND]) == []


async def test_status_lists_and_stop_cancels(bot, fake_openai: FakeOpenAI) -> None:
    router = Router(child_delays=(30.0,))
    fake_openai.default = router
    runtime, channel = await bot()
    await channel.say("go")
    await channel.wait_sent("a", 1)
    await until(lambda: router.child_calls == 1)
    await channel.say("/status")
    status = (await channel.wait_sent("a", 2))[1]
    [job] = await runtime.store.jobs(kinds=[KIND])
    assert f"{job.id} (temp): dig into it" in status
    await channel.say(f"/stop {job.id}")
    texts = await channel.wait_sent("a", 4)
    assert f"Stopped: {job.id}." in texts
    assert "was stopped" in router.relayed[0]
    assert await runtime.store.jobs(kinds=[KIND]) == []


async def test_interrupted_run_restarts_on_start_and_reports_once(
    store, agent, fake_openai: FakeOpenAI
) -> None:
    router = Router(child_delays=(30.0,))
    fake_openai.default = router
    built = agent()
    channel = RuntimeChannel()
    first = Runtime(built.settings, store, built, {channel.name: channel})
    register_subagent_tool(built.tools, first.subagents)
    channel.runtime = first
    await first.start()
    await channel.say("go")
    await channel.wait_sent("a", 1)
    await until(lambda: router.child_calls == 1)
    await first.shutdown(grace=0.1)  # the run is cut off; its job stays
    assert len(await store.jobs(kinds=[KIND])) == 1

    again = agent()
    second = Runtime(again.settings, store, again, {channel.name: channel})
    register_subagent_tool(again.tools, second.subagents)
    channel.runtime = second
    await second.start()
    try:
        texts = await channel.wait_sent("a", 2)
        assert texts == ["started it", "relay: child found 42"]
        assert "restarted after the bot was interrupted" in router.relayed[0]
        await asyncio.sleep(0.3)
        assert len(channel.texts("a")) == 2 and router.child_calls == 2
        assert await store.jobs(kinds=[KIND]) == []
    finally:
        await second.shutdown(grace=2)


async def test_concurrency_counts_background_and_foreground_once(
    bot, fake_openai: FakeOpenAI
) -> None:
    router = Router(child_delays=(30.0, 30.0))
    fake_openai.default = router
    runtime, channel = await bot(subagent_max_concurrent=2)
    await channel.say("go")
    await channel.wait_sent("a", 1)
    await channel.say("go again")
    await channel.wait_sent("a", 2)
    await until(lambda: router.child_calls == 2)
    assert len(await runtime.store.jobs(kinds=[KIND])) == 2  # two may run: both started
    await channel.say("and a third")
    await channel.wait_sent("a", 3)
    tape = tape_of(runtime, "test:a")
    results = [
        r["content"] for e in await tape.query(kinds=["tool_result"]) for r in e.payload["results"]
    ]
    assert results[-1].startswith("error: this conversation runs the most subagents allowed")
    assert "BUB_SUBAGENT_MAX_CONCURRENT=2" in results[-1]
    assert len(await runtime.store.jobs(kinds=[KIND])) == 2


async def test_watchdog_speaks_for_a_run_nobody_could_finish(
    store, agent, fake_openai: FakeOpenAI
) -> None:
    from bub_bot.agent.subagent import SubagentCall
    from bub_bot.tape.jobs import Job
    from tests.schedule_harness import Clock

    clock = Clock()
    built = agent()
    channel = RuntimeChannel()
    runtime = Runtime(built.settings, store, built, {channel.name: channel}, clock=clock)
    tape = tape_of(runtime, "test:a")
    call = SubagentCall(
        id="sa-lost", prompt="long job", session="temp", allowed=[], model=None, depth=1,
        parent_tape=tape.name, parent_session="test:a", workspace=str(built.settings.workspace),
        origin={"session_id": "test:a", "channel": "test", "reply_target": {"chat": "a"}},
    )  # fmt: skip
    job = Job(
        id=call.id, kind=KIND, session_id="test:a", tape=tape.name,
        workspace=str(built.settings.workspace), channel="test", due=clock.now - 1,
        data={"call": call.to_json()},
    )  # fmt: skip
    assert await store.add_job(job)
    [fired] = await runtime.timer.fire_due()
    assert fired.entry is not None and fired.entry.meta["status"] == "lost"
    assert "did not report back" in fired.entry.payload["content"]
    assert await store.is_duplicate(result_key("sa-lost"))
    assert await store.jobs(kinds=[KIND]) == []
    await runtime.timer.stop()
