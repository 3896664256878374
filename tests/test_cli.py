"""The `bub-bot` command line as a user runs it: real subprocesses against the fake model."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bub_bot.tape import SQLiteTapeStore, Tape
from tests.fakes.openai_server import FakeOpenAI, slow, text, tool_calls
from tests.runtime_channel import done_coverage, events, final_replies, inbound_users, until
from tests.serve_process import free_port

_SCRIPT = Path(sys.executable).with_name("bub-bot")
BUB = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "bub_bot"]


class AnsweringFake(FakeOpenAI):
    """The fake model, also recording which requests it finished answering."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: list[dict[str, Any]] = []

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        response = await super()._completions(request)
        self.answered.append(await request.json())
        return response


@pytest.fixture
async def fake() -> AsyncIterator[AnsweringFake]:
    async with AnsweringFake() as server:
        yield server


def cli_env(fake: FakeOpenAI, tmp_path: Path) -> dict[str, str]:
    """A clean environment: only our settings, pointing at the fake and a fresh home."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BUB_", "OPENAI_")) and k not in ("PORT",)
    }
    (tmp_path / "ws").mkdir(exist_ok=True)
    return {
        **base,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "BUB_MODEL": "fake-model",
        "BUB_MODEL_RETRIES": "0",
        "BUB_HOME": str(tmp_path / "home"),
        "BUB_WORKSPACE": str(tmp_path / "ws"),
    }


@pytest.fixture
def env(fake: AnsweringFake, tmp_path: Path) -> dict[str, str]:
    return cli_env(fake, tmp_path)


async def bub(
    *args: str, env: dict[str, str], cwd: Path, stdin: bytes | None = None, timeout: float = 30
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *BUB,
        *args,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def reason_lines(stderr: str) -> list[str]:
    """The lines bub-bot itself prints (`bub-bot: ...`), without log records."""
    return [line for line in stderr.splitlines() if line.startswith("bub-bot:")]


async def test_run_prints_the_reply(env, tmp_path, fake) -> None:
    code, out, err = await bub("run", "hello there", env=env, cwd=tmp_path)
    assert code == 0, err
    assert out == "echo: hello there\n"
    assert len(fake.answered) == 1


async def test_run_with_the_model_down_fails_with_one_line(env, tmp_path) -> None:
    env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{free_port()}/v1"
    code, _out, err = await bub("run", "hello", env=env, cwd=tmp_path)
    assert code != 0
    [line] = reason_lines(err)
    assert "could not reach the model" in line


async def test_chat_over_a_pipe_with_a_command(env, tmp_path, fake) -> None:
    code, out, err = await bub(
        "chat", env=env, cwd=tmp_path, stdin=b"first line\n/status\nsecond line\n"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "echo: first line"
    assert lines[1].startswith("Entries: ")
    assert "Last anchor: session/start" in lines
    assert lines[-1] == "echo: second line"
    assert [m["content"] for m in fake.answered[-1]["messages"] if m["role"] == "user"] == [
        "first line",
        "second line",
    ]


async def test_chat_in_a_terminal_exits_cleanly_on_ctrl_c(env, tmp_path) -> None:
    """At the prompt, Ctrl-C (SIGINT) ends the chat at once, exit 0."""
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    proc = await asyncio.create_subprocess_exec(
        *BUB, "chat", env=env, cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    seen = b""

    async def expect(needle: bytes, timeout: float = 20) -> None:
        nonlocal seen
        async with asyncio.timeout(timeout):
            while needle not in seen:
                try:
                    seen += os.read(master, 4096)
                except BlockingIOError:
                    await asyncio.sleep(0.02)

    try:
        await expect(b"> ")
        os.write(master, b"hello\r")
        await expect(b"echo: hello")
        await expect(b"> ")
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(master)
    assert b"session cli:local" in seen


async def test_config_error_names_the_setting(env, tmp_path) -> None:
    env["BUB_MAX_STEPS"] = "abc"
    code, out, err = await bub("run", "hello", env=env, cwd=tmp_path)
    assert code == 2
    assert out == ""
    [line] = err.strip().splitlines()
    assert "BUB_MAX_STEPS" in line


async def test_serve_without_a_channel_names_the_settings(env, tmp_path) -> None:
    env["BUB_WEB"] = "off"  # without it the web chat is the channel
    code, _out, err = await bub("serve", env=env, cwd=tmp_path)
    assert code == 2
    for name in ("BUB_TELEGRAM_TOKEN", "BUB_SLACK_BOT_TOKEN", "bub-bot chat", "BUB_WEB"):
        assert name in err


async def test_tapes_list_show_export(env, tmp_path) -> None:
    code, _, err = await bub("run", "note this", "--session", "demo", env=env, cwd=tmp_path)
    assert code == 0, err
    (
        (lcode, listed, _),
        (scode, shown, _),
        (ecode, exported, _),
        (mcode, _, missing),
    ) = await asyncio.gather(
        bub("tapes", "list", env=env, cwd=tmp_path),
        bub("tapes", "show", "cli:demo", "--all", env=env, cwd=tmp_path),
        bub("tapes", "export", "cli:demo", env=env, cwd=tmp_path),
        bub("tapes", "show", "cli:nobody", env=env, cwd=tmp_path),
    )
    assert (lcode, scode, ecode, mcode) == (0, 0, 0, 1)
    assert "cli:demo" in listed
    assert "user: note this" in shown
    assert "assistant: echo: note this" in shown
    assert "anchor" in shown and "session/start" in shown
    rows = [json.loads(line) for line in exported.splitlines()]
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    assert {"kind", "payload", "meta", "date"} <= set(rows[0])
    assert any(r["payload"].get("content") == "note this" for r in rows)
    assert "cli:nobody" in missing


async def test_chat_killed_mid_turn_answers_once_on_next_start(env, tmp_path, fake) -> None:
    fake.script(slow(text("this answer never arrives"), 30))
    first = await asyncio.create_subprocess_exec(
        *BUB,
        "chat",
        env=env,
        cwd=tmp_path,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert first.stdin is not None
        first.stdin.write(b"remember the milk\n")
        await first.stdin.drain()
        await until(lambda: len(fake.completion_requests()) == 1, timeout=20)
    finally:
        first.send_signal(signal.SIGKILL)
        await first.communicate()
    assert first.returncode == -signal.SIGKILL
    await asyncio.sleep(0.1)  # the fake notices the dropped connection
    assert fake.answered == []

    code, out, err = await bub("chat", env=env, cwd=tmp_path)  # stdin empty: resume, then exit
    assert code == 0, err
    assert out == "echo: remember the milk\n"
    answered = [
        body
        for body in fake.answered
        if any(m.get("content") == "remember the milk" for m in body["messages"])
    ]
    assert len(answered) == 1
    assert len(fake.completion_requests()) == 2

    async with SQLiteTapeStore.open(Path(env["BUB_HOME"]) / "bub.db") as store:
        tape = Tape.for_session(store, "cli:local", Path(env["BUB_WORKSPACE"]))
        users = await inbound_users(tape)
        assert [u.payload["content"] for u in users] == ["remember the milk"]
        assert [r.payload["content"] for r in await final_replies(tape)] == [
            "echo: remember the milk"
        ]
        assert (await done_coverage(tape, [users[0].id])) == {users[0].id: 1}
        assert len(await events(tape, "reply.sent")) == 1


async def test_chat_asks_y_n_for_an_approval(env, tmp_path, fake) -> None:
    env["BUB_APPROVE"] = "schedule.add=ask"
    call = ("schedule_add", {"prompt": "stretch", "in_seconds": 600})
    fake.script(tool_calls([call]), text("Scheduled."), tool_calls([call]), text("Skipped."))
    code, out, err = await bub(
        "chat", env=env, cwd=tmp_path, stdin=b"remind me\ny\nonce more\nn\n/schedules\n"
    )
    assert code == 0, err
    assert out.count("Approval needed") == 2
    assert "Approved by you" in out and "Denied by you" in out
    assert "Scheduled." in out and "Skipped." in out
    tools = [m["content"] for m in fake.answered[-1]["messages"] if m["role"] == "tool"]
    assert "stretch" in tools[0] and tools[-1] == "error: denied by you; the call did not run."
    assert out.count("stretch") >= 3  # two requests and the one job /schedules lists
