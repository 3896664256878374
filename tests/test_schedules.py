"""Schedules through the runtime, in process, with a clock the test moves: the model adds a
job with the schedule.* tools, it fires once into its conversation at its time, /schedules
and /unschedule, the limits, bad input refused with nothing stored, runs missed while the
bot was down (late, folded, dropped), a recurring job across a DST change, and the store's
job rows on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from bub_bot.agent.schedule_tools import register_schedule_tools
from bub_bot.runtime import Runtime
from bub_bot.schedules.kinds import job_key
from bub_bot.schedules.times import utc_iso
from bub_bot.tape import SQLiteTapeStore, Tape, TapeEntry, TapeStore
from bub_bot.tape.jobs import Firing, Job
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.runtime_channel import RuntimeChannel, events, idle, tape_of
from tests.schedule_harness import Clock, add_call, last_result, scheduled, tool_results

Bot = tuple[Runtime, RuntimeChannel, Clock]


@pytest.fixture
async def bot(store: SQLiteTapeStore, agent: Callable[..., Any]) -> AsyncIterator[Any]:
    """`bot(clock=None, **settings)`: a started runtime with the schedule tools, a test
    channel and the clock it fires by."""
    made: list[Runtime] = []

    async def make(clock: Clock | None = None, **overrides: Any) -> Bot:
        clock = clock or Clock()
        built = agent(**overrides)
        channel = RuntimeChannel()
        runtime = Runtime(built.settings, store, built, {channel.name: channel}, clock=clock)
        register_schedule_tools(built.tools, runtime.schedules)
        channel.runtime = runtime
        await runtime.start()
        made.append(runtime)
        return runtime, channel, clock

    yield make
    for runtime in made:
        await runtime.shutdown(grace=2)


async def schedule(
    runtime: Runtime, channel: RuntimeChannel, fake: FakeOpenAI, chat: str = "a", **args: Any
) -> Any:
    """Ask in `chat`; the model calls schedule.add(**args); returns the tool's result."""
    fake.script(add_call(**args), text("noted"))
    await channel.say("please schedule it", chat)
    await idle(runtime, f"test:{chat}")
    return last_result(fake)


async def move(runtime: Runtime, clock: Clock, seconds: float) -> None:
    """Time passes; the timer is told (it sleeps by the real clock)."""
    clock.advance(seconds)
    runtime.timer.poke()


# -- a job's life -------------------------------------------------------------------------------


async def test_a_one_off_job_fires_once_into_its_conversation(bot, fake_openai: FakeOpenAI) -> None:
    runtime, channel, clock = await bot()
    added = await schedule(
        runtime, channel, fake_openai, prompt="Tell me to call Ann", in_seconds=120
    )
    assert channel.texts("a") == ["noted"]
    [job] = await runtime.store.jobs()
    assert added["id"] == job.id and job.due == clock.now + 120 and job.cron is None
    assert job.data["reply_target"] == {"chat": "a"} and job.data["sender"]["id"] == "u1"

    clock.advance(119)
    assert await runtime.timer.fire_due() == []  # not yet
    await move(runtime, clock, 1.5)
    await channel.wait_sent("a", 2)
    prefix = f"[Scheduled job {job.id}, due "
    assert channel.texts("a")[1].startswith(f"echo: {prefix}")
    assert channel.texts("a")[1].endswith("]\nTell me to call Ann")
    tape = tape_of(runtime, "test:a")
    [entry] = await scheduled(tape)
    assert entry.meta["inbound"] and entry.meta["job"] == job.id
    assert entry.meta["due"] == utc_iso(job.due) and entry.meta["channel"] == "test"
    assert entry.meta["sender"] == {"id": "u1", "name": "U1"}  # the creator: budgets charge them
    assert entry.meta["reply_target"] == {"chat": "a"}
    assert "late_seconds" not in entry.meta
    assert await runtime.store.is_duplicate(job_key(job.id, job.due))
    assert fake_openai.last_messages()[-1]["content"].startswith(prefix)

    # Done: the row is gone, and nothing fires again however much time passes.
    assert await runtime.store.jobs() == []
    await move(runtime, clock, 3600)
    assert await runtime.timer.fire_due() == []
    await idle(runtime, "test:a")
    assert len(channel.texts("a")) == 2 and len(await scheduled(tape)) == 1


