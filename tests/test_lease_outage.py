"""A replica that cannot reach the database stops its work before its leases lapse, in
process: two runtimes on the real PostgreSQL of the tests, one of them through a `TcpProxy`
that the test cuts (black-holed: queries hang; reset: they fail at once). The work of the cut
replica is cancelled and logged `lease.lost` before the other replica takes the lease over.
With real `serve` processes and a streamed turn: test_lease_outage_replicas.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.runtime import Runtime
from bub_bot.tape import TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.runtime_channel import RuntimeChannel, until
from tests.tcp_proxy import TcpProxy


@pytest.fixture
async def replicas(
    pg_url: str, settings: Callable[..., Any], pg_proxy: TcpProxy
) -> AsyncIterator[Callable[..., Any]]:
    """`replica(owner, lease_seconds, proxied=False)`: a Runtime with its own store (through
    the pg_proxy when `proxied`), leases and test channel; all on one database."""
    made: list[tuple[Runtime, TapeStore, Agent]] = []

    async def make(
        owner: str, lease_seconds: float, *, proxied: bool = False
    ) -> tuple[Runtime, RuntimeChannel]:
        conf = settings(lease_seconds=lease_seconds)
        store = await open_store(pg_proxy.route(pg_url) if proxied else pg_url)
        agent = Agent(conf, ModelClient(conf), default_registry())
        channel = RuntimeChannel()
        runtime = Runtime(
            conf, store, agent, {channel.name: channel}, store.leases(owner, lease_seconds)
        )
        channel.runtime = runtime
        made.append((runtime, store, agent))
        await runtime.start()
        return runtime, channel

    yield make
    pg_proxy.restore()  # the cut replica's store must be able to close
    for runtime, store, agent in made:
        await runtime.shutdown(grace=2)
        await agent.model.close()
        await store.close()


def record(runtime: Runtime, name: str, order: list[str]) -> None:
    """Append `name:outcome` to `order` for every lease and leader event of `runtime`."""

    def seen(event: str, data: dict[str, Any]) -> None:
        if event in ("lease", "leader"):
            order.append(f"{name}:{data['outcome']}")

    runtime.observers.append(seen)


async def test_a_turn_on_a_replica_cut_from_the_database_stops_before_its_lease_lapses(
    replicas, pg_proxy: TcpProxy, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bub_bot.runtime")
    (one, ch1), (two, ch2) = await replicas("one", 1.5, proxied=True), await replicas("two", 1.5)
    order: list[str] = []
    record(one, "one", order)
    record(two, "two", order)
    fake_openai.script(slow(text("from the cut replica"), 30))
    await ch1.say("question", key="k1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    # Black-holed: every query of replica one hangs (a real network cut, not a refusal).
    pg_proxy.cut()
    await ch2.wait_sent("a", 1, timeout=15)
    assert ch2.texts("a") == ["echo: question"]
    # Replica one had given up before replica two could take the session over.
    assert "one:lost" in order and "two:takeover" in order
    assert order.index("one:lost") < order.index("two:takeover")
    await until(lambda: not one.sessions, timeout=5)
    assert ch1.texts("a") == []
    assert "lease.lost session=test:a reason=not_renewed_in_time" in caplog.text
    # Back on the network: nothing more is said, the lease stays where it is.
    pg_proxy.restore()
    await asyncio.sleep(1.0)
    assert ch1.texts("a") == [] and ch2.texts("a") == ["echo: question"]
    assert len(fake_openai.completion_requests()) == 2


async def test_a_leader_whose_renewals_fail_stops_leading_before_its_lease_lapses(
    replicas, pg_proxy: TcpProxy
) -> None:
    (one, _), (two, _) = await replicas("one", 1.5, proxied=True), await replicas("two", 1.5)
    order: list[str] = []
    record(one, "one", order)
    record(two, "two", order)
    first, second = one.leader("telegram:poller:9"), two.leader("telegram:poller:9")
    await asyncio.wait_for(first.__aenter__(), 5)
    standby = asyncio.ensure_future(second.__aenter__())
    # Reset: every renewal of replica one fails at once (it used to count as renewed).
    pg_proxy.cut(reset=True)
    await asyncio.wait_for(first.lost.wait(), 5)
    assert not first.leading
    await asyncio.wait_for(standby, 10)
    assert second.leading
    assert order.index("one:lost") < order.index("two:acquired")
    standby = asyncio.ensure_future(first.__aenter__())
    pg_proxy.restore()
    await asyncio.sleep(1.0)
    assert not standby.done()  # the other replica leads now; this one stands by
    standby.cancel()
    with pytest.raises(asyncio.CancelledError):
        await standby
