"""Jobs fire exactly once across replicas and crashes: two runtimes on one PostgreSQL database
racing for the same due times (in process, a clock the test moves), and a `bub-bot serve`
process killed with SIGKILL just before a job's time and started again after it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent import Agent, ModelClient, default_registry
from bub_bot.agent.schedule_tools import register_schedule_tools
from bub_bot.runtime import Runtime
from bub_bot.schedules.book import Place
from bub_bot.tape import Tape, TapeStore, open_store
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.telegram_api import FakeTelegram
from tests.runtime_channel import RuntimeChannel, until
from tests.schedule_harness import Clock, add_call, scheduled
from tests.serve_process import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "123456:SCHEDULE-secret_token"
USER = 42


@pytest.fixture
async def replicas(pg_url: str, settings: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """`replica(owner, clock)`: a started Runtime with its own store, leases and test channel,
    all on one PostgreSQL database (each one stands for a `serve` process)."""
    made: list[tuple[Runtime, TapeStore, Agent]] = []

    async def make(
        owner: str, clock: Callable[[], float] = time.time
    ) -> tuple[Runtime, RuntimeChannel]:
        conf = settings()
        store = await open_store(pg_url)
        agent = Agent(conf, ModelClient(conf), default_registry())
        channel = RuntimeChannel()
        runtime = Runtime(
            conf, store, agent, {channel.name: channel}, store.leases(owner, 15), clock
        )
        register_schedule_tools(agent.tools, runtime.schedules)
        channel.runtime = runtime
        made.append((runtime, store, agent))
        await runtime.start()
        return runtime, channel

    yield make
    for runtime, store, agent in made:
        await runtime.shutdown(grace=2)
        await agent.model.close()
        await store.close()


async def test_two_replicas_fire_each_due_time_once(replicas, fake_openai: FakeOpenAI) -> None:
    clock = Clock()
    (one, ch1), (two, ch2) = await replicas("one", clock), await replicas("two", clock)
    fired: list[str] = []
    for runtime in (one, two):
        runtime.observers.append(
            lambda event, data: fired.append(data["outcome"]) if event == "job" else None
        )
    chats = ["a", "b", "c"]
    for chat in chats:
        session = f"test:{chat}"
        tape = Tape.for_session(one.store, session, one.settings.workspace)
        place = Place(
            session, tape.name, str(one.settings.workspace), "test", {"chat": chat}, {"id": "u1"}
        )
        await one.schedules.add(place, f"tick in {chat}", cron="*/5 * * * *")
    dues: list[float] = []
    for n in range(20):
        [due] = {j.due for j in await two.store.jobs()}
        dues.append(due)
        clock.advance(due - clock.now + 0.2)
        # Both replicas look at once, twice over (their loops, and a direct call each).
        one.timer.poke()
        two.timer.poke()
        await asyncio.gather(one.timer.fire_due(), two.timer.fire_due())
        for chat in chats:
            await until(lambda c=chat, n=n: len(ch1.texts(c)) + len(ch2.texts(c)) > n, timeout=10)
    await asyncio.sleep(0.3)
    assert len(set(dues)) == 20 and dues == sorted(dues)
    for chat in chats:
        sent = ch1.texts(chat) + ch2.texts(chat)
        assert len(sent) == 20, (chat, sent)
        tape = Tape.for_session(one.store, f"test:{chat}", one.settings.workspace)
        entries = await scheduled(tape)
        assert len(entries) == 20 and len({e.meta["due"] for e in entries}) == 20
    assert len(fake_openai.completion_requests()) == 60
    assert len(fired) == 60  # firings over both replicas: none twice, none skipped


async def test_a_job_added_on_one_replica_wakes_the_timer_of_another(
    replicas, fake_openai: FakeOpenAI
) -> None:
    """Real clock: replica two's timer sleeps (nothing is due) until replica one's NOTIFY."""
    (one, _ch1), (_two, ch2) = await replicas("one"), await replicas("two")
    await one.timer.stop()  # only replica two may fire it
    await asyncio.sleep(0.2)  # two's timer has looked and is asleep
    tape = Tape.for_session(one.store, "test:a", one.settings.workspace)
    place = Place("test:a", tape.name, str(one.settings.workspace), "test", {"chat": "a"})
    job = await one.schedules.add(place, "wake up", in_seconds=1)
    # Replica two's timer would otherwise look again only after timer.SAFETY_SECONDS (60 s).
    await ch2.wait_sent("a", 1, timeout=8)
    [entry] = await scheduled(tape)
    assert entry.meta["job"] == job.id


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username="bub_schedule_bot") as fake:
        yield fake


async def test_a_job_due_while_the_bot_was_killed_fires_once_late_after_the_restart(
    tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        BUB_HOME=str(tmp_path / "home"),
        BUB_WORKSPACE=str(tmp_path),
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
        BUB_SCHEDULE_GRACE_SECONDS="1",
    )
    log = tmp_path / "serve.log"

    async def serve() -> asyncio.subprocess.Process:
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bub_bot", "serve", env=env, stdout=out, stderr=out
            )
        await wait_ready(f"http://127.0.0.1:{env['PORT']}", proc, log, timeout=30)
        return proc

    proc = await serve()
    try:
        fake_openai.script(add_call(prompt="Time to stretch", in_seconds=4), text("Will do."))
        tg.push_update(tg.private_text(USER, "remind me in 4 seconds"))
        await until(lambda: len(tg.sent_to(USER)) == 1, timeout=15, interval=0.05)
        asked_at = time.monotonic()
        # SIGKILL a second before the job's time (it was stored when the tool ran).
        await asyncio.sleep(max(0.0, 3 - (time.monotonic() - asked_at)))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await asyncio.sleep(2.5)  # past its time while nothing runs
        assert len(tg.sent_to(USER)) == 1
        proc = await serve()
        await until(lambda: len(tg.sent_to(USER)) == 2, timeout=15, interval=0.05)
        await asyncio.sleep(1.5)  # nothing more comes
        sent = tg.sent_to(USER)
        assert len(sent) == 2, [m["text"] for m in sent]
        late = sent[1]["text"]
        assert late.startswith("echo: [Scheduled job ") and late.endswith("Time to stretch")
        assert "late: the bot was not running at the time" in late
        assert "job.fired" in log.read_text()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