async def test_a_recurring_job_follows_its_zone_across_the_dst_change(
    bot, fake_openai: FakeOpenAI
) -> None:
    start = datetime(2025, 3, 28, 12, 0, tzinfo=UTC).timestamp()  # Friday, CET
    runtime, channel, clock = await bot(Clock(start))
    added = await schedule(
        runtime, channel, fake_openai, prompt="Post the open incidents", cron="0 9 * * *",
        tz="Europe/Berlin",
    )  # fmt: skip
    assert added["next_run"] == "2025-03-29 09:00 CET"
    assert "(cron '0 9 * * *', Europe/Berlin)" in added["schedule"]
    [job] = await runtime.store.jobs()
    for fired in range(3):
        (row,) = await runtime.store.jobs()
        await move(runtime, clock, row.due - clock.now)
        await channel.wait_sent("a", 2 + fired)  # "noted", then one answer per run
    dues = [e.meta["due"][:16] for e in await scheduled(tape_of(runtime, "test:a"))]
    # 09:00 local: 08:00 UTC in CET, 07:00 UTC from the night of 30 March (CEST).
    assert dues == ["2025-03-29T08:00", "2025-03-30T07:00", "2025-03-31T07:00"]
    [row] = await runtime.store.jobs()
    assert row.id == job.id and row.fired == 3 and utc_iso(row.due).startswith("2025-04-01T07:00")


async def test_schedules_and_unschedule_commands(bot, fake_openai: FakeOpenAI) -> None:
    runtime, channel, _clock = await bot()
    one = await schedule(
        runtime,
        channel,
        fake_openai,
        prompt="Weekly report",
        cron="0 10 * * 1",
        tz="America/New_York",
    )
    two = await schedule(runtime, channel, fake_openai, prompt="Check the deploy", in_seconds=1200)
    other = await schedule(
        runtime, channel, fake_openai, chat="b", prompt="Other chat", in_seconds=60
    )

    await channel.say("/schedules")
    await idle(runtime, "test:a")
    listing = channel.texts("a")[-1]
    assert listing.startswith("Scheduled jobs (2)")
    assert listing.index(two["id"]) < listing.index(one["id"])  # soonest first
    assert (
        one["next_run"] in listing and "Weekly report" in listing and "America/New_York" in listing
    )
    assert other["id"] not in listing

    # Only this conversation's jobs: chat b's id is unknown here, by command and by tool.
    await channel.say(f"/unschedule {other['id']}")
    await idle(runtime, "test:a")
    assert (
        channel.texts("a")[-1]
        == f"This conversation has no scheduled job {other['id']}. See /schedules."
    )
    fake_openai.script(tool_calls([("schedule_remove", {"id": other["id"]})]), text("ok"))
    await channel.say("remove the other chat's job")
    await idle(runtime, "test:a")
    assert "no scheduled job" in tool_results(fake_openai)[-1]
    assert len(await runtime.store.jobs()) == 3

    await channel.say(f"/unschedule {one['id']}")
    await idle(runtime, "test:a")
    assert channel.texts("a")[-1] == f"Removed scheduled job {one['id']}: Weekly report"
    fake_openai.script(tool_calls([("schedule_list", {})]), text("ok"))
    await channel.say("what is scheduled?")
    await idle(runtime, "test:a")
    assert [j["id"] for j in last_result(fake_openai)["jobs"]] == [two["id"]]

    for line, usage in (("/unschedule", "/unschedule <id>"), ("/schedules now", "/schedules —")):
        await channel.say(line)
        await idle(runtime, "test:a")
        assert usage in channel.texts("a")[-1]
    await channel.say("/help")
    await idle(runtime, "test:a")
    assert "/schedules" in channel.texts("a")[-1] and "/unschedule <id>" in channel.texts("a")[-1]
    await channel.say("/schedules", "c")
    await idle(runtime, "test:c")
    assert channel.texts("c") == ["No scheduled jobs in this conversation."]


async def test_limits_per_conversation_and_between_runs(bot, fake_openai: FakeOpenAI) -> None:
    runtime, channel, _clock = await bot(schedule_max_per_session=2)
    for n in range(2):
        assert "id" in await schedule(
            runtime, channel, fake_openai, prompt=f"job {n}", in_seconds=60
        )
    refused = await schedule(runtime, channel, fake_openai, prompt="one more", in_seconds=60)
    assert refused.startswith("error: this conversation has 2 scheduled jobs already")
    assert "nothing was scheduled" in refused
    # Another conversation has its own limit.
    assert "id" in await schedule(
        runtime, channel, fake_openai, chat="b", prompt="b", in_seconds=60
    )
    often = await schedule(runtime, channel, fake_openai, chat="b", prompt="x", cron="*/4 * * * *")
    assert often.startswith(
        "error: cron '*/4 * * * *' runs 4 min apart; recurring jobs here must be at least 5 min apart"
    )
    assert len(await runtime.store.jobs()) == 3


