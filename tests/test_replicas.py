"""Several `bub-bot serve` processes on one PostgreSQL database, against the fake Bot API and
model: any replica takes any webhook and each message is answered exactly once; a replica
killed mid-turn is taken over when its lease lapses; SIGTERM hands sessions over at once;
Telegram long polling runs on one replica and fails over. (The lease rules themselves are
tested in process in test_leases.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bub_bot.tape import Tape, open_store
from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.fakes.telegram_api import FakeTelegram
from tests.pg import PostgresCluster
from tests.runtime_channel import until
from tests.serve_process import free_port, wait_ready

TOKEN = "123456:REPLICA-secret_token"
HOOK = "https://bot.example.test/tg/hook"
SECRET = "replica-hook-secret"
ROOT = Path(__file__).resolve().parents[1]
FAILOVER_TARGET = 30.0
"""Seconds from a SIGKILL to the answer on a surviving replica (the issue's target)."""


class Replica:
    """One `bub-bot serve` process; its log goes to its own file."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name, self.env, self.log = name, env, log
        self.port = int(env["PORT"])
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Replica:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bub_bot", "serve", env=self.env, stdout=out, stderr=out
            )
        await wait_ready(self.url, self.proc, self.log)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def post_update(self, update: dict[str, Any]) -> int:
        """Deliver an update the way Telegram's webhook does."""
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/tg/hook", json=update, headers=headers) as resp,
        ):
            return resp.status

    async def metric(self, name: str) -> float:
        """One sample of /metrics (0 when absent)."""
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/metrics") as resp:
            body = await resp.text()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username="bub_replica_bot") as fake:
        yield fake


@pytest.fixture
async def replicas(
    tg: FakeTelegram, fake_openai: FakeOpenAI, pg_cluster: PostgresCluster, tmp_path: Path
) -> AsyncIterator[Callable[..., Replica]]:
    """`replica(**env)`: a new `serve` process (not started) on the test's database."""
    database = pg_cluster.fresh_url()
    made: list[Replica] = []

    def make(**extra: str) -> Replica:
        name = f"r{len(made) + 1}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
        env.update(
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            BUB_DATABASE_URL=database,
            BUB_HOME=str(tmp_path / name),  # nothing is kept there: all in the database
            BUB_WORKSPACE=str(tmp_path),  # the same on every replica (tape names use it)
            BUB_HOST="127.0.0.1",
            PORT=str(free_port()),
            BUB_TELEGRAM_TOKEN=TOKEN,
            BUB_TELEGRAM_API_BASE=tg.base_url,
            BUB_TELEGRAM_ALLOW_USERS="*",
            BUB_WEB="off",
            BUB_STREAM="off",
            OPENAI_BASE_URL=fake_openai.base_url,
            OPENAI_API_KEY="sk-test",
            BUB_MODEL="fake-model",
            BUB_MODEL_RETRIES="0",
            BUB_SHUTDOWN_GRACE_SECONDS="15",
            BUB_LEASE_SECONDS="3",
        )
        env.update(extra)
        made.append(Replica(name, env, tmp_path / f"{name}.log"))
        return made[-1]

    yield make
    for replica in made:
        if replica.alive:
            replica.signal(signal.SIGKILL)
            await replica.wait()
    for replica in made:
        log = replica.log.read_text() if replica.log.exists() else ""
        assert "REPLICA-secret_token" not in log, "the bot token leaked into a log"


def webhook(**env: str) -> dict[str, str]:
    return {"BUB_TELEGRAM_WEBHOOK_URL": HOOK, "BUB_TELEGRAM_WEBHOOK_SECRET": SECRET, **env}


wait_until = partial(until, timeout=15.0, interval=0.05)


_update_ids = iter(range(1000, 10**9))


def message(tg: FakeTelegram, user: int, body: str) -> dict[str, Any]:
    """A private message as Telegram posts it to a webhook."""
    return tg.private_text(user, body) | {"update_id": next(_update_ids)}


def answers(tg: FakeTelegram, user: int) -> list[str]:
    return [m["text"] for m in tg.sent_to(user)]


async def answered_on_the_tape(replica: Replica, session: str, timeout: float = 15.0) -> None:
    """Wait until the session's last message is marked done on the shared database (its
    answer's delivery is recorded with that marker)."""
    async with open_store(replica.env["BUB_DATABASE_URL"]) as store:
        tape = Tape.for_session(store, session, Path(replica.env["BUB_WORKSPACE"]))
        deadline = time.monotonic() + timeout
        while not await tape.query(kinds=["event"], names=["inbound.done"], limit=1):
            assert time.monotonic() < deadline, f"{session}: no answer recorded"
            await asyncio.sleep(0.05)


