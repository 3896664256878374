"""A background subagent's result in a Slack thread (the fake Slack API, the real Bot): posted
once, in the thread that asked, as a message of its own after the parent's answer."""

from __future__ import annotations

import asyncio

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_api import FakeSlack, app_mention
from tests.runtime_channel import until
from tests.subagent_harness import Router
from tests.test_slack import sid, slack, start_bot

__all__ = ["slack", "start_bot"]  # fixtures, used by name


async def test_background_result_posted_once_in_the_thread(
    start_bot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    router = Router(child_delays=(0.3,))
    fake_openai.default = router
    bot = await start_bot()
    ts = slack.next_ts()
    status, _ = await bot.post(app_mention("C1", "U1", "look into it, in the background", ts))
    assert status == 200

    def texts() -> list[str]:
        return [p["text"] for p in slack.posts_in("C1", ts)]

    await until(lambda: len(texts()) >= 2, timeout=10)
    await bot.idle(sid("C1", ts))
    await asyncio.sleep(0.3)
    assert texts() == ["started it", "relay: child found 42"]
    assert router.child_calls == 1 and len(router.relayed) == 1
