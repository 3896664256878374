"""Scheduled jobs through the real channels: a one-off job made in a Telegram forum topic
and in a Slack thread fires once, into that topic and that thread (aiogram and slack-bolt
against the fake Bot API and the fake Slack, in a real `BotServer`); the web viewer lists a
session's jobs. The clock is the test's: it moves instead of waiting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from html import escape
from typing import Any

import aiohttp
import pytest

from bub_bot.config import Settings
from bub_bot.server import Bot, BotServer
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from channels.web import WebChannel
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.slack_api import FakeSlack, app_mention, sign_request
from tests.fakes.telegram_api import FakeTelegram
from tests.runtime_channel import until
from tests.schedule_harness import Clock, add_call, last_result, scheduled
from tests.test_telegram import BOT, TOKEN, tg
from tests.web_client import WebChat

__all__ = ["tg"]  # the fixture

GROUP, USER, TOPIC = -100777, 42, 9
SLACK_SECRET = "schedule-signing-secret"
wait_until = partial(until, timeout=10.0, interval=0.02)


@pytest.fixture
async def serve(
    settings: Callable[..., Settings],
) -> AsyncIterator[Callable[..., Awaitable[tuple[BotServer, Clock]]]]:
    """`serve(channel_factory, **settings)`: a started server with one channel and a clock."""
    servers: list[BotServer] = []

    async def make(factory: Callable[[Settings], Any], **overrides: Any) -> tuple[BotServer, Clock]:
        conf = settings(**overrides)
        clock = Clock()
        bot = await Bot.open(conf, [factory(conf)], clock=clock)
        server = BotServer(bot, host="127.0.0.1", port=0)
        await server.start()
        servers.append(server)
        return server, clock

    yield make
    for server in servers:
        await server.stop()


async def fire(bot: Bot, clock: Clock, seconds: float) -> None:
    clock.advance(seconds)
    bot.runtime.timer.poke()


async def test_a_job_made_in_a_telegram_topic_fires_once_into_that_topic(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    server, clock = await serve(
        lambda conf: TelegramChannel(conf, poll_timeout=5, retry_base=0.05, typing_interval=0.2),
        telegram_token=TOKEN,
        telegram_api_base=tg.base_url,
        telegram_allow_users="*",
        telegram_rate_chat="1/0.05s",
    )
    bot = server.bot
    session = f"telegram:{GROUP}:{TOPIC}"
    fake_openai.script(
        add_call(prompt="Remind Ann to water the plants", in_seconds=300), text("Will do.")
    )
    tg.push_update(
        tg.group_text(GROUP, USER, f"@{BOT} remind me in 5 min", thread_id=TOPIC, is_forum=True)
    )
    await wait_until(lambda: len(tg.sent_to(GROUP, TOPIC)) == 1)
    job_id = last_result(fake_openai)["id"]
    await bot.runtime.wait_idle(session, timeout=10)

    await fire(bot, clock, 301)
    await wait_until(lambda: len(tg.sent_to(GROUP, TOPIC)) == 2)
    reminder = tg.sent_to(GROUP, TOPIC)[-1]
    assert reminder["text"].startswith(f"echo: [Scheduled job {job_id}, due ")
    assert reminder["text"].endswith("Remind Ann to water the plants")
    [entry] = await scheduled(await bot.runtime.session_tape(session))
    assert entry.meta["sender"]["id"] == str(USER) and entry.meta["channel"] == "telegram"
    assert entry.meta["reply_target"]["thread_id"] == TOPIC
    labels = {"kind": "prompt", "outcome": "fired"}
    assert bot.metrics.registry.get_sample_value("bub_job_delay_seconds_count", labels) == 1

    # Once: more time, another look, nothing more in the topic or anywhere in the chat.
    await fire(bot, clock, 3600)
    assert await bot.runtime.timer.fire_due() == []
    await bot.runtime.wait_idle(session, timeout=10)
    await asyncio.sleep(0.2)
    assert len(tg.sent_to(GROUP)) == 2


async def test_a_job_made_in_a_slack_thread_fires_once_into_that_thread(
    serve, fake_openai: FakeOpenAI
) -> None:
    async with FakeSlack() as slack, aiohttp.ClientSession() as http:
        server, clock = await serve(
            SlackChannel,
            slack_bot_token=slack.bot_token,
            slack_signing_secret=SLACK_SECRET,
            slack_api_url=slack.api_url,
            slack_rate_channel="1/0.05s",
        )
        bot = server.bot
        root = slack.next_ts()
        session = f"slack:T1:C9:{root}"
        fake_openai.script(
            add_call(prompt="Check the deploy", cron="0 9 * * *", tz="Europe/Berlin"),
            text("Scheduled."),
        )
        body = json.dumps(app_mention("C9", "U7", "check the deploy every morning", root)).encode()
        async with http.post(
            f"{server.url}/slack/events", data=body, headers=sign_request(body, SLACK_SECRET)
        ) as resp:
            assert resp.status == 200
        await wait_until(lambda: len(slack.posts_in("C9", root)) == 1)
        await bot.runtime.wait_idle(session, timeout=10)
        [job] = await bot.store.jobs()
        assert job.session_id == session and job.data["reply_target"]["thread_ts"] == root

        await fire(bot, clock, job.due - clock.now + 0.5)
        await wait_until(lambda: len(slack.posts_in("C9", root)) == 2)
        post = slack.posts_in("C9", root)[-1]
        assert post["text"].startswith(f"echo: [Scheduled job {job.id}, due ")
        assert post["text"].endswith("Check the deploy")
        assert len(slack.posts_in("C9")) == 2  # in the thread, not at the channel's top level
        assert await bot.runtime.timer.fire_due() == []  # the next run is tomorrow
        [row] = await bot.store.jobs()
        assert row.fired == 1 and row.due > clock.now


async def test_the_viewer_lists_a_sessions_jobs(serve, fake_openai: FakeOpenAI) -> None:
    token = "viewer-token-0123456789"
    server, _clock = await serve(WebChannel, web_token=token)
    bot = server.bot
    async with aiohttp.ClientSession() as http:
        chat = WebChat(http, server.url, token)
        conversation = await chat.new_conversation()
        fake_openai.script(add_call(prompt="Say <b>hi</b> & wave", cron="30 8 * * 1-5"), text("ok"))
        await chat.post(conversation, "every weekday")
        session = f"web:{conversation}"
        await bot.runtime.wait_idle(session, timeout=10)
        tape = await bot.runtime.session_tape(session)
        _, view = await chat.get_json(f"/tapes/{tape.name}")
        [listed] = view["jobs"]
        assert listed["kind"] == "prompt" and listed["prompt"] == "Say <b>hi</b> & wave"
        assert "cron '30 8 * * 1-5'" in listed["schedule"]
        async with http.get(f"{server.url}/tapes/{tape.name}", headers=chat.headers) as resp:
            page = await resp.text()
        assert "Scheduled jobs" in page and listed["id"] in page
        assert escape("Say <b>hi</b> & wave") in page and "<b>hi</b>" not in page
