"""Slack streaming under the per-channel posting limit: answers first, partial posts only
from spare budget, and dropped when their answer is ready.

The real outbox and stream (slack_sdk) against FakeSlack. A stream in a channel thread
without a recipient cannot stream natively, so it posts its partial text with
`chat.postMessage`, in the channel's window like the answers. To decide what is queued when,
a test holds the channel's window itself (a turn of the outbox's pacer) while it queues;
checks are on the order and number of calls the fake saw, never on times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bub_bot.config import Settings
from channels.slack_outbox import SlackOutbox
from channels.slack_stream import FIRST_DELAY, SlackStream
from tests.fakes.slack_api import FakeSlack

POST = "chat.postMessage"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
def outbox(slack: FakeSlack, settings: Callable[..., Settings]) -> SlackOutbox:
    conf = settings(slack_rate_channel="1/0.02s", slack_working_indicator="none")
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url, retry_handlers=[])
    return SlackOutbox(conf, client)


async def ready_to_post(outbox: SlackOutbox, thread: str) -> SlackStream:
    """A stream in channel C1's `thread` whose text is old enough to be posted."""
    stream = outbox.stream({"channel": "C1", "thread_ts": thread}, [])
    assert stream is not None
    assert await stream.update("Th") is False  # too new: a quick answer is just posted
    await asyncio.sleep(FIRST_DELAY + 0.05)
    return stream


async def queued() -> None:
    """Let every task started so far reach the pacer's queue."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_an_answer_is_posted_before_the_partial_posts_queued_ahead_of_it(
    outbox: SlackOutbox, slack: FakeSlack
) -> None:
    threads = [slack.next_ts() for _ in range(3)]
    streams = [await ready_to_post(outbox, t) for t in threads]
    answer_thread = slack.next_ts()
    async with outbox.pacer(POST).turn("C1"):  # the channel's window is in use
        partials = [asyncio.create_task(s.update("The answer so far")) for s in streams]
        await queued()
        answer = asyncio.create_task(
            outbox.send({"channel": "C1", "thread_ts": answer_thread}, "The answer")
        )
        await queued()
    await answer
    for stream in streams:
        stream.final_ready()
    await asyncio.gather(*partials)
    posts = slack.calls_to(POST)
    assert posts[0]["thread_ts"] == answer_thread and posts[0]["text"] == "The answer"
    assert all(p["text"] == "The answer so far" for p in posts[1:])


async def test_a_partial_post_not_made_when_its_answer_is_ready_is_dropped(
    outbox: SlackOutbox, slack: FakeSlack
) -> None:
    thread = slack.next_ts()
    stream = await ready_to_post(outbox, thread)
    target = {"channel": "C1", "thread_ts": thread}
    async with outbox.pacer(POST).turn("C1"):
        partial = asyncio.create_task(stream.update("The answer so f"))
        await queued()
        stream.final_ready()
        assert await partial is False  # nothing was shown
    assert await stream.deliver(0, "The answer so far.") is None  # no message holds it
    await outbox.send(target, "The answer so far.")
    assert await stream.end(1) == []
    assert [p["text"] for p in slack.posts_in("C1", thread)] == ["The answer so far."]
    assert outbox.pacer(POST).dropped == 1


async def test_a_partial_update_that_gets_a_429_is_skipped_not_waited_out(
    outbox: SlackOutbox, slack: FakeSlack
) -> None:
    thread = slack.next_ts()
    stream = await ready_to_post(outbox, thread)
    assert await stream.update("The answer") is True
    slack.fail_next("chat.update", status=429, retry_after=30)
    assert await stream.update("The answer so far") is False  # skipped at once
    assert len(slack.calls_to("chat.update")) == 1
    assert slack.visible("C1", thread) == ["The answer"]
