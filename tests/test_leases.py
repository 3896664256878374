"""Leases on a real PostgreSQL server, in process: the `bub_leases` table itself (acquire,
renew, lost, lapsed, handover notices, a listener that reconnects), then two runtimes on one
database acting as two replicas (one turn at a time per session, a message stored on either
replica answered once, a lost lease stops the work, leadership of a job). The same rules with
real `serve` processes are in test_replicas.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.runtime import Runtime
from bub_bot.tape import Tape, TapeStore, open_store
from bub_bot.tape.leases import LeaseKey, LocalLeases
from bub_bot.tape.postgres_leases import PostgresLeases
from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.runtime_channel import RuntimeChannel, make_runtime, until, user_entry

A = LeaseKey("tape-a", "test:a")
JOB = LeaseKey.job("telegram:poller:1")

__all__ = ["make_runtime"]  # a fixture


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[TapeStore]:
    async with open_store(pg_url) as store:
        yield store


@pytest.fixture
async def leases(pg_store: TapeStore) -> AsyncIterator[Callable[..., PostgresLeases]]:
    """`leases(owner, seconds=15)`: leases of one owner on the test database."""
    made: list[PostgresLeases] = []

    def make(owner: str, seconds: float = 15.0) -> PostgresLeases:
        made.append(pg_store.leases(owner, seconds))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for lease in made:
        await lease.close()


async def rows(store: Any) -> dict[str, tuple[str | None, str, bool]]:
    """key -> (session_id, owner, lapsed) as the database sees it."""
    async with store.pool.acquire() as conn:
        found = await conn.fetch(
            "SELECT key, session_id, owner, expires < now() AS lapsed FROM bub_leases"
        )
    return {r["key"]: (r["session_id"], r["owner"], r["lapsed"]) for r in found}


# -- the table --------------------------------------------------------------------------------


async def test_one_owner_at_a_time_renew_and_release(pg_store, leases) -> None:
    one, two = leases("one"), leases("two")
    assert one.shared and one.owner == "one"
    assert await one.acquire(A)
    assert not await two.acquire(A)
    assert await one.acquire(A)  # extending our own lease is fine
    assert await one.renew([A]) == set()
    assert await two.renew([A]) == {"tape-a"}  # never ours
    assert await one.renew([]) == set()
    assert (await rows(pg_store))["tape-a"] == ("test:a", "one", False)
    await two.release(A)  # not the owner: changes nothing
    assert not await two.acquire(A)
    await one.release(A)
    assert await rows(pg_store) == {}
    assert await two.acquire(A)


async def test_racing_owners_get_a_free_lease_exactly_once(leases) -> None:
    attempts = [leases(f"owner-{i}") for i in range(8)] * 3
    won = await asyncio.gather(*(o.acquire(A) for o in attempts))
    # One owner wins; its own other attempts may extend it, nobody else's succeed.
    assert len({o.owner for o, w in zip(attempts, won, strict=True) if w}) == 1


async def test_a_lapsed_lease_is_listed_taken_over_and_lost_by_its_owner(pg_store, leases) -> None:
    dying, survivor = leases("dying", seconds=0.3), leases("survivor")
    assert await dying.acquire(A)
    assert await dying.acquire(JOB)
    assert await survivor.lapsed() == []
    # When to look next: the session lease of another owner, not its job, not our own.
    left = await survivor.next_lapse()
    assert left is not None and 0 < left <= 0.3
    assert await dying.next_lapse() is None
    await asyncio.sleep(0.5)
    # Expiry is the database's clock: lapsed without anyone writing anything.
    assert (await rows(pg_store))["tape-a"][2] is True
    # Sessions only: a job's standby retries on its own.
    assert await survivor.lapsed() == [A]
    assert await survivor.acquire(A)
    assert await survivor.lapsed() == []
    assert await survivor.next_lapse() is None  # only its own lease is left
    assert await dying.renew([A, JOB]) == {"tape-a"}  # the job was lapsed but not taken
    assert (await rows(pg_store))["telegram:poller:1"] == (None, "dying", False)


async def test_handover_leaves_the_lease_lapsed_and_tells_the_others(pg_store, leases) -> None:
    leaving, staying, third = leases("leaving"), leases("staying"), leases("third")
    heard: dict[str, list[LeaseKey]] = {"leaving": [], "staying": [], "third": []}
    for lease in (leaving, staying, third):
        await lease.listen(heard[lease.owner].append)
    assert staying.listening
    assert await leaving.acquire(A)
    await leaving.release(A, handover=True)
    await until(lambda: len(heard["staying"]) == 1 and len(heard["third"]) == 1)
    assert heard["staying"] == [A] and heard["leaving"] == []  # not told about its own
    # Lapsed with no owner: a replica that missed the notice still finds it in its sweep.
    assert (await rows(pg_store))["tape-a"] == ("test:a", "", True)
    assert await staying.lapsed() == [A]
    assert await staying.acquire(A)
    assert not await third.acquire(A)

    # Handing over a session nobody holds (stored during shutdown) leaves a lapsed row too;
    # one that another replica holds alive is left alone, and nobody is told.
    b = LeaseKey("tape-b", "test:b")
    await leaving.release(b, handover=True)
    await until(lambda: len(heard["staying"]) == 2)
    assert heard["staying"][-1] == b
    await leaving.release(A, handover=True)
    await asyncio.sleep(0.2)
    assert len(heard["staying"]) == 2
    assert (await rows(pg_store))["tape-a"] == ("test:a", "staying", False)


async def test_schemas_sharing_a_database_do_not_hear_each_other(pg_url, leases) -> None:
    # The same database, another schema, named as long as PostgreSQL allows (channel names
    # are identifiers too: at most 63 bytes).
    database = pg_url.split("?")[0]
    schema = "bub_" + "x" * 59
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    other_url = f"{database}?search_path={schema}"
    async with open_store(other_url) as other_store:
        other = other_store.leases("other", 15)
        here = leases("here")
        heard: list[LeaseKey] = []
        try:
            await other.listen(heard.append)
            assert await here.channel() != await other.channel()
            await here.release(A, handover=True)
            await asyncio.sleep(0.3)
            assert heard == []
            assert await other.lapsed() == []
            # ...while a handover in its own schema reaches it.
            await other_store.leases("neighbour", 15).release(A, handover=True)
            await until(lambda: heard == [A])
            assert await other.lapsed() == [A]
        finally:
            await other.close()


async def test_the_listener_reconnects_when_its_connection_is_killed(pg_store, leases) -> None:
    listener, sender = leases("listener"), leases("sender")
    listener.watch_seconds = 0.1
    heard: list[LeaseKey] = []
    await listener.listen(heard.append)
    async with pg_store.pool.acquire() as conn:  # type: ignore[attr-defined]
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'bub-bot leases'"
        )
    assert killed == 1
    for _ in range(100):  # the watcher notices and reconnects
        await sender.release(A, handover=True)
        if heard:
            break
        await asyncio.sleep(0.1)
    assert heard and heard[0] == A


async def test_sqlite_grants_every_lease(store) -> None:
    local = store.leases("me", 15)
    assert isinstance(local, LocalLeases) and not local.shared
    assert await local.acquire(A) and await local.renew([A]) == set()
    assert await local.lapsed() == []


# -- two runtimes on one database -------------------------------------------------------------


@pytest.fixture
async def replicas(
    pg_url: str, settings: Callable[..., Any]
) -> AsyncIterator[Callable[..., tuple[Runtime, RuntimeChannel]]]:
    """`replica(**settings)`: a Runtime with its own store, leases and test channel, all on one
    PostgreSQL database (each one stands for a `serve` process)."""
    made: list[tuple[Runtime, TapeStore, Agent]] = []
    stores: list[TapeStore] = []

    async def make(
        owner: str, lease_seconds: float = 15, **overrides: Any
    ) -> tuple[Runtime, RuntimeChannel]:
        conf = settings(lease_seconds=lease_seconds, **overrides)
        store = await open_store(pg_url)
        stores.append(store)
        agent = Agent(conf, ModelClient(conf), default_registry())
        channel = RuntimeChannel()
        runtime = Runtime(
            conf, store, agent, {channel.name: channel}, store.leases(owner, lease_seconds)
        )
        channel.runtime = runtime
        made.append((runtime, store, agent))
        await runtime.start()
        return runtime, channel

    yield make  # type: ignore[misc]
    for runtime, store, agent in made:
        await runtime.shutdown(grace=2)
        await agent.model.close()
        await store.close()


async def test_a_message_on_the_other_replica_joins_the_running_session(
    replicas, fake_openai: FakeOpenAI
) -> None:
    (one, ch1), (two, ch2) = await replicas("one"), await replicas("two")
    fake_openai.script(slow(text("first answer"), 0.8))
    await ch1.say("first", key="k1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    # Stored by replica two while replica one holds the session: two does not run it, and
    # one answers it after its turn (it looks at the queue again when it releases).
    assert (await ch2.say("second", key="k2")).new
    assert two.lease_keeper.held == 0
    await ch1.wait_sent("a", 2)
    assert ch1.texts("a") == ["first answer", "echo: second"]
    assert ch2.texts("a") == []
    await until(lambda: one.lease_keeper.held == 0)
    # The same delivery on both replicas is stored once and answered once.
    got = await asyncio.gather(ch1.say("third", key="k3"), ch2.say("third", key="k3"))
    assert sorted(r.new for r in got) == [False, True]
    await until(lambda: len(ch1.texts("a")) + len(ch2.texts("a")) == 3)
    await asyncio.sleep(0.3)
    assert len(ch1.texts("a")) + len(ch2.texts("a")) == 3
    assert len(fake_openai.completion_requests()) == 3


async def test_a_redelivery_wakes_a_message_stored_by_a_replica_that_died(
    replicas, fake_openai: FakeOpenAI
) -> None:
    """A replica killed after storing a message but before taking its lease never
    acknowledged it: the platform's re-delivery reaches another replica, which answers."""
    _one, ch = await replicas("one")
    tape = Tape.for_session(_one.store, "test:a", _one.settings.workspace)
    await _one.store.append_many(
        tape.name,
        [user_entry(ch, "stored, then the replica died", "a", "k9")],
        dedupe_keys=["test:k9"],
        bootstrap=Tape.bootstrap_anchor(_one.settings.workspace),
        session_id="test:a",
    )
    assert (await ch.say("stored, then the replica died", key="k9")).duplicate
    assert await ch.wait_sent("a", 1) == ["echo: stored, then the replica died"]


