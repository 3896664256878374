"""`bub-bot serve` as a real process (Procfile style) against the fake Bot API and model:
a SIGKILL mid-turn is answered exactly once after a restart, SIGTERM lets the running turn
finish (grace) and exits 0, and the server binds $PORT and answers /healthz."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.fakes.telegram_api import FakeTelegram
from tests.runtime_channel import until
from tests.serve_process import free_port, wait_ready

SECRET_HALF = "SECRET-token_value"
TOKEN = f"123456:{SECRET_HALF}"
USER = 42


wait_until = partial(until, timeout=15.0, interval=0.05)


PROCFILE = Path(__file__).resolve().parents[1] / "Procfile"


def procfile_web_command() -> list[str]:
    """The `web:` process of the Procfile, split like a shell would."""
    for line in PROCFILE.read_text().splitlines():
        if line.startswith("web:"):
            return shlex.split(line[len("web:") :])
    raise AssertionError("the Procfile has no web process")


def test_procfile_runs_bub_bot_serve() -> None:
    assert procfile_web_command() == ["bub-bot", "serve"]


class Serve:
    """One `bub-bot serve` process; its log goes to a file."""

    def __init__(self, env: dict[str, str], cwd: Path, log: Path) -> None:
        self.env, self.cwd, self.log = env, cwd, log
        self.port = int(env["PORT"])
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        # Exactly what a PaaS runs: the Procfile's web command, with $PORT in the environment.
        cmd = procfile_web_command()
        cmd[0] = str(Path(sys.executable).with_name(cmd[0]))
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, env=self.env, cwd=self.cwd, stdout=out, stderr=out
            )
        await self.ready()

    async def ready(self) -> None:
        assert self.proc is not None
        await wait_ready(f"http://127.0.0.1:{self.port}", self.proc, self.log, timeout=30)

    async def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username="bub_test_bot") as fake:
        yield fake


@pytest.fixture
async def serve(
    tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> AsyncIterator[Callable[[], Serve]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
    env.update(
        BUB_TELEGRAM_TOKEN=TOKEN,
        BUB_TELEGRAM_API_BASE=tg.base_url,
        BUB_TELEGRAM_ALLOW_USERS="*",
        OPENAI_BASE_URL=fake_openai.base_url,
        OPENAI_API_KEY="sk-test",
        BUB_MODEL="fake-model",
        BUB_MODEL_RETRIES="0",
        BUB_HOME=str(tmp_path / "home"),
        BUB_WORKSPACE=str(tmp_path),
        BUB_HOST="127.0.0.1",
        BUB_SHUTDOWN_GRACE_SECONDS="15",
        PORT=str(free_port()),
        PYTHONUNBUFFERED="1",
    )
    made: list[Serve] = []

    def make() -> Serve:
        made.append(Serve(env, tmp_path, tmp_path / "serve.log"))
        return made[-1]

    yield make
    for proc in made:
        proc.kill()
        if proc.proc is not None:
            await proc.wait()
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert SECRET_HALF not in log, "the bot token leaked into the log"


async def test_sigkill_mid_turn_is_answered_once_after_restart(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(slow(text("never delivered"), 60))
    first = serve()
    await first.start()
    tg.push_update(tg.private_text(USER, "what is 6 x 7?"))
    await wait_until(lambda: len(fake_openai.completion_requests()) == 1)
    first.kill()  # SIGKILL while the model is thinking
    assert await first.wait() == -signal.SIGKILL
    assert tg.sent_to(USER) == []

    second = serve()
    await second.start()
    await wait_until(lambda: len(tg.sent_to(USER)) >= 1)
    await asyncio.sleep(0.5)  # room for a duplicate to show up (there must be none)
    [reply] = tg.sent_to(USER)
    assert reply["text"] == "echo: what is 6 x 7?"
    assert len(fake_openai.completion_requests()) == 2
    assert second.proc is not None
    second.proc.send_signal(signal.SIGTERM)
    assert await second.wait() == 0
    assert tg.pending_updates == []  # the update was confirmed, never dropped


async def test_sigterm_finishes_the_running_turn_and_exits_0(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    proc = serve()
    await proc.start()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{proc.port}/healthz") as resp:
            assert resp.status == 200 and (await resp.json())["ok"] is True
    fake_openai.script(slow(text("answered during shutdown"), 1.5))
    tg.push_update(tg.private_text(USER, "slow question"))
    await wait_until(lambda: len(fake_openai.completion_requests()) == 1)
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0
    assert [m["text"] for m in tg.sent_to(USER)] == ["answered during shutdown"]


async def test_the_first_poll_goes_out_before_the_rest_of_the_bot_loads(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """`serve` sends getMe, deleteWebhook and the first getUpdates before the channel (and
    aiogram) is loaded; the channel takes that poll over: a message waiting at start is
    answered once and confirmed."""
    tg.push_update(tg.private_text(USER, "are you up?"))
    proc = serve()
    await proc.start()
    await wait_until(lambda: len(tg.sent_to(USER)) >= 1)
    names = [name for name, _ in tg.calls]
    assert names[:3] == ["getMe", "deleteWebhook", "getUpdates"]
    # The channel registers its commands once loaded: after the poll went out.
    assert names.index("setMyCommands") > names.index("getUpdates")
    assert names.count("getMe") == 1
    await asyncio.sleep(0.3)  # room for a duplicate to show up (there must be none)
    assert [m["text"] for m in tg.sent_to(USER)] == ["echo: are you up?"]
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0
    assert tg.pending_updates == []


async def test_a_rejected_token_still_stops_the_start_with_one_clear_line(
    tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """The early poll gives up quietly on a token the Bot API rejects; the channel's own
    start then says so, as before."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUB_", "OPENAI_"))}
    env.update(
        BUB_TELEGRAM_TOKEN="999:wrong-token",
        BUB_TELEGRAM_API_BASE=tg.base_url,
        OPENAI_BASE_URL=fake_openai.base_url,
        OPENAI_API_KEY="sk-test",
        BUB_HOME=str(tmp_path / "home"),
        BUB_HOST="127.0.0.1",
        PORT=str(free_port()),
    )
    bin_ = Path(sys.executable).with_name("bub-bot")
    proc = await asyncio.create_subprocess_exec(
        str(bin_), "serve", env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "BUB_TELEGRAM_TOKEN was rejected by the Bot API" in out.decode()
    assert "wrong-token" not in out.decode()
    assert tg.calls_of("getUpdates") == []
