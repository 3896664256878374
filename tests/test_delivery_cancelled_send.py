"""A send cancelled by lease loss (regression, review 17): in flight, it is never sent again;
still waiting in the pacer queue, it is sent by the next owner (answered once, not lost).

A send the platform took whose answer never came back, cancelled because the lease could not
be renewed (database cut), once left no record at all: the replica that took over waited its
lease period, then sent the piece again (the chat showed the answer twice). The channel says
when its request leaves (`channels.base.request_leaving`); a send cancelled after that is
recorded as `reply.unknown` through `Records` (no lease needed), as a `DeliveryUnknown` is."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.runtime import Runtime
from bub_bot.tape import TapeStore, open_store
from channels.pacing import Pacer
from tests.fakes.openai_server import FakeOpenAI
from tests.runtime_channel import RuntimeChannel, until
from tests.tcp_proxy import TcpProxy


class PacedChannel(RuntimeChannel):
    """Every piece waits for its turn in a real `Pacer`, paused as after a long 429."""

    def __init__(self) -> None:
        super().__init__()
        self.pacer = Pacer(name="test")
        self.pacer.pause_all(3600)

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        async with self.pacer.turn(str(target.get("chat"))):
            return await super().send(target, piece)  # marks `request_leaving`, as outboxes do


class LostAnswerChannel(RuntimeChannel):
    """The platform takes every piece (it is shown), but its HTTP answer never arrives."""

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        await super().send(target, piece)
        await asyncio.Event().wait()  # the response is lost on the way back
        raise AssertionError("unreachable")


@pytest.fixture
async def replica(
    pg_url: str, settings: Callable[..., Any], pg_proxy: TcpProxy
) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Runtime, TapeStore, Agent]] = []

    async def make(owner: str, channel: RuntimeChannel, *, proxied: bool = False) -> Runtime:
        conf = settings(lease_seconds=1.5)
        store = await open_store(pg_proxy.route(pg_url) if proxied else pg_url)
        agent = Agent(conf, ModelClient(conf), default_registry())
        runtime = Runtime(conf, store, agent, {channel.name: channel}, store.leases(owner, 1.5))
        channel.runtime = runtime
        made.append((runtime, store, agent))
        await runtime.start()
        return runtime

    yield make
    pg_proxy.restore()
    for runtime, store, agent in made:
        await runtime.shutdown(grace=2)
        await agent.model.close()
        await store.close()


async def test_a_send_cancelled_in_flight_by_lease_loss_is_not_sent_again(
    replica, pg_proxy: TcpProxy, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bub_bot.runtime")
    ch1, ch2 = LostAnswerChannel(), RuntimeChannel()
    await replica("one", ch1, proxied=True)
    await replica("two", ch2)
    await ch1.say("question", key="k1")
    await ch1.wait_sent("a", 1, timeout=15)  # the platform shows it; A waits for the answer
    pg_proxy.cut()  # A cannot renew: its work (the send in flight) is cancelled
    await until(lambda: "lease.lost" in caplog.text, timeout=10)
    # B takes over and waits a lease period for A's record; A is back in time (as after a
    # PostgreSQL restart) and could say the piece's fate is unknown: it says nothing.
    await until(lambda: "reply.waiting" in caplog.text, timeout=10)
    pg_proxy.restore()
    await until(lambda: "reply.resend" in caplog.text or "reply.recorded" in caplog.text, 10)
    await until(lambda: not ch2.attempts or bool(ch2.texts("a")), timeout=5)
    await asyncio.sleep(0.5)
    shown = ch1.texts("a") + ch2.texts("a")
    assert shown == ["echo: question"], f"the chat shows {shown}"


async def test_a_send_cancelled_in_the_pacer_queue_is_sent_by_the_next_owner(
    replica, pg_proxy: TcpProxy, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bub_bot.runtime")
    ch1, ch2 = PacedChannel(), RuntimeChannel()
    await replica("one", ch1, proxied=True)
    await replica("two", ch2)
    await ch1.say("question", key="k1")
    await until(lambda: ch1.pacer.waiting == 1, timeout=15)  # the answer waits for its turn
    pg_proxy.cut()  # A cannot renew: its send, still queued, is cancelled
    await until(lambda: "reply.cancelled_unsent" in caplog.text, timeout=10)
    assert ch1.pacer.waiting == 0  # it left the queue
    pg_proxy.restore()  # A is back: it has nothing to record
    await ch2.wait_sent("a", 1, timeout=15)  # B waited for a record, none came: B sends it
    await asyncio.sleep(0.5)
    assert ch1.texts("a") == []
    assert ch2.texts("a") == ["echo: question"]
    assert "reply.resend" in caplog.text
