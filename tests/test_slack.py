"""The Slack channel end to end: real slack-bolt in a real `BotServer` on loopback, talking to
the fake Slack Web API / Socket Mode server and the fake model."""

from __future__ import annotations

import itertools
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bub_bot.config import ConfigError, Settings
from bub_bot.server import Bot, BotServer
from channels.slack import SlackChannel
from channels.slack_inbound import NOT_ENABLED
from tests.channel_harness import StoredTapes
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.slack_api import (
    FakeSlack,
    app_mention,
    channel_message,
    dm_message,
    sign_request,
    slash_command_form,
    url_verification,
)
from tests.runtime_channel import inbound_users

SECRET = "test-signing-secret"
TEAM = "T1"


class Harness(StoredTapes):
    """A started bot with a Slack channel, and helpers to drive it like Slack does."""

    def __init__(self, server: BotServer, slack: FakeSlack) -> None:
        self.server = server
        self.slack = slack
        self.bot = server.bot
        self.http = aiohttp.ClientSession()

    @property
    def events_url(self) -> str:
        return f"{self.server.url}/slack/events"

    async def post(
        self,
        payload: dict[str, Any],
        *,
        secret: str = SECRET,
        timestamp: int | None = None,
        headers: dict[str, str] | None = None,
        form: bool = False,
    ) -> tuple[int, str]:
        body = (urllib.parse.urlencode(payload) if form else json.dumps(payload)).encode()
        signed = sign_request(body, secret, timestamp)
        async with self.http.post(
            self.events_url, data=body, headers={**signed, **(headers or {})}
        ) as resp:
            return resp.status, await resp.text()

    async def idle(self, session_id: str) -> None:
        await self.bot.runtime.wait_idle(session_id, timeout=10)

    async def close(self) -> None:
        await self.http.close()
        await self.server.stop()


StartBot = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def start_bot(settings: Callable[..., Settings], slack: FakeSlack) -> AsyncIterator[StartBot]:
    started: list[Harness] = []

    async def make(**overrides: Any) -> Harness:
        values: dict[str, Any] = {
            "slack_bot_token": slack.bot_token,
            "slack_signing_secret": SECRET,
            "slack_api_url": slack.api_url,
            # One post per 0.05 s per channel instead of Slack's 1/s, to keep long answers
            # quick; the pacing itself is tested in test_slack_pacing.py.
            "slack_rate_channel": "1/0.05s",
        }
        values.update(overrides)
        conf = settings(**values)
        bot = await Bot.open(conf, [SlackChannel(conf)])
        server = BotServer(bot, host="127.0.0.1", port=0)
        try:
            await server.start()
        except BaseException:
            await server.stop()
            raise
        harness = Harness(server, slack)
        started.append(harness)
        return harness

    yield make
    for harness in started:
        await harness.close()


def sid(channel: str, thread: str | None = None) -> str:
    return f"slack:{TEAM}:{channel}" + (f":{thread}" if thread else "")


