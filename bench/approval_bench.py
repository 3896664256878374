"""Approvals: time from a button press to the approved command starting (prints figures,
asserts nothing).

    .venv/bin/python bench/approval_bench.py [--runs 50] [--database postgresql://…]

A real `Bot` with the Slack channel in HTTP mode (slack-bolt, signed requests) in this process,
against the fake Slack Web API and the fake model on loopback; SQLite by default. Each run: a
mention asks for `bash`, which asks for approval in a channel (the default policy), the bot
posts the request with Block Kit buttons; then the clock starts, a signed `block_actions`
press is POSTed to /slack/events, and the clock stops when the tool's handler starts. Printed:
the press's HTTP round trip (stored before the 200) and press-to-start, p50/p95/max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bub_bot.config import load_settings
from bub_bot.server import Bot, BotServer
from channels.slack import SlackChannel
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.slack_api import FakeSlack, app_mention, sign_request

SECRET = "bench-signing-secret"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def press_body(message: dict, user: str) -> bytes:
    button = next(
        e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "bub_approval_approve"
    )
    payload = {
        "type": "block_actions",
        "user": {"id": user, "name": user.lower()},
        "team": {"id": "T1"},
        "container": {"type": "message", "channel_id": "C1", "message_ts": message["ts"]},
        "message": message,
        "actions": [{"action_id": button["action_id"], "value": button["value"]}],
    }
    from urllib.parse import urlencode

    return urlencode({"payload": json.dumps(payload)}).encode()


async def main(runs: int, database: str | None) -> None:
    started: dict[str, float] = {}
    async with FakeOpenAI() as fake, FakeSlack() as slack:
        with tempfile.TemporaryDirectory() as tmp:
            ws = Path(tmp) / "ws"
            ws.mkdir()
            values = {
                "openai_base_url": fake.base_url,
                "openai_api_key": "sk-test",
                "model": "fake-model",
                "workspace": ws,
                "home": Path(tmp) / "home",
                "model_retries": 0,
                "slack_bot_token": slack.bot_token,
                "slack_signing_secret": SECRET,
                "slack_api_url": slack.api_url,
                "slack_rate_channel": "1000/1s",
                "stream": "off",
                "_env_file": None,
            }
            if database:
                values["database_url"] = database
            conf = load_settings(**values)
            bot = await Bot.open(conf, [SlackChannel(conf)])

            @bot.runtime.agent.tools.tool("bash")
            async def bash(ctx, command: str) -> str:
                """Run a command (bench stand-in: records when it starts)."""
                started[command] = time.perf_counter()
                return "ok"

            server = BotServer(bot, host="127.0.0.1", port=0)
            await server.start()
            url = f"{server.url}/slack/events"
            acks: list[float] = []
            starts: list[float] = []
            try:
                async with aiohttp.ClientSession() as http:
                    for n in range(runs):
                        command = f"echo {n}"
                        fake.script(tool_calls([("bash", {"command": command})]), text("done"))
                        ts = slack.next_ts()
                        body = json.dumps(app_mention("C1", "U1", "<@UBOT> go", ts)).encode()
                        async with http.post(url, data=body, headers=sign_request(body, SECRET)):
                            pass
                        session = f"slack:T1:C1:{ts}"
                        await bot.runtime.wait_idle(session, 10)
                        posted = [p for p in slack.posts_in("C1", ts) if p.get("blocks")][-1]
                        message = slack.messages[("C1", posted["ts"])]
                        press = press_body(message, "U1")
                        t0 = time.perf_counter()
                        async with http.post(
                            url, data=press, headers=sign_request(press, SECRET)
                        ) as resp:
                            assert resp.status == 200, resp.status
                        acks.append((time.perf_counter() - t0) * 1000)
                        while command not in started:  # noqa: ASYNC110 (the tool sets it)
                            await asyncio.sleep(0.0005)
                        starts.append((started[command] - t0) * 1000)
                        await bot.runtime.wait_idle(session, 10)
            finally:
                await server.stop()
    kind = "PostgreSQL" if database else "SQLite"
    print(f"approvals through Slack HTTP, {kind}, {runs} presses")
    for label, values_ in (("press -> 200 (stored)", acks), ("press -> command starts", starts)):
        print(
            f"  {label:26s} p50 {pct(values_, 50):6.1f} ms  p95 {pct(values_, 95):6.1f} ms"
            f"  max {max(values_):6.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--database", default=None)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.database))
