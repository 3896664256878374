"""A bot first mentioned in the middle of a Slack thread reads the thread once
(conversations.replies, paged, capped by BUB_SLACK_THREAD_HISTORY) and puts it on the new tape
before the mention; later mentions in that thread read nothing."""

from __future__ import annotations

from tests import test_slack
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_api import FakeSlack, app_mention

slack = test_slack.slack  # the Slack harness's fixtures
start_bot = test_slack.start_bot
sid = test_slack.sid
StartBot = test_slack.StartBot


async def test_first_mention_mid_thread_brings_the_thread_once(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot(slack_thread_history=4)
    root = slack.next_ts()
    slack.add_to_thread("C1", root, "U1", "the deploy failed again")
    slack.add_to_thread("C1", root, "U2", "which service?")
    slack.add_to_thread("C1", root, "U1", "billing, at 09:12")
    slack.add_to_thread("C1", root, "UBOT", "an old answer of mine", bot_id="BBOT")
    slack.add_to_thread("C1", root, "U2", "logs say OOM")
    mention = slack.next_ts()
    await bot.post(app_mention("C1", "U3", "what happened here?", mention, thread_ts=root))
    await bot.idle(sid("C1", root))
    sent = fake_openai.last_messages()
    # The newest 4 before the mention, oldest first, attributed; the bot's own as assistant.
    assert [m for m in sent if m["role"] != "system"] == [
        {"role": "user", "content": "[U2]: which service?"},
        {"role": "user", "content": "[U1]: billing, at 09:12"},
        {"role": "assistant", "content": "an old answer of mine"},
        {"role": "user", "content": "[U2]: logs say OOM"},
        {"role": "user", "content": "what happened here?"},
    ]
    # Paged: limit 5 per call over 5 messages (+ the mention is not in the fake's thread).
    calls = slack.calls_to("conversations.replies")
    assert len(calls) == 1 and calls[0]["ts"] == root
    stored = await bot.tape(sid("C1", root)).query(kinds=["message"])
    assert [e.meta.get("history", False) for e in stored][:4] == [True] * 4
    # A second mention in the same thread: the tape is the history now, no call.
    slack.add_to_thread("C1", root, "U2", "said while the bot was not mentioned")
    await bot.post(app_mention("C1", "U3", "and now?", slack.next_ts(), thread_ts=root))
    await bot.idle(sid("C1", root))
    assert len(slack.calls_to("conversations.replies")) == 1


async def test_a_long_thread_is_read_page_by_page_and_a_refusal_costs_nothing(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot(slack_thread_history=3)
    root = slack.next_ts()
    for n in range(10):
        slack.add_to_thread("C1", root, "U1", f"message {n}")
    await bot.post(app_mention("C1", "U3", "summary?", slack.next_ts(), thread_ts=root))
    await bot.idle(sid("C1", root))
    assert len(slack.calls_to("conversations.replies")) == 3  # pages of 4
    contents = [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"]
    assert contents == ["[U1]: message 7", "[U1]: message 8", "[U1]: message 9", "summary?"]
    # Slack refuses (rate limit): the mention is answered without history.
    other = slack.next_ts()
    slack.add_to_thread("C2", other, "U1", "hello")
    slack.fail_next("conversations.replies", status=429, error="ratelimited", retry_after=60)
    await bot.post(app_mention("C2", "U3", "hi", slack.next_ts(), thread_ts=other))
    await bot.idle(sid("C2", other))
    assert [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"] == ["hi"]


async def test_a_refused_first_mention_still_brings_the_thread(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    # U3 may send one message an hour: the mention in the second thread is stored refused.
    bot = await start_bot(slack_thread_history=3, limit_user="1/hour")
    first = slack.next_ts()
    await bot.post(app_mention("C1", "U3", "hello", slack.next_ts(), thread_ts=first))
    await bot.idle(sid("C1", first))
    root = slack.next_ts()
    slack.add_to_thread("C1", root, "U1", "the deploy failed again")
    slack.add_to_thread("C1", root, "U2", "logs say OOM")
    await bot.post(app_mention("C1", "U3", "what happened?", slack.next_ts(), thread_ts=root))
    await bot.idle(sid("C1", root))
    stored = await bot.tape(sid("C1", root)).query(kinds=["message"])
    assert [(e.payload["content"], bool(e.meta.get("refused"))) for e in stored] == [
        ("[U1]: the deploy failed again", False),
        ("[U2]: logs say OOM", False),
        ("what happened?", True),
    ]
    # Someone else asks in that thread: the answer knows the thread, read once only.
    await bot.post(app_mention("C1", "U4", "any idea?", slack.next_ts(), thread_ts=root))
    await bot.idle(sid("C1", root))
    contents = [m["content"] for m in fake_openai.last_messages() if m["role"] == "user"]
    assert contents == ["[U1]: the deploy failed again", "[U2]: logs say OOM", "any idea?"]
    assert len(slack.calls_to("conversations.replies")) == 2  # the first thread, this one