async def test_the_operator_sets_the_limits(bot, fake_openai: FakeOpenAI) -> None:
    runtime, channel, _clock = await bot(
        schedule_max_per_session=0, schedule_min_interval_seconds=60
    )
    refused = await schedule(runtime, channel, fake_openai, prompt="x", cron="* * * * *")
    assert refused.startswith("error: scheduled jobs are turned off on this bot")
    assert await runtime.store.jobs() == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"at": "next tuesday 9ish"}, "is not an ISO 8601 time"),
        ({"at": "2001-09-09T01:46:40Z"}, "is in the past"),
        ({"in_seconds": 60, "tz": "Moon/Tranquility"}, "unknown time zone 'Moon/Tranquility'"),
        ({"cron": "0 12 30 2 *"}, "never fires"),
        ({"cron": "0 25 * * *"}, "bad hour"),
        ({"in_seconds": 60, "cron": "0 9 * * *"}, "exactly one of at, in_seconds or cron"),
        ({}, "exactly one of at, in_seconds or cron (got none)"),
        ({"in_seconds": -5}, "in_seconds must be at least 1"),
        ({"in_seconds": 60, "prompt": "   "}, "prompt is empty"),
        ({"in_seconds": 60, "prompt": "x" * 4001}, "at most 4000"),
        ({"in_seconds": "soon"}, "invalid arguments for schedule_add: in_seconds"),
    ],
)
async def test_bad_input_is_an_error_result_and_nothing_is_stored(
    bot, fake_openai: FakeOpenAI, args: dict[str, Any], says: str
) -> None:
    runtime, channel, _clock = await bot()
    result = await schedule(runtime, channel, fake_openai, **{"prompt": "Do it", **args})
    assert result.startswith("error: ") and says in result
    assert await runtime.store.jobs() == []
    assert channel.texts("a") == ["noted"]  # the turn went on: the model read the error


# -- runs missed while the bot was down -------------------------------------------------------


async def test_a_late_recurring_job_runs_once_for_every_time_it_missed(
    bot, fake_openai: FakeOpenAI
) -> None:
    start = datetime(2025, 6, 2, 12, 0, tzinfo=UTC).timestamp()  # a Monday
    runtime, channel, clock = await bot(Clock(start))
    await schedule(
        runtime, channel, fake_openai, prompt="Standup notes", cron="0 9 * * *", tz="Europe/Berlin"
    )
    [job] = await runtime.store.jobs()
    # The timer was not running from before the first run until three days and 2 h after it
    # (simulated: the clock jumps, as it does for a process that starts again).
    clock.advance(job.due - clock.now + 3 * 86400 + 2 * 3600)
    fired = await runtime.timer.fire_due()
    assert len(fired) == 1 and fired[0].entry is not None
    await channel.wait_sent("a", 2)
    [entry] = await scheduled(tape_of(runtime, "test:a"))
    assert entry.meta["due"] == utc_iso(job.due + 3 * 86400)  # the latest one missed
    assert entry.meta["late_seconds"] == 7200 and entry.meta["missed"] == 3
    content = entry.payload["content"]
    assert "running 2 h late: the bot was not running at the time" in content
    assert "3 earlier runs were missed meanwhile and not repeated" in content
    [row] = await runtime.store.jobs()
    assert row.due == job.due + 4 * 86400  # goes on tomorrow at 09:00
    assert await runtime.timer.fire_due() == []


async def test_a_job_later_than_the_drop_limit_leaves_a_note_and_no_turn(
    bot, fake_openai: FakeOpenAI
) -> None:
    runtime, channel, clock = await bot(schedule_drop_seconds=86400)
    await schedule(runtime, channel, fake_openai, prompt="Lunch reminder", in_seconds=600)
    [once] = await runtime.store.jobs()
    asked = len(fake_openai.completion_requests())
    clock.advance(2 * 86400)
    fired = await runtime.timer.fire_due()
    assert [f.job.id for f in fired] == [once.id]
    await channel.wait_sent("a", 2)
    note = channel.texts("a")[-1]
    assert note.startswith(f"A scheduled job ({once.id}) was due at ")
    assert note.endswith("while I was not running; it is 1 d 23 h late, so I skipped it.")
    await idle(runtime, "test:a")
    assert len(fake_openai.completion_requests()) == asked  # no model call
    tape = tape_of(runtime, "test:a")
    assert await scheduled(tape) == []
    [notice] = await events(tape, "schedule.notice")
    assert notice.meta["job"] == once.id and notice.meta["dropped"] is True
    assert await runtime.store.jobs() == []

    # A recurring job goes on: its latest missed run is recent, so it runs (once).
    await schedule(runtime, channel, fake_openai, prompt="Hourly check", cron="0 * * * *")
    clock.advance(2 * 86400)
    [fired] = await runtime.timer.fire_due()
    await channel.wait_sent("a", 4)
    assert "earlier runs were missed meanwhile and not repeated" in channel.texts("a")[-1]
    assert len(await runtime.store.jobs()) == 1