# ------------------------------------------------------------------------------ threads
async def test_mention_gets_threaded_reply(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot()
    ts = slack.next_ts()
    # Slack escapes & < > in event text; the model gets them back unescaped.
    status, _ = await bot.post(app_mention("C1", "U1", "hello there &amp; &lt;you&gt;", ts))
    assert status == 200
    # The 200 went out after the message was on disk, with Slack's ts as its time.
    assert await bot.user_messages(sid("C1", ts)) == ["hello there & <you>"]
    [stored] = await inbound_users(bot.tape(sid("C1", ts)))
    assert stored.meta["sent_at"] == float(ts)
    await bot.idle(sid("C1", ts))
    posts = slack.posts_in("C1", ts)
    assert [p["text"] for p in posts] == ["echo: hello there &amp; &lt;you&gt;"]
    # The model saw the text without the bot's mention; the thread showed a status meanwhile.
    assert fake_openai.last_messages()[-1]["content"] == "hello there & <you>"
    assert [s["status"] for s in slack.statuses] == ["is thinking…", ""]
    assert slack.statuses[0]["thread_ts"] == ts and slack.statuses[0]["channel_id"] == "C1"


async def test_mention_inside_existing_thread_uses_thread_root(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot()
    root, ts = slack.next_ts(), slack.next_ts()
    await bot.post(app_mention("C1", "U1", "in a thread", ts, thread_ts=root))
    await bot.idle(sid("C1", root))
    assert [p["text"] for p in slack.posts_in("C1", root)] == ["echo: in a thread"]


async def test_follow_up_in_thread_without_mention(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot()
    root = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "start", root))
    await bot.idle(sid("C1", root))
    status, _ = await bot.post(channel_message("C1", "U2", "and more", slack.next_ts(), root))
    assert status == 200
    await bot.idle(sid("C1", root))
    assert [p["text"] for p in slack.posts_in("C1", root)] == ["echo: start", "echo: and more"]
    # Not answered: top-level chatter, and replies in threads the bot was never part of.
    other = slack.next_ts()
    await bot.post(channel_message("C1", "U2", "chatter", other))
    await bot.post(channel_message("C1", "U2", "elsewhere", slack.next_ts(), other))
    assert await bot.bot.store.list_tapes() and len(await bot.bot.store.list_tapes()) == 1
    assert len(slack.posts) == 2


async def test_require_mention_ignores_thread_follow_ups(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot(slack_require_mention=True)
    root = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "start", root))
    await bot.idle(sid("C1", root))
    await bot.post(channel_message("C1", "U1", "no mention", slack.next_ts(), root))
    await bot.post(channel_message("C1", "U1", "<@UBOT> with one", slack.next_ts(), root))
    await bot.idle(sid("C1", root))
    texts = [p["text"] for p in slack.posts_in("C1", root)]
    assert texts == ["echo: start", "echo: with one"]