async def test_a_lost_lease_stops_the_turn_and_a_lapsed_one_is_taken_over(
    replicas, fake_openai: FakeOpenAI
) -> None:
    (one, ch1), (two, ch2) = await replicas("one", 1.5), await replicas("two", 1.5)
    events: list[str] = []
    two.observers.append(lambda e, d: events.append(d["outcome"]) if e == "lease" else None)
    fake_openai.script(slow(text("from the stalled replica"), 30))
    await ch1.say("question", key="k1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    # Replica one stalls past its lease and someone else takes it (simulated: the row is
    # lapsed and no longer one's); replica two's sweep takes the session over and answers...
    async with one.store.pool.acquire() as conn:  # type: ignore[attr-defined]
        await conn.execute("UPDATE bub_leases SET owner = 'ghost', expires = '-infinity'")
    await ch2.wait_sent("a", 1, timeout=10)
    assert ch2.texts("a") == ["echo: question"]
    assert "takeover" in events
    # ...and replica one's next renewal finds the lease gone and cancels its turn.
    await until(lambda: not one.sessions, timeout=5)
    await asyncio.sleep(0.2)
    assert ch1.texts("a") == []


async def test_handover_on_shutdown_is_taken_at_once(replicas, fake_openai: FakeOpenAI) -> None:
    # Leases of 60 s: a takeover by expiry would take 20-80 s; the handover is immediate.
    (one, ch1), (_two, ch2) = await replicas("one", 60), await replicas("two", 60)
    fake_openai.script(slow(text("finished during shutdown"), 0.8))
    await ch1.say("first", key="k1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await ch1.say("second", key="k2")  # queued behind the running turn
    await one.shutdown(grace=10)
    assert ch1.texts("a") == ["finished during shutdown"]  # the running turn finished
    await ch2.wait_sent("a", 1, timeout=5)
    assert ch2.texts("a") == ["echo: second"]


async def test_leadership_of_a_job_moves_on_release_and_is_lost_when_taken(
    replicas, pg_store
) -> None:
    (one, _), (two, _) = await replicas("one", 60), await replicas("two", 60)
    first, second = one.leader("telegram:poller:7"), two.leader("telegram:poller:7")
    await asyncio.wait_for(first.__aenter__(), 5)
    waiting = asyncio.ensure_future(second.__aenter__())
    await asyncio.sleep(0.3)
    assert not waiting.done()  # standing by
    await first.__aexit__(None, None, None)
    await asyncio.wait_for(waiting, 5)  # the handover notice, not the 20 s retry
    assert second.leading and not second.lost.is_set()
    # Someone else holds it now (this replica stalled past its lease): lost, stop.
    async with pg_store.pool.acquire() as conn:
        await conn.execute("UPDATE bub_leases SET owner = 'another' WHERE session_id IS NULL")
    await two.lease_keeper.renew_now()
    assert second.lost.is_set() and not second.leading
    # Cancelled while standing by: nothing is held.
    waiting = asyncio.ensure_future(first.__aenter__())
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert one.lease_keeper.held == 0


async def test_a_single_process_always_leads(make_runtime) -> None:
    runtime, _ = make_runtime()
    async with runtime.leader("telegram:poller:1") as lead:
        assert not lead.lost.is_set()
    assert runtime.lease_keeper.held == 0


async def test_a_lapsed_session_of_a_channel_not_run_here_is_left_alone(
    replicas, fake_openai: FakeOpenAI, pg_store
) -> None:
    """`bub-bot run` died mid-turn on the shared database: `serve` replicas (without the
    terminal channel) do not answer its session."""
    runtime, _ = await replicas("serve", 1.5)
    other = RuntimeChannel("cli")
    tape = Tape.for_session(runtime.store, "cli:local", runtime.settings.workspace)
    await runtime.store.append_many(
        tape.name,
        [user_entry(other, "from the terminal", "local", "c1")],
        bootstrap=Tape.bootstrap_anchor(runtime.settings.workspace),
        session_id="cli:local",
    )
    async with pg_store.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO bub_leases VALUES ($1, 'cli:local', 'dead-cli', '-infinity')", tape.name
        )
    left = {tape.name: ("cli:local", "dead-cli", True)}  # not this replica's channel: left
    for _ in range(40):
        if await rows(pg_store) == left:
            break
        await asyncio.sleep(0.1)
    assert await rows(pg_store) == left
    await asyncio.sleep(1.0)  # two more sweeps: not taken again, not run
    assert await rows(pg_store) == left
    assert fake_openai.completion_requests() == []


async def test_a_message_stored_while_shutting_down_is_handed_over(
    replicas, fake_openai: FakeOpenAI
) -> None:
    (one, ch1), (_two, ch2) = await replicas("one", 60), await replicas("two", 60)
    fake_openai.script(slow(text("slow answer"), 1.0))
    await ch1.say("keeps replica one busy", chat="a", key="k1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    stopping = asyncio.ensure_future(one.shutdown(grace=10))
    await asyncio.sleep(0.05)
    # Stored by the stopping replica, which takes no new sessions: handed to replica two.
    assert (await ch1.say("arrived during shutdown", chat="b", key="k2")).new
    assert await ch2.wait_sent("b", 1, timeout=5) == ["echo: arrived during shutdown"]
    await stopping
    assert ch1.texts("a") == ["slow answer"] and ch1.texts("b") == []


async def test_a_lease_that_cannot_be_taken_fails_the_receive_and_the_retry_answers(
    replicas, pg_store, fake_openai: FakeOpenAI
) -> None:
    """Stored, but the lease table is unusable: the platform is not acknowledged, and its
    re-delivery (once the database is back) is answered."""
    _one, ch = await replicas("one")
    async with pg_store.pool.acquire() as conn:
        await conn.execute("ALTER TABLE bub_leases RENAME TO bub_leases_away")
    try:
        with pytest.raises(RuntimeError, match="lease could not be taken"):
            await ch.say("hello?", key="k1")
    finally:
        async with pg_store.pool.acquire() as conn:
            await conn.execute("ALTER TABLE bub_leases_away RENAME TO bub_leases")
    assert fake_openai.completion_requests() == []
    assert (await ch.say("hello?", key="k1")).duplicate
    assert await ch.wait_sent("a", 1) == ["echo: hello?"]


async def test_a_replica_without_the_channel_leaves_a_lapsed_lease_for_one_with_it(
    pg_url, settings, fake_openai
) -> None:
    """Found in review: a replica that does not run a session's channel adopted the dead
    owner's lapsed lease and deleted it, so the replica that runs the channel never saw it."""
    made = []

    async def replica(owner: str, channel_name: str, lease: float):
        conf = settings(lease_seconds=lease)
        store = await open_store(pg_url)
        agent = Agent(conf, ModelClient(conf), default_registry())
        channel = RuntimeChannel(channel_name)
        runtime = Runtime(conf, store, agent, {channel.name: channel}, store.leases(owner, lease))
        channel.runtime = runtime
        made.append((runtime, store, agent))
        await runtime.start()
        return runtime, channel

    try:
        x, channel_x = await replica("X", "test", 6)  # sweeps every 2 s
        await replica("Y", "other", 1.5)  # sweeps every 0.5 s: it finds the lease first
        # A replica running "test" died mid-turn: the message is stored, its lease left.
        tape = Tape.for_session(x.store, "test:a", x.settings.workspace)
        await x.store.append_many(
            tape.name,
            [user_entry(channel_x, "hello from before the crash", "a", "k1")],
            dedupe_keys=["test:k1"],
            bootstrap=Tape.bootstrap_anchor(x.settings.workspace),
            session_id="test:a",
        )
        async with x.store.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO bub_leases VALUES ($1, 'test:a', 'dead', now() + interval '0.2 s')",
                tape.name,
            )
        await channel_x.wait_sent("a", 1, timeout=15)
        assert channel_x.texts("a") == ["echo: hello from before the crash"]
    finally:
        for runtime, store, agent in made:
            await runtime.shutdown(grace=2)
            await agent.model.close()
            await store.close()


async def test_the_sweep_lists_only_sessions_of_the_channels_run_here(pg_store, leases) -> None:
    """Leases left lapsed for replicas that run other channels sort first (they lapsed at
    -infinity): however many there are, they never hide the ones this replica can take."""
    sweeper = leases("sweeper")
    async with pg_store.pool.acquire() as conn:
        for n in range(3):
            await conn.execute(
                "INSERT INTO bub_leases VALUES ($1, $2, '', '-infinity')", f"cli-{n}", f"cli:{n}"
            )
        await conn.execute(
            "INSERT INTO bub_leases VALUES ('tape-t', 'test:a', 'dead', now() - interval '1 s')"
        )
    assert await sweeper.lapsed(limit=2) == [
        LeaseKey("cli-0", "cli:0"),
        LeaseKey("cli-1", "cli:1"),
    ]
    assert await sweeper.lapsed(limit=2, channels=["test"]) == [LeaseKey("tape-t", "test:a")]
    assert await sweeper.lapsed(channels=["web", "slack"]) == []
