"""Operating bub-bot: /metrics after a scripted conversation, doctor, secrets never logged."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from bub_bot.config import Settings
from bub_bot.doctor import doctor
from bub_bot.logs import configure
from bub_bot.server import Bot, BotServer
from channels.cli import CliChannel
from tests.fakes import openai_server as oai
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram
from tests.raw_http import send_raw


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        got = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
        if got == wanted:
            return float(match.group(3))
    return 0.0


async def scrape(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics", headers=headers) as r:
        return r.status, await r.text()


async def conversation(bot: Bot, channel: CliChannel, *texts: str) -> None:
    for text in texts:
        inbound = channel.inbound(text, "metrics")
        await bot.runtime.receive(inbound)
        await bot.runtime.wait_idle(inbound.session_id, timeout=10)


async def test_metrics_move_by_the_right_amounts(
    fake_openai: FakeOpenAI, settings: Callable[..., Settings]
) -> None:
    conf = settings(spill_threshold=10)
    channel = CliChannel(out=io.StringIO())
    bot = await Bot.open(conf, [channel])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    try:
        status, before = await scrape(server.url)
        assert status == 200
        assert metric(before, "bub_turns_total", outcome="ok") == 0
        fake_openai.script(
            oai.tool_calls([("tape_info", {}), ("no_such_tool", {})]),
            oai.text(
                "first answer",
                usage={"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
            ),
            oai.server_error(500),
        )
        await conversation(bot, channel, "hello", "again")
        # a re-delivery of the same message counts as a duplicate
        again = channel.inbound("hello", "metrics")
        await bot.runtime.receive(again)
        await bot.runtime.receive(again)
        await bot.runtime.wait_idle(again.session_id, timeout=10)
        await conversation(bot, channel, "/status")
        _, after = await scrape(server.url)
    finally:
        await server.stop()

    assert metric(after, "bub_inbound_messages_total", channel="cli", outcome="new") == 4
    assert metric(after, "bub_inbound_messages_total", channel="cli", outcome="duplicate") == 1
    assert metric(after, "bub_turns_total", outcome="ok") == 2  # "hello" and the re-sent one
    assert metric(after, "bub_turns_total", outcome="error") == 1  # "again" hit the 500
    assert metric(after, "bub_model_calls_total", outcome="ok") == 3
    assert metric(after, "bub_model_calls_total", outcome="error") == 1
    assert metric(after, "bub_tool_calls_total", tool="tape.info", outcome="ok") == 1
    assert metric(after, "bub_tool_calls_total", tool="unknown", outcome="error") == 1
    assert "no_such_tool" not in after  # a made-up name never becomes a label
    assert metric(after, "bub_spills_total", outcome="ok") >= 1  # tape.info output > 40 chars
    assert metric(after, "bub_tokens_total", direction="out") >= 7
    assert metric(after, "bub_model_latency_seconds_count") == 3
    assert metric(after, "bub_replies_total", channel="cli", outcome="sent") == 4
    assert metric(after, "bub_commands_total", command="status") == 1
    assert metric(after, "bub_running_turns") == 0
    assert metric(after, "bub_seconds_since_last_inbound", channel="cli") >= 0


async def test_metrics_token_is_required_when_set(settings: Callable[..., Settings]) -> None:
    bot = await Bot.open(settings(metrics_token="m-secret-123"), [CliChannel(out=io.StringIO())])
    server = BotServer(bot, host="127.0.0.1", port=0)
    await server.start()
    try:
        assert (await scrape(server.url))[0] == 401
        assert (await scrape(server.url, "wrong"))[0] == 401
        # Header bytes that are not UTF-8 (sent raw: aiohttp's client drops them): 401, not 500.
        for raw in (b"Bearer \xff", b"Bearer m-secret-123\xe9"):
            status, _ = await send_raw(server.url, "GET", "/metrics", [b"Authorization: " + raw])
            assert status == 401, raw
        status, body = await scrape(server.url, "m-secret-123")
        assert status == 200 and "bub_turns_total" in body
    finally:
        await server.stop()


# -- doctor ------------------------------------------------------------------------------------
TG_TOKEN = "123456:AAH-real-looking-telegram-secret"


@pytest.fixture
async def fakes():
    async with (
        FakeOpenAI() as model,
        FakeTelegram(token=TG_TOKEN) as tg,
        FakeSlack(bot_token="xoxb-1-real-looking", app_token="xapp-1-real-looking") as slack,
    ):
        yield model, tg, slack


def doctor_settings(settings_factory, fakes, **overrides) -> Settings:
    model, tg, slack = fakes
    values = {
        "openai_base_url": model.base_url,
        "telegram_token": TG_TOKEN,
        "telegram_api_base": tg.base_url,
        "slack_bot_token": "xoxb-1-real-looking",
        "slack_app_token": "xapp-1-real-looking",
        "slack_api_url": slack.api_url,
    }
    values.update(overrides)
    return settings_factory(**values)


async def run_doctor(conf: Settings) -> tuple[int, str]:
    out = io.StringIO()
    code = await doctor(conf, out=out)
    return code, out.getvalue()


async def test_doctor_all_green_then_each_failure(settings, fakes, tmp_path: Path) -> None:
    code, text = await run_doctor(doctor_settings(settings, fakes))
    assert code == 0, text
    lines = text.splitlines()
    assert [line.split()[1] for line in lines] == [
        "settings",
        "storage",
        "model",
        "telegram",
        "slack",
        "bash",
    ]
    assert all(line.startswith("ok") for line in lines)
    assert lines[-1].startswith("ok    bash      sandbox bwrap")
    assert "Socket Mode connection opens" in text

    code, text = await run_doctor(doctor_settings(settings, fakes, model="no-such-model"))
    assert code == 1
    assert re.search(r"^FAIL  model .*no-such-model.*fix: set BUB_MODEL", text, re.M), text

    code, text = await run_doctor(doctor_settings(settings, fakes, telegram_token="999:wrong"))
    assert code == 1
    assert re.search(r"^FAIL  telegram .*fix: check BUB_TELEGRAM_TOKEN", text, re.M), text

    code, text = await run_doctor(doctor_settings(settings, fakes, slack_bot_token="xoxb-wrong"))
    assert code == 1
    assert re.search(r"^FAIL  slack .*invalid_auth.*fix: check BUB_SLACK_BOT_TOKEN", text, re.M), (
        text
    )

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, text = await run_doctor(doctor_settings(settings, fakes, home=blocker / "home"))
    assert code == 1
    assert re.search(r"^FAIL  storage .*a-file.*fix: make BUB_HOME", text, re.M), text
    for secret in (TG_TOKEN, "AAH-real-looking-telegram-secret", "xoxb-1-real-looking", "sk-test"):
        assert secret not in text


# -- secrets -----------------------------------------------------------------------------------
async def test_no_secret_reaches_logs_or_tape(fake_openai: FakeOpenAI, settings) -> None:
    secrets = {
        "openai_api_key": "sk-proj-Xq7Rz2Lm9Kt4Vb8Nw1Yc6Hd3",
        "metrics_token": "metrics-Tk9Lp2Qz7Rx4",
    }
    fake_openai.auth_key = secrets["openai_api_key"]
    conf = settings(log_level="DEBUG", **secrets)
    stream = io.StringIO()
    handler = configure(conf, stream=stream)
    # A library that logs a request with the key in it must not leak it either.
    logging.getLogger("some.library").debug(
        "calling with Authorization: Bearer %s", secrets["openai_api_key"]
    )
    channel = CliChannel(out=io.StringIO())
    bot = await Bot.open(conf, [channel])
    try:
        fake_openai.script(oai.tool_calls([("tape_info", {})]), oai.text("all done"))
        await conversation(bot, channel, "please check the tape", "/status")
        tapes = [row.name for row in await bot.store.list_tapes(include_all=True)]
        dumped = []
        for name in tapes:
            dumped.extend(e.to_json() for e in await bot.store.query(name))
    finally:
        await bot.close()
        logging.getLogger().removeHandler(handler)
    assert channel.sent[0] == "all done"
    assert channel.sent[1].startswith("Entries:")
    logs = stream.getvalue()
    assert "turn.end" in logs and "inbound.new" in logs  # the turn was logged
    assert "[redacted]" in logs
    tape_text = repr(dumped)
    assert "please check the tape" in tape_text
    for value in secrets.values():
        assert value not in logs
        assert value not in tape_text


def test_every_label_set_is_bounded() -> None:
    from bub_bot.metrics import LABEL_VALUES_MAX, Metrics

    metrics = Metrics()
    for n in range(LABEL_VALUES_MAX * 3):
        metrics.on_agent("tool_call", {"tool": f"aaa_injected_{n}", "ok": False})
        metrics.on_runtime("command", {"name": f"cmd{n}"})
        # main's labels since: refusal reasons, usage per model, subagent runs
        metrics.on_runtime("refusal", {"reason": f"runtime{n}"})
        metrics.on_agent("refusal", {"reason": f"agent{n}"})
        metrics.on_agent("usage", {"channel": "web", "model": f"m{n}", "tokens_in": 1})
        metrics.on_agent("subagent", {"mode": f"mode{n}", "status": "ok"})
    text = generate_latest(metrics.registry).decode()
    tools = {
        line.split('tool="')[1].split('"')[0] for line in text.splitlines() if 'tool="' in line
    }
    assert len(tools) <= LABEL_VALUES_MAX + 1 and "other" in tools
    assert text.count("bub_commands_total{") <= LABEL_VALUES_MAX + 1
    for name in ("bub_refusals_total{", "bub_usage_cost_dollars_total{", "bub_subagents_total{"):
        assert 0 < text.count(name) <= LABEL_VALUES_MAX + 1, name