async def test_replicas_share_conversations_and_a_killed_one_is_taken_over(
    replicas, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    users = [101, 102, 103]
    group = [replicas(**webhook()), replicas(**webhook())]
    await asyncio.gather(*(r.start() for r in group))

    async def rounds(count: int, start: int) -> None:
        """Each user sends `count` messages, each to the next replica in turn; every
        message is answered once, in order, whichever replica stored it."""
        for n in range(start, start + count):
            for i, user in enumerate(users):
                update = message(tg, user, f"m{n} from {user}")
                assert await group[(n + i) % len(group)].post_update(update) == 200
            await wait_until(lambda n=n: all(len(tg.sent_to(u)) == n + 1 for u in users))
        for user in users:
            assert answers(tg, user) == [f"echo: m{n} from {user}" for n in range(start + count)]

    await rounds(2, 0)  # two replicas
    group.append(await replicas(**webhook()).start())
    await rounds(3, 2)  # three replicas
    assert len(fake_openai.completion_requests()) == 5 * len(users)

    # The same delivery reaching two replicas at once: stored once, answered once.
    update = message(tg, users[0], "sent twice")
    statuses = await asyncio.gather(group[0].post_update(update), group[1].post_update(update))
    assert statuses == [200, 200]
    await wait_until(lambda: len(tg.sent_to(users[0])) == 6)
    await asyncio.sleep(1.0)  # room for a second answer (there must be none)
    assert answers(tg, users[0])[-1] == "echo: sent twice" and len(tg.sent_to(users[0])) == 6
    duplicates = [await r.metric('bub_inbound_messages_total{channel="telegram",outcome="duplicate"}') for r in group]  # fmt: skip
    assert sum(duplicates) == 1

    # SIGKILL of the replica running a turn: another replica takes the session over when the
    # lease lapses and answers it exactly once.
    fake_openai.script(slow(text("never delivered"), 60))
    requests = len(fake_openai.completion_requests())
    assert await group[1].post_update(message(tg, users[1], "survive a kill")) == 200
    await wait_until(lambda: len(fake_openai.completion_requests()) == requests + 1)
    [running] = [r for r in group if await r.metric("bub_running_turns") == 1]
    running.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert await running.wait() == -signal.SIGKILL
    await wait_until(lambda: len(tg.sent_to(users[1])) == 6, timeout=FAILOVER_TARGET)
    failover = time.monotonic() - killed_at
    await asyncio.sleep(1.0)
    assert answers(tg, users[1])[-1] == "echo: survive a kill"
    assert len(tg.sent_to(users[1])) == 6
    assert len(fake_openai.completion_requests()) == requests + 2
    survivors = [r for r in group if r is not running]
    assert sum([await r.metric('bub_lease_events_total{outcome="takeover"}') for r in survivors]) >= 1  # fmt: skip
    print(f"failover after SIGKILL: {failover:.1f} s (lease 3 s)")


async def test_sigterm_hands_sessions_over_at_once(
    replicas, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    # 60 s leases: a takeover by expiry would take 60 s or more. The answer arriving well
    # within the wait below shows the handover.
    leaving, staying = replicas(**webhook(BUB_LEASE_SECONDS="60")), replicas(**webhook(BUB_LEASE_SECONDS="60"))  # fmt: skip
    await asyncio.gather(leaving.start(), staying.start())
    user = 201
    fake_openai.script(slow(text("finished during shutdown"), 1.5))
    assert await leaving.post_update(message(tg, user, "first")) == 200
    await wait_until(lambda: len(fake_openai.completion_requests()) == 1)
    # Queued behind the running turn on the replica that is about to stop.
    assert await leaving.post_update(message(tg, user, "second")) == 200
    leaving.signal(signal.SIGTERM)
    assert await leaving.wait() == 0  # the running turn finished within the grace period
    # Well before the staying replica's first sweep (every 20 s): the handover notice.
    await wait_until(lambda: len(tg.sent_to(user)) == 2, timeout=10)
    assert answers(tg, user) == ["finished during shutdown", "echo: second"]
    assert await staying.metric('bub_lease_events_total{outcome="handover"}') == 1
    log = leaving.log.read_text()
    assert "shutdown requested" in log and "stopped" in log


async def test_telegram_polling_runs_on_one_replica_and_fails_over(
    replicas, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    job = 'bub_leading{job="telegram:poller:123456"}'
    group = [replicas(), replicas()]
    await asyncio.gather(*(r.start() for r in group))
    for _ in range(100):  # the poller takes the lead just after the channel starts
        leading = [await r.metric(job) for r in group]
        if sum(leading) >= 1:
            break
        await asyncio.sleep(0.1)
    assert sorted(leading) == [0.0, 1.0]
    leader, standby = group if leading[0] else group[::-1]
    user = 301
    tg.push_update(tg.private_text(user, "polled once"))
    await wait_until(lambda: len(tg.sent_to(user)) == 1)
    assert answers(tg, user) == ["echo: polled once"]
    # Killed between Telegram's answer and the record of it, a replica's answer is sent again
    # by whoever resumes it (the crash window of any platform): kill after the record.
    await answered_on_the_tape(leader, f"telegram:{user}")

    # The leader dies: the standby takes the job when its lease lapses and polls.
    leader.signal(signal.SIGKILL)
    await leader.wait()
    tg.push_update(tg.private_text(user, "after the leader died"))
    await wait_until(lambda: len(tg.sent_to(user)) == 2, timeout=FAILOVER_TARGET)
    assert answers(tg, user)[-1] == "echo: after the leader died"
    assert await standby.metric(job) == 1
    # Never two pollers at once: Telegram would have answered one of them 409 Conflict.
    for replica in group:
        assert "telegram.poll conflict" not in replica.log.read_text()

    standby.signal(signal.SIGTERM)
    assert await standby.wait() == 0
    await wait_until(lambda: tg.pending_updates == [])  # confirmed before it let go
    assert len(fake_openai.completion_requests()) == 2
