"""A replica that loses its database right after the platform took something: the replica
that takes the session over waits for the sender's record instead of acting on a tape that
does not know yet. Two bots in this process on the real PostgreSQL of the tests, one of them
through a TCP proxy the test cuts (connections reset) and restores once the other holds the
session's lease; real slack_sdk against FakeSlack.

- a piece posted, its `reply.sent` not written: the takeover finds it recorded (no re-post);
- a streamed partial posted, its `stream.shown` not written: the takeover edits the partial
  into its answer (no second message);
- the sender never comes back: the takeover waits a lease period, then asks Slack, finds the
  post and records it (no re-post); the sender's late record adds nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from bub_bot.runtime.leases import LeaseKey
from channels.slack_format import format_and_split
from tests.fakes.openai_server import FakeOpenAI, endless, text
from tests.fakes.slack_api import FakeSlack, app_mention
from tests.pg import PostgresCluster
from tests.runtime_channel import until
from tests.tcp_proxy import TcpProxy
from tests.test_slack import Harness, StartBot, sid, slack, start_bot

__all__ = ["slack", "start_bot"]  # fixtures

LEASE = 3.0
ANSWER = "The whole answer, which the replica that took over wrote."
[FINAL] = format_and_split(ANSWER)


async def two_bots(
    start_bot: StartBot, pg_cluster: PostgresCluster, pg_proxy: TcpProxy, **settings: Any
) -> tuple[Harness, Harness]:
    """Bot A on the database through `pg_proxy`, bot B directly; the same Slack workspace."""
    url = pg_cluster.fresh_url()
    common = {"lease_seconds": LEASE, "shutdown_grace_seconds": 0.5, **settings}
    a = await start_bot(database_url=pg_proxy.route(url), **common)
    b = await start_bot(database_url=url, **common)
    return a, b


def hold_first_post(slack: FakeSlack) -> tuple[asyncio.Event, asyncio.Event]:
    """Slack takes the first `chat.postMessage`; its answer waits for `release`."""
    reached, release = asyncio.Event(), asyncio.Event()
    post = slack._handlers["chat.postMessage"]

    async def held(params: dict[str, Any]) -> dict[str, Any]:
        answer = await post(params)
        if not reached.is_set():
            reached.set()
            await release.wait()
        return answer

    slack._handlers["chat.postMessage"] = held
    return reached, release


async def cut_after_the_post(
    a: Harness, b: Harness, slack: FakeSlack, pg_proxy: TcpProxy, session: str
) -> None:
    """A's database goes away once Slack took A's post, before A hears back; it comes back
    once B took the session over (A's lease lapsed meanwhile)."""
    reached, release = hold_first_post(slack)
    await asyncio.wait_for(reached.wait(), 15)
    pg_proxy.cut(reset=True)
    release.set()
    key = LeaseKey(b.tape(session).name, session)
    await until(lambda: b.bot.runtime.lease_keeper.holds(key), timeout=LEASE * 4)
    pg_proxy.restore()


async def test_takeover_waits_for_the_record_of_a_posted_piece(
    start_bot: StartBot,
    slack: FakeSlack,
    fake_openai: FakeOpenAI,
    pg_cluster: PostgresCluster,
    pg_proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bub_bot.runtime")
    a, b = await two_bots(start_bot, pg_cluster, pg_proxy, stream=False)
    fake_openai.script(text(ANSWER))
    ts = slack.next_ts()
    session = sid("C1", ts)
    await a.post(app_mention("C1", "U1", "a question", ts))
    await cut_after_the_post(a, b, slack, pg_proxy, session)
    await b.idle(session)
    done = await b.tape(session).query(kinds=["event"], names=["inbound.done"])
    assert len(done) == 1
    assert slack.visible("C1", ts) == [FINAL] and len(slack.posts_in("C1", ts)) == 1
    assert len(fake_openai.completion_requests()) == 1
    logged = caplog.text
    assert "reply.waiting" in logged and "reply.recorded_by_sender" in logged


async def test_takeover_edits_the_partial_the_cut_replica_showed(
    start_bot: StartBot,
    slack: FakeSlack,
    fake_openai: FakeOpenAI,
    pg_cluster: PostgresCluster,
    pg_proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bub_bot.runtime")
    slack.streaming_enabled = False  # partials are posted, then edited
    a, b = await two_bots(start_bot, pg_cluster, pg_proxy, stream_interval_ms=100)
    # A's model shows a little and then stalls; B's answers at once.
    fake_openai.script(endless(every=60, limit=120), text(ANSWER))
    ts = slack.next_ts()
    session = sid("C1", ts)
    await a.post(app_mention("C1", "U1", "a question", ts))
    await cut_after_the_post(a, b, slack, pg_proxy, session)
    await until(lambda: len(fake_openai.completion_requests()) == 2, timeout=LEASE * 3)
    await b.idle(session)
    # One message in the thread: A's partial, edited into B's answer.
    assert len(slack.posts_in("C1", ts)) == 1
    assert slack.visible("C1", ts) == [FINAL]
    logged = caplog.text
    assert "stream.waiting" in logged and "stream.recorded_by_sender" in logged


async def test_a_sender_that_never_comes_back_is_waited_for_once_then_slack_is_asked(
    start_bot: StartBot,
    slack: FakeSlack,
    fake_openai: FakeOpenAI,
    pg_cluster: PostgresCluster,
    pg_proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stays cut: B waits a lease period for A's record, then delivers the piece itself,
    asking Slack first: the post is in the thread, so it is recorded, not posted again.
    When A's connection comes back at last, its late record adds nothing."""
    caplog.set_level(logging.INFO, logger="bub_bot.runtime")
    a, b = await two_bots(start_bot, pg_cluster, pg_proxy, stream=False)
    fake_openai.script(text(ANSWER))
    ts = slack.next_ts()
    session = sid("C1", ts)
    await a.post(app_mention("C1", "U1", "a question", ts))
    reached, release = hold_first_post(slack)
    await asyncio.wait_for(reached.wait(), 15)
    pg_proxy.cut(reset=True)
    release.set()
    tape = b.tape(session)
    await until(lambda: "reply.recalled" in caplog.text, timeout=LEASE * 5)
    await b.idle(session)
    assert "reply.resend" in caplog.text
    assert slack.visible("C1", ts) == [FINAL] and len(slack.posts_in("C1", ts)) == 1
    pg_proxy.restore()
    await until(lambda: not a.bot.runtime.delivery.records.waiting, timeout=10)
    sent = await tape.query(kinds=["event"], names=["reply.sent"])
    done = await tape.query(kinds=["event"], names=["inbound.done"])
    assert len(sent) == 1 and len(done) == 1
    assert len(fake_openai.completion_requests()) == 1
