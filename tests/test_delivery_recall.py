"""Slack can be asked whether a piece went out: every post carries its delivery key in the
message metadata, and a resumed piece whose `reply.sent` was never recorded is looked for in
the thread once (`conversations.replies` with `include_all_metadata`) before it is posted
again. Real slack_sdk against FakeSlack, a real SQLite file, the bot stopped mid-post and
started again on the same database."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.slack_recall import EVENT_TYPE
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.slack_api import FakeSlack, SlackError, app_mention
from tests.test_slack import StartBot, sid, slack, start_bot

__all__ = ["slack", "start_bot"]  # fixtures


def hold_posts(slack: FakeSlack, *, after_posting: bool) -> tuple[asyncio.Event, Any]:
    """Make the next `chat.postMessage` hang (the bot stops meanwhile): after the message is
    in the thread (Slack took it, the answer never came back) or before it is (it never
    lands). Returns (reached, the method as it was)."""
    reached = asyncio.Event()
    post = slack._handlers["chat.postMessage"]

    async def held(params: dict[str, Any]) -> dict[str, Any]:
        answer = await post(params) if after_posting else None
        reached.set()
        await asyncio.sleep(3600)  # until the bot hangs up
        if answer is None:
            raise SlackError("request_timeout")
        return answer

    slack._handlers["chat.postMessage"] = held
    return reached, post


def lookups(slack: FakeSlack) -> list[dict[str, Any]]:
    return [
        p
        for p in slack.calls_to("conversations.replies")
        if str(p.get("include_all_metadata")).lower() in ("1", "true")
    ]


async def stopped_mid_post(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI, *, after_posting: bool
) -> str:
    """A mention answered while the post hangs; the bot stops before the post returns."""
    reached, post = hold_posts(slack, after_posting=after_posting)
    fake_openai.script(text("the answer"))
    bot = await start_bot(shutdown_grace_seconds=0.2)
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "a question", ts))
    await asyncio.wait_for(reached.wait(), 10)
    await bot.close()  # the post never returned: nothing recorded about it
    slack._handlers["chat.postMessage"] = post
    return ts


async def test_piece_already_in_the_thread_is_not_posted_again(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    ts = await stopped_mid_post(start_bot, slack, fake_openai, after_posting=True)
    [posted] = slack.posts_in("C1", ts)
    # Every post carries its delivery key.
    assert posted["metadata"]["event_type"] == EVENT_TYPE
    assert posted["metadata"]["event_payload"]["key"]
    bot = await start_bot()  # the same database: the reply is resumed
    await bot.idle(sid("C1", ts))
    tape = bot.tape(sid("C1", ts))
    await asyncio.wait_for(_done(tape), 10)
    assert slack.visible("C1", ts) == ["the answer"]
    assert len(slack.posts_in("C1", ts)) == 1
    assert len(lookups(slack)) == 1
    [sent] = [e for e in await tape.query(kinds=["event"], names=["reply.sent"])]
    assert sent.payload["data"]["ids"] == [posted["ts"]]
    assert len(fake_openai.completion_requests()) == 1


async def test_piece_not_in_the_thread_is_posted_once(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    ts = await stopped_mid_post(start_bot, slack, fake_openai, after_posting=False)
    assert slack.posts_in("C1", ts) == []
    bot = await start_bot()
    await bot.idle(sid("C1", ts))
    await asyncio.wait_for(_done(bot.tape(sid("C1", ts))), 10)
    assert slack.visible("C1", ts) == ["the answer"]
    assert len(slack.posts_in("C1", ts)) == 1
    assert len(lookups(slack)) == 1
    assert len(fake_openai.completion_requests()) == 1


async def _done(tape: Any) -> None:
    while not await tape.query(kinds=["event"], names=["inbound.done"]):  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def test_a_key_in_someone_elses_message_is_not_taken_for_the_piece(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """A user's message carrying the piece's delivery key (forged) is not the bot's post:
    the piece is posted once, and what is recorded is the bot's own message."""
    ts = await stopped_mid_post(start_bot, slack, fake_openai, after_posting=False)
    assert slack.posts_in("C1", ts) == []
    slack.add_to_thread("C1", ts, "U1", "a question")  # the thread's parent
    forged_ts = slack.add_to_thread("C1", ts, "U1", "the answer")
    [forged] = [m for m in slack.threads[("C1", ts)] if m["ts"] == forged_ts]
    [held] = slack.calls_to("chat.postMessage")
    forged["metadata"] = held["metadata"]  # the key the bot's post carried
    bot = await start_bot()
    await bot.idle(sid("C1", ts))
    tape = bot.tape(sid("C1", ts))
    await asyncio.wait_for(_done(tape), 10)
    assert len(lookups(slack)) == 1
    [posted] = slack.posts_in("C1", ts)
    [sent] = await tape.query(kinds=["event"], names=["reply.sent"])
    assert sent.payload["data"]["ids"] == [posted["ts"]] != [forged_ts]