async def test_a_scheduled_turn_cannot_start_a_fast_chain_of_jobs(
    bot, fake_openai: FakeOpenAI
) -> None:
    runtime, channel, clock = await bot()
    await schedule(runtime, channel, fake_openai, prompt="check again soon", in_seconds=60)
    fake_openai.script(
        add_call(prompt="again", in_seconds=10),
        add_call(prompt="later", in_seconds=900),
        text("done"),
    )
    await move(runtime, clock, 61)
    await channel.wait_sent("a", 2)
    results = tool_results(fake_openai)
    assert "a scheduled run may schedule a one-off job at least 5 min ahead" in results[-2]
    assert json.loads(results[-1])["prompt"] == "later"
    assert [j.data["prompt"] for j in await runtime.store.jobs()] == ["later"]


# -- the store's rows (both stores) -----------------------------------------------------------


def job(**fields: Any) -> Job:
    values: dict[str, Any] = {
        "id": "j1",
        "kind": "prompt",
        "session_id": "test:a",
        "tape": "tape-a",
        "workspace": "/ws",
        "channel": "test",
        "due": 1000.0,
    }
    values.update(fields)
    return Job(**values)


async def test_job_rows_add_list_remove_and_limit(any_store: TapeStore) -> None:
    assert await any_store.add_job(job(), limit=2)
    assert await any_store.add_job(job(id="j2", due=500.0, cron="0 9 * * *", data={"x": [1]}))
    assert not await any_store.add_job(job(id="j3"), limit=2)
    assert await any_store.add_job(job(id="j4", kind="approval.expiry"), limit=2)
    assert [j.id for j in await any_store.jobs()] == ["j2", "j1", "j4"]
    assert [j.id for j in await any_store.jobs(session_id="test:a", kinds=["prompt"])] == [
        "j2",
        "j1",
    ]
    assert (await any_store.jobs(kinds=["prompt"], limit=1))[0].data == {"x": [1]}
    assert await any_store.next_due(kinds=["prompt"], channels=["test"]) == 500.0
    assert await any_store.next_due(kinds=["prompt"], channels=["slack"]) is None
    assert await any_store.remove_job("j4", kinds=["prompt"]) is None  # not a kind it may
    assert await any_store.remove_job("j1", session_id="test:b") is None
    removed = await any_store.remove_job("j1", session_id="test:a", kinds=["prompt"])
    assert removed == job()
    assert [j.id for j in await any_store.jobs()] == ["j2", "j4"]


async def test_fire_jobs_writes_the_entry_and_advances_the_job_in_one_transaction(
    any_store: TapeStore,
) -> None:
    await any_store.add_job(job())
    await any_store.add_job(job(id="j2", cron="x", due=1000.0))
    await any_store.add_job(job(id="later", due=5000.0))
    await any_store.add_job(job(id="elsewhere", channel="slack", due=10.0))
    await any_store.add_job(job(id="unknown", kind="newer.kind", due=10.0))
    tape = Tape(any_store, "tape-a", "test:a")
    # A firing whose key was recorded already (e.g. written before a crash) writes nothing.
    await any_store.append_many("tape-a", [TapeEntry.event("earlier")], dedupe_keys=["job:j2:dup"])

    def decide(row: Job) -> Firing:
        entry = TapeEntry.message({"role": "user", "content": row.id}, inbound=True)
        key = "job:j2:dup" if row.id == "j2" else f"job:{row.id}:{row.due}"
        following = row.due + 60 if row.id == "j2" else None
        return Firing(entry, (key,), Tape.bootstrap_anchor("/ws"), following)

    fired = await any_store.fire_jobs(2000.0, decide, kinds=["prompt"], channels=["test"])
    assert sorted(f.job.id for f in fired) == ["j1", "j2"]
    written = {f.job.id: f.entry for f in fired}
    assert written["j2"] is None  # its key was recorded: nothing written, still advanced
    assert written["j1"] is not None and written["j1"].payload["content"] == "j1"
    assert await any_store.is_duplicate("job:j1:1000.0")
    assert [e.payload.get("content") for e in await tape.query(kinds=["message"])] == ["j1"]
    left = {j.id: j for j in await any_store.jobs()}
    assert set(left) == {"j2", "later", "elsewhere", "unknown"}  # j1 finished
    assert left["j2"].due == 1060.0 and left["j2"].fired == 1
    assert await any_store.fire_jobs(1059.0, decide, kinds=["prompt"], channels=["test"]) == []
