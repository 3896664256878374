"""Slack's send limits: chat.postMessage paced per channel (BUB_SLACK_RATE_CHANNEL), a 429
holding every call of the method for its Retry-After. Real slack-bolt against FakeSlack.

Times checked are lower bounds (a post never arrives before its window allows), which a slow
machine can only make easier to meet.
"""

from __future__ import annotations

import itertools

import tests.test_slack as slack_tests
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.slack_api import FakeSlack, app_mention
from tests.test_slack import LONG_ANSWER, StartBot, sid

# The Slack channel tests' fixtures, shared (assigned, not imported, so they are not re-bound).
slack = slack_tests.slack
start_bot = slack_tests.start_bot


async def test_posts_to_a_channel_are_paced_and_other_channels_go_between(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    window = 0.2
    fake_openai.script(text(LONG_ANSWER), text(LONG_ANSWER))
    bot = await start_bot(slack_rate_channel=f"1/{window}s")
    threads = {}
    for channel in ("C1", "C2"):
        threads[channel] = slack.next_ts()
        await bot.post(app_mention(channel, "U1", "long one", threads[channel]))
    for channel, ts in threads.items():
        await bot.idle(sid(channel, ts))
    posts = slack.timed_calls("chat.postMessage")
    by_channel = {c: [t for t, p in posts if p["channel"] == c] for c in threads}
    for channel, times in by_channel.items():
        assert len(times) >= 2 and len(slack.posts_in(channel, threads[channel])) == len(times)
        for before, after in itertools.pairwise(times):
            assert after - before >= window
    # The second channel did not wait for the first one's answer to be complete.
    assert by_channel["C2"][0] < by_channel["C1"][-1]


async def test_a_429_holds_every_post_for_its_retry_after(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot(slack_rate_channel="1/0.05s")
    slack.fail_next("chat.postMessage", status=429, retry_after=1)
    first, second = slack.next_ts(), slack.next_ts()
    await bot.post(app_mention("C1", "U1", "first", first))
    await slack.wait_for(lambda: len(slack.calls_to("chat.postMessage")) == 1)
    await bot.post(app_mention("C2", "U1", "second", second))
    await bot.idle(sid("C1", first))
    await bot.idle(sid("C2", second))
    [(refused_at, _), *later] = slack.timed_calls("chat.postMessage")
    assert len(later) == 2
    # Slack's limits are per method: the other channel waited too.
    assert all(at >= refused_at + 1.0 for at, _ in later)
    assert [p["text"] for p in slack.posts_in("C1", first)] == ["echo: first"]
    assert [p["text"] for p in slack.posts_in("C2", second)] == ["echo: second"]
