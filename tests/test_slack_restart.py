"""`bub-bot serve` in a subprocess, Slack HTTP mode: SIGKILL in the middle of a turn, start
again, and the mention is answered exactly once, in the workspace the conversation started in
(BUB_WORKSPACE_MAP), even though the map changed meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import IO

import aiohttp

from bub_bot.tape import SQLiteTapeStore, Tape
from tests.fakes.openai_server import FakeOpenAI, slow, text
from tests.fakes.slack_api import FakeSlack, app_mention, sign_request
from tests.serve_process import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
SECRET = "restart-signing-secret"


def _env(tmp_path: Path, slack: FakeSlack, model: FakeOpenAI, port: int) -> dict[str, str]:
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BUB_", "OPENAI_", "SLACK_")) and k != "PORT"
    }
    return {
        **inherited,
        "PYTHONPATH": str(ROOT),
        "BUB_HOME": str(tmp_path / "home"),
        "BUB_WORKSPACE": str(tmp_path),
        "BUB_HOST": "127.0.0.1",
        "PORT": str(port),
        "BUB_MODEL": "fake-model",
        "BUB_MODEL_RETRIES": "0",
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-test",
        "BUB_SLACK_BOT_TOKEN": slack.bot_token,
        "BUB_SLACK_SIGNING_SECRET": SECRET,
        "BUB_SLACK_API_URL": slack.api_url,
        "BUB_SHUTDOWN_GRACE_SECONDS": "10",
    }


async def _serve(env: dict[str, str], cwd: Path, log: IO[bytes]) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bub_bot", "serve", cwd=cwd, env=env, stdout=log, stderr=log
    )
    try:
        await wait_ready(f"http://127.0.0.1:{env['PORT']}", proc, timeout=15)
    except AssertionError:
        proc.kill()
        raise
    return proc


async def _post(port: int, payload: dict, headers: dict[str, str] | None = None) -> int:
    body = json.dumps(payload).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{port}/slack/events",
            data=body,
            headers={**sign_request(body, SECRET), **(headers or {})},
        ) as resp,
    ):
        return resp.status


def _workspace_map(tmp_path: Path, target: Path) -> Path:
    path = tmp_path / f"map-{target.name}.json"
    rule = {"match": "slack:T1:C1:*", "path": str(target)}
    path.write_text(json.dumps({"workspaces": [rule]}))
    return path


async def test_sigkill_mid_turn_then_restart_answers_once(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    mapped, moved = tmp_path / "backend", tmp_path / "elsewhere"
    for directory in (mapped, moved):
        directory.mkdir()
        (directory / "AGENTS.md").write_text(f"You work in the {directory.name.upper()} repo.")
    async with FakeSlack() as slack:
        port = free_port()
        env = _env(tmp_path, slack, fake_openai, port)
        env["BUB_WORKSPACE_MAP"] = str(_workspace_map(tmp_path, mapped))
        log_path = tmp_path / "serve.log"
        fake_openai.script(slow(text("never delivered"), 60))
        with log_path.open("ab") as log:
            proc = await _serve(env, tmp_path, log)
            try:
                ts = slack.next_ts()
                event = app_mention("C1", "U1", "survive a crash", ts)
                assert await _post(port, event) == 200
                # The turn is running: the model has the request and will not answer in time.
                for _ in range(200):
                    if fake_openai.completion_requests():
                        break
                    await asyncio.sleep(0.05)
                assert len(fake_openai.completion_requests()) == 1
            finally:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
            assert slack.posts == []

            # The map changes before the restart: it applies to new conversations only.
            env["BUB_WORKSPACE_MAP"] = str(_workspace_map(tmp_path, moved))
            proc = await _serve(env, tmp_path, log)
            try:
                await slack.wait_for(lambda: len(slack.posts) >= 1, timeout=20)
                # Slack re-delivering the event to the new process changes nothing.
                headers = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
                assert await _post(port, event, headers) == 200
            finally:
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 20) == 0

        assert [(p["text"], p.get("thread_ts")) for p in slack.posts] == [
            ("echo: survive a crash", ts)
        ]
        resumed = fake_openai.completion_requests()[-1].body["messages"][0]["content"]
        assert "BACKEND repo" in resumed and "ELSEWHERE" not in resumed
        async with SQLiteTapeStore.open(tmp_path / "home" / "bub.db") as store:
            tape = Tape.for_session(store, f"slack:T1:C1:{ts}", mapped)
            entries = await tape.query()
        users = [e for e in entries if e.kind == "message" and e.payload["role"] == "user"]
        sent = [e for e in entries if e.kind == "event" and e.payload["name"] == "reply.sent"]
        assert len(users) == 1 and len(sent) == 1, log_path.read_text()
