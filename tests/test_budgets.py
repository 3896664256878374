"""Rate limits, budgets and /usage through the runtime: real SQLite, the fake model server,
an in-process channel, and a clock the tests move (calendar windows in BUB_TIMEZONE)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from bub_bot.agent import Origin
from bub_bot.budgets import Budgets, Payer
from bub_bot.runtime import Runtime
from bub_bot.tape import SQLiteTapeStore, Tape
from tests.fakes.openai_server import text, tool_calls
from tests.runtime_channel import RuntimeChannel, idle, inbound_users, tape_of

USED = {"prompt_tokens": 80, "completion_tokens": 30, "total_tokens": 110}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 10, 0, 5, tzinfo=UTC).timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def limited(store: SQLiteTapeStore, agent) -> AsyncIterator[Callable[..., Any]]:
    """`limited(**settings)` -> (runtime, channel, clock)."""
    made: list[Runtime] = []

    def make(**overrides: Any) -> tuple[Runtime, RuntimeChannel, Clock]:
        channel, clock = RuntimeChannel(), Clock()
        built = agent(None, **overrides)
        runtime = Runtime(built.settings, store, built, {channel.name: channel}, clock=clock)
        channel.runtime = runtime
        made.append(runtime)
        return runtime, channel, clock

    yield make
    for runtime in made:
        await runtime.shutdown(grace=2)


async def say(runtime: Runtime, channel: RuntimeChannel, text_: str, sender: str = "u1") -> None:
    await channel.say(text_, sender=sender)
    await idle(runtime, "test:a")


async def test_over_the_message_rate_one_note_per_window_and_no_model_call(
    limited, fake_openai
) -> None:
    runtime, channel, clock = limited(limit_user="2/min")
    for n in range(5):
        await say(runtime, channel, f"m{n}")
    await say(runtime, channel, "from u2", sender="u2")  # another person is not limited
    texts = channel.texts("a")
    assert texts[:2] == ["echo: m0", "echo: m1"]
    notes = [t for t in texts if "faster than this bot allows" in t]
    assert len(notes) == 1 and "You can write again at 10:01 UTC" in notes[0]
    assert texts[-1] == "echo: from u2"
    assert len(fake_openai.completion_requests()) == 3
    stored = await inbound_users(tape_of(runtime, "test:a"))
    assert [bool(e.meta.get("refused")) for e in stored] == [False, False, True, True, True, False]
    # nothing refused ever reaches the model, also in later turns
    assert all("m2" not in str(r.body) for r in fake_openai.completion_requests())
    await say(runtime, channel, "/usage")
    assert "Messages this minute: 5 of 2" in channel.texts("a")[-1]  # commands do not count
    clock.now += 60  # the next minute: u1 may write again
    await say(runtime, channel, "later")
    assert channel.texts("a")[-1] == "echo: later"
    assert "m3" not in str(fake_openai.completion_requests()[-1].body)


async def test_a_conversation_rate_and_a_workspace_rule(limited, fake_openai, tmp_path) -> None:
    rules = tmp_path / "map.json"
    rule = {"match": "test:*", "path": str(tmp_path), "limits": {"conversation": "1/hour"}}
    rules.write_text(json.dumps({"workspaces": [rule]}))
    runtime, channel, _ = limited(limit_conversation="50/min", workspace_map=rules)
    await say(runtime, channel, "one")
    await say(runtime, channel, "two", sender="u2")
    await say(runtime, channel, "three", sender="u3")
    texts = channel.texts("a")
    assert texts[0] == "echo: one"
    assert len(texts) == 2 and texts[1].startswith("This conversation is sending")
    assert len(fake_openai.completion_requests()) == 1


async def test_a_token_budget_stops_the_next_call_after_the_one_that_crossed_it(
    limited, fake_openai
) -> None:
    runtime, channel, clock = limited(budget_user="100/day")
    # The first step crosses the budget (110 tokens): the turn stops before the next call.
    fake_openai.script(tool_calls([("tape_info", {})], usage=USED), text("never"))
    await say(runtime, channel, "look")
    assert len(fake_openai.completion_requests()) == 1
    assert "Your daily budget (100 tokens/day) is used up" in channel.texts("a")[-1]
    assert "resets tomorrow at 00:00 UTC" in channel.texts("a")[-1]
    await say(runtime, channel, "again")
    assert len(fake_openai.completion_requests()) == 1
    await say(runtime, channel, "me too", sender="u2")  # another person has a budget of their own
    assert len(fake_openai.completion_requests()) == 2
    clock.now += 86400  # tomorrow
    await say(runtime, channel, "next day")
    assert channel.texts("a")[-1] == "echo: next day"


async def test_admins_are_exempt_from_user_budgets_not_the_total(limited, fake_openai) -> None:
    runtime, channel, _ = limited(budget_user="100/day", budget_total="300/day", admins="test:boss")
    for n in range(4):
        fake_openai.script(text(f"ok{n}", usage=USED))
        await say(runtime, channel, f"q{n}", sender="boss")
    # 110, 220, 330: the fourth call is refused by the total
    assert len(fake_openai.completion_requests()) == 3
    assert "The bot's daily budget (300 tokens/day) is used up" in channel.texts("a")[-1]


async def test_money_budget_and_usage_output(limited, fake_openai) -> None:
    runtime, channel, _ = limited(
        model_prices="fake-model=1000/2000",  # a token in: $0.001, out: $0.002
        budget_user="$0.50/day",
        admins="test:boss",
    )
    fake_openai.script(text("priced", usage=USED))  # 80*1000 + 30*2000 = 140000 µ$
    await say(runtime, channel, "hi")
    await say(runtime, channel, "/usage")
    report = channel.texts("a")[-1]
    assert "You (test:u1):" in report
    assert "Today: 1 message, 110 tokens (80 in, 30 out), $0.14" in report  # not /usage
    assert "Left today: $0.36 of $0.50/day" in report
    assert "This conversation:" in report
    await say(runtime, channel, "/usage all")
    assert channel.texts("a")[-1].startswith("Only admins (BUB_ADMINS)")
    await say(runtime, channel, "/usage all", sender="boss")
    everyone = channel.texts("a")[-1]
    assert "Top people this month:" in everyone and "test:u1: 1 message," in everyone
    assert "fake-model: 0 messages, 110 tokens" in everyone
    await say(runtime, channel, "/usage everything")
    assert channel.texts("a")[-1].startswith("usage takes nothing or all. Usage: /usage")


async def test_estimated_when_the_provider_reports_no_usage(limited, fake_openai) -> None:
    runtime, channel, _ = limited()
    fake_openai.script(text("no usage here", usage={"id": "x"}))
    await say(runtime, channel, "hello")
    await say(runtime, channel, "/usage")
    report = channel.texts("a")[-1]
    assert "tokens estimated: the model server reported no usage" in report
    today = (await runtime.budgets.rows(["u:test:u1"]))["u:test:u1"][0]
    assert today.tokens > 0 and today.estimated == today.tokens


async def test_handoff_summary_counts_for_who_asked(limited, fake_openai) -> None:
    runtime, channel, _ = limited()
    await say(runtime, channel, "hello")
    fake_openai.script(text("- a summary", usage=USED))
    await say(runtime, channel, "/handoff", sender="u2")
    found = await runtime.budgets.rows(["u:test:u2", "c:test:a"])
    assert found["u:test:u2"][0].tokens == 110
    assert found["c:test:a"][0].tokens > 110  # the first turn's and the summary's


async def test_scheduled_and_subagent_turns_count_for_their_payer(
    store: SQLiteTapeStore, agent, workspace
) -> None:
    built = agent()
    built.budgets = Budgets.for_settings(store, built.settings)
    tape = Tape.for_session(store, "test:a", workspace)
    await tape.append_message({"role": "user", "content": "[Scheduled job j1] ping"})
    job = Origin(session_id="test:a", channel="test", sender={"id": "creator"}, via="schedule")
    await built.run_turn(tape, origin=job)
    sub = Origin(
        session_id="test:a",
        channel="test",
        sender={"id": "creator"},
        payer=Payer("test:parent", "slack:U9", "slack").to_json(),
    )
    await built.run_turn(tape, origin=sub)
    rows = await built.budgets.rows(["u:test:creator", "u:slack:U9", "c:test:parent", "t"])
    assert rows["u:test:creator"][0].tokens > 0
    assert rows["u:slack:U9"][0].tokens > 0 and rows["c:test:parent"][0].tokens > 0
    total = rows["t"][0].tokens
    assert total == rows["u:test:creator"][0].tokens + rows["u:slack:U9"][0].tokens
    # a restart (a new Budgets on the same database) sees the same counters
    again = Budgets.for_settings(store, built.settings)
    assert (await again.rows(["t"]))["t"][0].tokens == total


async def test_no_handoff_summary_when_the_askers_budget_is_spent(limited, fake_openai) -> None:
    runtime, channel, _ = limited(budget_user="100/day")
    fake_openai.script(text("answer", usage=USED))
    await say(runtime, channel, "hello")
    await say(runtime, channel, "/handoff")
    assert channel.texts("a")[-1] == (
        "Handed off (handoff). No summary was written: your daily budget (100 tokens/day) is"
        " used up."
    )
    assert len(fake_openai.completion_requests()) == 1


async def test_a_real_subagents_calls_count_once_for_the_person_who_asked(
    store: SQLiteTapeStore, agent, workspace, fake_openai
) -> None:
    """The `subagent` tool's child turn is charged to the parent turn's person and
    conversation, each model call once (the parent's turn usage, which includes the
    child's, is not charged again)."""
    from bub_bot.agent import default_registry
    from bub_bot.agent.subagent import Subagents, register_subagent_tool

    registry = default_registry()
    built = agent(registry)
    register_subagent_tool(registry, Subagents(built))
    built.budgets = Budgets.for_settings(store, built.settings)
    tape = Tape.for_session(store, "test:a", workspace)
    await tape.append_message({"role": "user", "content": "research llamas"})
    fake_openai.script(
        tool_calls([("subagent", {"prompt": "summarise llamas"})], usage=USED),
        text("llamas are camelids", usage=USED),
        text("done", usage=USED),
    )
    asker = Origin(session_id="test:a", channel="test", sender={"id": "u1"})
    result = await built.run_turn(tape, origin=asker)
    assert result.reply == "done"
    rows = await built.budgets.rows(["u:test:u1", "c:test:a", "t"])
    assert rows["u:test:u1"][0].tokens == 3 * 110
    assert rows["c:test:a"][0].tokens == 3 * 110 and rows["t"][0].tokens == 3 * 110
