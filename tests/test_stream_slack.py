"""Streaming on Slack: real slack-bolt and slack_sdk against FakeSlack, the fake model
streaming slowly. Native streams in threads, `chat.postMessage` + `chat.update` where the
workspace cannot stream, the status naming the tools, long answers, and the final thread
equal to a non-streamed one."""

from __future__ import annotations

import itertools

from channels.slack_format import format_and_split
from tests.fakes.openai_server import FakeOpenAI, streamed, text, tool_calls
from tests.fakes.slack_api import FakeSlack, app_mention, dm_message
from tests.test_slack import StartBot, sid, slack, start_bot

__all__ = ["slack", "start_bot"]  # fixtures

ANSWER = (
    "Here is **the answer**, written slowly: streaming shows each part as soon as the model"
    " has written it, so nobody stares at a spinner for a minute."
)
[FINAL] = format_and_split(ANSWER)


async def test_native_stream_in_a_thread(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot(stream_interval_ms=200)
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="Let me look."), seconds=0.2),
        streamed(text(ANSWER), chunks=20, seconds=2.0),
    )
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "explain", ts))
    await bot.idle(sid("C1", ts))
    log = fake_openai.streams[-1]
    [(started_at, start)] = slack.timed_calls("chat.startStream")
    assert log.first < started_at < log.last
    assert start["thread_ts"] == ts and start["recipient_user_id"] == "U1"
    assert start["recipient_team_id"] == "T1"
    appends = slack.timed_calls("chat.appendStream")
    assert appends and all(b[0] - a[0] >= 0.2 * 0.9 for a, b in itertools.pairwise(appends))
    # What was streamed is the answer's Markdown, in order, each part once.
    streamed_text = start["markdown_text"] + "".join(p["markdown_text"] for _, p in appends)
    assert ANSWER.startswith(streamed_text)
    # Stopped, then made exactly what a non-streamed reply posts: one message in the thread.
    assert len(slack.calls_to("chat.stopStream")) == 1
    assert slack.visible("C1", ts) == [FINAL] and slack.posts == []
    # The status named the tool while it ran, alongside the usual indicator.
    assert "is using tape.info…" in [s["status"] for s in slack.statuses]


async def test_workspace_that_cannot_stream_gets_updates(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    slack.streaming_enabled = False  # e.g. the method is unknown or not allowed for this token
    bot = await start_bot(stream_interval_ms=200)
    for _ in range(2):
        fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=1.5))
        ts = slack.next_ts()
        await bot.post(app_mention("C1", "U1", "explain", ts))
        await bot.idle(sid("C1", ts))
        assert slack.visible("C1", ts) == [FINAL]
        assert len(slack.posts_in("C1", ts)) == 1
    assert len(slack.calls_to("chat.startStream")) == 1  # tried once for the workspace
    updates = slack.timed_calls("chat.update")
    assert len(updates) >= 2 and updates[-1][1]["text"] == FINAL


async def test_dm_top_level_posts_then_updates(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot(stream_interval_ms=200)
    fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=1.5))
    await bot.post(dm_message("D1", "U1", "explain", slack.next_ts()))
    await bot.idle(sid("D1"))
    assert slack.calls_to("chat.startStream") == []  # no thread at the top level of a DM
    assert slack.visible("D1") == [FINAL] and len(slack.posts_in("D1")) == 1


async def test_long_answer_continues_in_the_thread(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot(stream_interval_ms=100)
    paragraph = "A line of the long answer, with `code` & <angles>, that keeps going. " * 5
    long = "\n\n".join(f"{n}. {paragraph}" for n in range(30))
    pieces = format_and_split(long)
    assert len(pieces) >= 2
    fake_openai.script(streamed(text(long), chunks=20, seconds=1.5))
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "long", ts))
    await bot.idle(sid("C1", ts))
    assert slack.visible("C1", ts) == pieces  # the same thread as without streaming
    sent = [
        e.payload["data"]
        for e in await bot.entries(sid("C1", ts))
        if e.kind == "event" and e.payload["name"] == "reply.sent"
    ]
    assert [s["chunk"] for s in sent] == list(range(len(pieces)))


async def test_quick_answer_is_just_posted(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot()
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "hi", ts))
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == ["echo: hi"]
    assert slack.calls_to("chat.startStream") == [] and slack.calls_to("chat.update") == []


async def test_stream_off_is_todays_behaviour(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot(stream=False)
    fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=1.0))
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "explain", ts))
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == [FINAL]
    assert slack.calls_to("chat.startStream") == [] and slack.calls_to("chat.update") == []


async def test_restart_mid_stream_turns_the_streamed_message_into_the_answer(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    first = await start_bot(stream_interval_ms=100)
    fake_openai.script(streamed(text(ANSWER * 2), chunks=20, seconds=3.0))
    ts = slack.next_ts()
    await first.post(app_mention("C1", "U1", "explain", ts))
    await slack.wait_for(lambda: len(slack.calls_to("chat.appendStream")) >= 1)
    await first.bot.runtime.shutdown(grace=0)  # the process dies mid-stream
    [partial] = slack.visible("C1", ts)
    assert partial and partial != FINAL

    fake_openai.script(streamed(text(ANSWER), chunks=5, seconds=0.3))
    second = await start_bot(stream_interval_ms=100)
    await slack.wait_for(lambda: slack.visible("C1", ts) == [FINAL], timeout=10)
    await second.idle(sid("C1", ts))
    assert slack.visible("C1", ts) == [FINAL]  # one message: the streamed one, now the answer
    assert len(slack.calls_to("chat.startStream")) == 1