async def test_dm_top_level_and_threaded(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot()
    first, second = slack.next_ts(), slack.next_ts()
    await bot.post(dm_message("D1", "U1", "one", first))
    await bot.idle(sid("D1"))
    await bot.post(dm_message("D1", "U1", "two", second))
    await bot.idle(sid("D1"))
    top = [p for p in slack.posts_in("D1") if "thread_ts" not in p]
    assert [p["text"] for p in top] == ["echo: one", "echo: two"]
    assert await bot.user_messages(sid("D1")) == ["one", "two"]
    await bot.post(dm_message("D1", "U1", "threaded", slack.next_ts(), thread_ts=first))
    await bot.idle(sid("D1", first))
    assert [p["text"] for p in slack.posts_in("D1", first)] == ["echo: threaded"]
    assert await bot.user_messages(sid("D1", first)) == ["threaded"]
    # Top-level DM messages have no thread for a status: the reaction shows work instead.
    assert ("D1", first, "white_check_mark") in slack.reactions
    assert ("D1", first, "eyes") not in slack.reactions


# ------------------------------------------------------------------------------ dedupe
async def test_retried_event_answered_once(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot()
    ts = slack.next_ts()
    event = app_mention("C1", "U1", "once please", ts)
    assert (await bot.post(event))[0] == 200
    for attempt in (1, 2, 3):
        headers = {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_timeout"}
        assert (await bot.post(event, headers=headers))[0] == 200
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts] == ["echo: once please"]
    assert await bot.user_messages(sid("C1", ts)) == ["once please"]
    # A retry whose first delivery never arrived is processed, not dropped.
    ts = slack.next_ts()
    headers = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_error"}
    await bot.post(app_mention("C1", "U1", "only the retry", ts), headers=headers)
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == ["echo: only the retry"]


async def test_app_mention_and_message_for_one_mention(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot()
    ts = slack.next_ts()
    await bot.post(channel_message("C1", "U1", "<@UBOT> both ways", ts))
    await bot.post(app_mention("C1", "U1", "both ways", ts))
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts] == ["echo: both ways"]
    assert await bot.user_messages(sid("C1", ts)) == ["both ways"]


# ------------------------------------------------------------------------------ requests
async def test_bad_signature_and_stale_timestamp_rejected(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot()
    event = app_mention("C1", "U1", "forged", slack.next_ts())
    assert (await bot.post(event, secret="wrong-secret"))[0] == 401
    stale = int(time.time()) - 6 * 60
    assert (await bot.post(event, timestamp=stale))[0] == 401
    async with bot.http.post(bot.events_url, json=event) as resp:  # no signature at all
        assert resp.status == 401
    assert await bot.bot.store.list_tapes(include_all=True) == []
    assert slack.posts == [] and fake_openai.completion_requests() == []


async def test_url_verification(start_bot: StartBot) -> None:
    bot = await start_bot()
    status, body = await bot.post(url_verification("challenge-xyz"))
    assert status == 200 and json.loads(body) == {"challenge": "challenge-xyz"}
    # Requests of kinds the bot does not act on are acknowledged: Slack's certificate check of
    # a command URL, and its notice that it dropped events to this app for a minute.
    assert (await bot.post({"ssl_check": "1", "token": "x"}, form=True)) == (200, "")
    limited = {"type": "app_rate_limited", "team_id": TEAM, "minute_rate_limited": 1518467820}
    assert (await bot.post(limited)) == (200, "")
    assert await bot.stored_nothing()


async def test_own_and_other_bots_messages_ignored(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot()
    root = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "hi", root))
    await bot.idle(sid("C1", root))
    before = len(await bot.entries(sid("C1", root)))
    own = channel_message("C1", "UBOT", "echo: hi", slack.next_ts(), root, bot_id="BBOT")
    other = channel_message("C1", "UOTHER", "beep", slack.next_ts(), root, bot_id="B2")
    edit = channel_message("C1", "U1", "edited", slack.next_ts(), root, subtype="message_changed")
    for payload in (own, other, edit):
        assert (await bot.post(payload))[0] == 200
    await bot.idle(sid("C1", root))
    assert len(await bot.entries(sid("C1", root))) == before
    assert len(slack.posts) == 1


async def test_other_bots_answered_when_allowed(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot(slack_allow_bots=True)
    ts = slack.next_ts()
    await bot.post(channel_message("C1", "UOTHER", "<@UBOT> beep", ts, bot_id="B2"))
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == ["echo: beep"]


async def test_allowlists(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot(slack_allow_users="U1", slack_allow_channels="C1,D1,D2")
    await bot.post(app_mention("C1", "U2", "not me", slack.next_ts()))
    await bot.post(app_mention("C9", "U1", "not here", slack.next_ts()))
    await bot.post(dm_message("D2", "U2", "let me in", slack.next_ts()))
    await bot.post(dm_message("D2", "U2", "please", slack.next_ts()))
    await slack.wait_for(lambda: len(slack.posts) >= 1)
    assert await bot.bot.store.list_tapes(include_all=True) == []
    assert [(p["channel"], p["text"]) for p in slack.posts] == [("D2", NOT_ENABLED)]
    ts = slack.next_ts()
    await bot.post(dm_message("D1", "U1", "allowed", ts))
    await bot.idle(sid("D1"))
    assert [p["text"] for p in slack.posts_in("D1")] == ["echo: allowed"]


# ------------------------------------------------------------------------------ delivery
LONG_ANSWER = (
    "# Report\n\n"
    + "\n\n".join(f"Paragraph {i}: " + "words & more words " * 12 for i in range(14))
    + "\n\n```python\n"
    + "\n".join(f"value_{i} = {i} if a < b else None" for i in range(120))
    + "\n```\n\nDone."
)


async def test_long_reply_split_under_limit_with_code_block(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    assert len(LONG_ANSWER) >= 6000
    fake_openai.script(text(LONG_ANSWER))
    bot = await start_bot()
    ts = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "long one", ts))
    await bot.idle(sid("C1", ts))
    pieces = [p["text"] for p in slack.posts_in("C1", ts)]
    assert len(pieces) >= 2
    for piece in pieces:
        assert len(piece.encode()) < 4000
        assert piece.count("```") % 2 == 0
    # The code block was too big for one piece: closed at the end of one, reopened in the next.
    assert any(
        a.endswith("```") and b.startswith("```\nvalue_") for a, b in itertools.pairwise(pieces)
    )
    joined = "\n".join(pieces)
    assert joined.startswith("*Report*")
    for i in range(120):
        assert f"value_{i} = {i} if a &lt; b else None" in joined
    assert "words &amp; more words" in joined and joined.endswith("Done.")


async def test_rate_limited_piece_resent_alone(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(text(LONG_ANSWER))
    bot = await start_bot()
    ts = slack.next_ts()
    slack.fail_next("chat.postMessage", status=429, retry_after=1, after=1)
    await bot.post(app_mention("C1", "U1", "long one", ts))
    await bot.idle(sid("C1", ts))
    calls = [c["text"] for c in slack.calls_to("chat.postMessage")]
    posted = [p["text"] for p in slack.posts_in("C1", ts)]
    assert calls == [posted[0], posted[1], posted[1], *posted[2:]]
    assert len(posted) == len(set(posted))
    sent = [
        e.payload["data"]["chunk"]
        for e in await bot.entries(sid("C1", ts))
        if e.kind == "event" and e.payload["name"] == "reply.sent"
    ]
    assert sent == list(range(len(posted)))


async def test_ambiguous_post_failure_not_reposted(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot()
    ts = slack.next_ts()
    slack.drop_next("chat.postMessage", after_processing=True)
    await bot.post(app_mention("C1", "U1", "lost answer", ts))
    await bot.idle(sid("C1", ts))
    assert len(slack.calls_to("chat.postMessage")) == 1
    assert [p["text"] for p in slack.posts] == ["echo: lost answer"]
    names = [e.payload["name"] for e in await bot.entries(sid("C1", ts)) if e.kind == "event"]
    assert "reply.unknown" in names and "reply.sent" not in names


async def test_connection_dropped_before_processing_is_not_retried(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot()
    ts = slack.next_ts()
    slack.drop_next("chat.postMessage", after_processing=False)
    await bot.post(app_mention("C1", "U1", "try again", ts))
    await bot.idle(sid("C1", ts))
    # A connection dropped before Slack acted is still ambiguous to the client: not re-posted.
    assert slack.posts == []
    names = [e.payload["name"] for e in await bot.entries(sid("C1", ts)) if e.kind == "event"]
    assert "reply.unknown" in names


# ------------------------------------------------------------------------------ commands
async def test_slash_commands_answer_ephemerally(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot(slack_command_prefix="bub-")
    form = slash_command_form(
        "/bub-handoff", "first phase done", "C1", "U1", response_url=slack.response_url("h")
    )
    status, body = await bot.post(form, form=True)
    assert status == 200 and body == ""
    entries = await bot.entries(sid("C1"))  # on disk before the ack
    assert any(e.kind == "event" and e.payload["name"] == "command" for e in entries)
    await bot.idle(sid("C1"))
    form = slash_command_form("/bub-status", "", "C1", "U1", response_url=slack.response_url("s"))
    await bot.post(form, form=True)
    await bot.idle(sid("C1"))
    replies = dict(slack.responses)
    assert replies["h"]["response_type"] == "ephemeral"
    assert replies["h"]["text"].startswith("Handed off (handoff).")
    assert "Last anchor: handoff" in replies["s"]["text"]
    assert slack.posts == []
    # Without a usable response_url the answer is posted with chat.postEphemeral.
    form = slash_command_form(
        "/bub-status", "", "C1", "U1", response_url=f"{slack.base_url}/expired"
    )
    await bot.post(form, form=True)
    await bot.idle(sid("C1"))
    assert [(e["channel"], e["user"]) for e in slack.ephemerals] == [("C1", "U1")]
    assert slack.ephemerals[0]["text"].startswith("Entries:")


async def test_slash_command_with_wrong_prefix_or_user(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot(slack_command_prefix="bub-", slack_allow_users="U1")
    status, body = await bot.post(slash_command_form("/status", "", "C1", "U1"), form=True)
    assert status == 200 and "BUB_SLACK_COMMAND_PREFIX" in body
    status, body = await bot.post(slash_command_form("/bub-reset", "", "C1", "U2"), form=True)
    assert status == 200 and NOT_ENABLED in body
    assert await bot.bot.store.list_tapes(include_all=True) == []


async def test_mention_handoff_inside_thread(
    start_bot: StartBot, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    bot = await start_bot()
    root = slack.next_ts()
    await bot.post(app_mention("C1", "U1", "phase one", root))
    await bot.idle(sid("C1", root))
    await bot.post(
        app_mention("C1", "U1", "/handoff name=part-1 wrapped up", slack.next_ts(), root)
    )
    await bot.idle(sid("C1", root))
    texts = [p["text"] for p in slack.posts_in("C1", root)]
    assert texts[0] == "echo: phase one"
    assert texts[1].startswith("Handed off (part-1).") and "wrapped up" in texts[1]
    anchors = [e.payload["name"] for e in await bot.entries(sid("C1", root)) if e.kind == "anchor"]
    assert anchors[-1] == "part-1"
    assert len(fake_openai.completion_requests()) == 1  # the command never reached the model


# ------------------------------------------------------------------------------ indicator
async def test_status_unavailable_falls_back_to_reactions(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    slack.assistant_enabled = False
    bot = await start_bot()
    for _ in range(2):
        ts = slack.next_ts()
        await bot.post(app_mention("C1", "U1", "hi", ts))
        await bot.idle(sid("C1", ts))
        assert ("C1", ts, "white_check_mark") in slack.reactions
        assert ("C1", ts, "eyes") not in slack.reactions
    assert len(slack.calls_to("assistant.threads.setStatus")) == 1  # tried once per workspace
    assert len(slack.posts) == 2


async def test_indicator_failures_do_not_fail_the_turn(
    start_bot: StartBot, slack: FakeSlack
) -> None:
    bot = await start_bot(slack_working_indicator="reaction")
    ts = slack.next_ts()
    slack.fail_next("reactions.remove", error="missing_scope")
    slack.fail_next("reactions.add", error="missing_scope", after=1)  # the swap fails
    await bot.post(app_mention("C1", "U1", "still fine", ts))
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts] == ["echo: still fine"]
    assert slack.calls_to("assistant.threads.setStatus") == []
    assert slack.reactions == {("C1", ts, "eyes")}


# ------------------------------------------------------------------------------ socket mode
async def test_socket_mode_round_trip(start_bot: StartBot, slack: FakeSlack) -> None:
    bot = await start_bot(slack_app_token=slack.app_token, slack_signing_secret=None)
    async with bot.http.post(bot.events_url, json={}) as resp:
        assert resp.status == 404
    await slack.wait_connected()
    ts = slack.next_ts()
    event = app_mention("C1", "U1", "over the socket", ts)
    envelope = await slack.socket_send_event(event)
    await slack.wait_for_ack(envelope)
    assert await bot.user_messages(sid("C1", ts)) == ["over the socket"]  # stored before ack
    retry = await slack.socket_send_event(event, retry_attempt=1, retry_reason="timeout")
    await slack.wait_for_ack(retry)
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == ["echo: over the socket"]
    form = slash_command_form("/bub-status", "", "D1", "U1", response_url=slack.response_url("x"))
    command = await slack.socket_send_slash_command(form)
    await slack.wait_for_ack(command)
    await slack.wait_for(lambda: bool(slack.responses))
    assert slack.responses[0][1]["text"].startswith("Entries:")


# ------------------------------------------------------------------------------ start-up
async def test_start_fails_on_rejected_token(
    settings: Callable[..., Settings], slack: FakeSlack
) -> None:
    conf = settings(
        slack_bot_token="xoxb-wrong", slack_signing_secret=SECRET, slack_api_url=slack.api_url
    )
    bot = await Bot.open(conf, [SlackChannel(conf)])
    try:
        with pytest.raises(ConfigError, match="BUB_SLACK_BOT_TOKEN") as err:
            await bot.start_channels()
        assert "\n" not in str(err.value) and "xoxb-wrong" not in str(err.value)
    finally:
        await bot.close()


async def test_bad_token_prefix_is_a_config_error(settings: Callable[..., Settings]) -> None:
    conf = settings()
    bad = conf.model_copy(update={"slack_bot_token": "xoxp-user", "slack_signing_secret": "s"})
    with pytest.raises(ConfigError, match="BUB_SLACK_BOT_TOKEN"):
        SlackChannel(bad)
    none = conf.model_copy(update={"slack_bot_token": "xoxb-1"})
    with pytest.raises(ConfigError, match="BUB_SLACK_APP_TOKEN"):
        SlackChannel(none)


async def test_start_fails_on_rejected_app_token(
    settings: Callable[..., Settings], slack: FakeSlack
) -> None:
    conf = settings(
        slack_bot_token=slack.bot_token, slack_app_token="xapp-wrong", slack_api_url=slack.api_url
    )
    bot = await Bot.open(conf, [SlackChannel(conf)])
    try:
        with pytest.raises(ConfigError, match="BUB_SLACK_APP_TOKEN"):
            await bot.start_channels()
    finally:
        await bot.close()
