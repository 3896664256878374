"""Approvals in Slack: real slack-bolt over HTTP against the fake Slack Web API. The request
is posted with Block Kit buttons; signed `block_actions` presses approve (the call runs once),
deny, are refused for a presser who may not decide, are answered "already decided" on a
double press, and a forged press gets 400 and runs nothing."""

from __future__ import annotations

import json
from typing import Any

from bub_bot.approvals.requests import REQUEST
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.slack_api import FakeSlack, app_mention
from tests.runtime_channel import events, until
from tests.test_slack import Harness, StartBot, sid, slack, start_bot

__all__ = ["slack", "start_bot"]  # the fixtures


def counting(bot: Harness) -> list[str]:
    """A `bash` stand-in on the bot's own registry that records each run."""
    runs: list[str] = []

    @bot.bot.runtime.agent.tools.tool("bash")
    async def bash(ctx, command: str) -> str:
        """Run a command."""
        runs.append(command)
        return f"ran {command}"

    return runs


def press(message: dict[str, Any], action: str, user: str, value: str | None = None) -> dict:
    """The `block_actions` payload Slack sends for a press on `message`'s buttons."""
    button = next(
        e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == f"bub_approval_{action}"
    )
    payload = {
        "type": "block_actions",
        "user": {"id": user, "name": user.lower()},
        "team": {"id": "T1"},
        "container": {
            "type": "message",
            "channel_id": "C1",
            "message_ts": message["ts"],
            "is_ephemeral": False,
        },
        "message": message,
        "actions": [
            {
                "action_id": button["action_id"],
                "block_id": "x",
                "value": value or button["value"],
                "type": "button",
                "action_ts": "1700000000.000100",
            }
        ],
    }
    return {"payload": json.dumps(payload)}


async def requested(bot: Harness, slack: FakeSlack, fake: FakeOpenAI) -> tuple[str, dict]:
    fake.script(tool_calls([("bash", {"command": "make deploy"})]), text("deployed"))
    ts = slack.next_ts()
    status, _ = await bot.post(app_mention("C1", "U1", "<@UBOT> deploy please", ts))
    assert status == 200
    await bot.idle(sid("C1", ts))
    [posted] = [p for p in slack.posts_in("C1", ts) if p.get("blocks")]
    return ts, slack.messages[("C1", posted["ts"])]


async def test_press_approve_runs_once(start_bot: StartBot, slack: FakeSlack, fake_openai) -> None:
    bot = await start_bot()
    runs = counting(bot)
    ts, message = await requested(bot, slack, fake_openai)
    assert "make deploy" in message["text"] and runs == []  # a channel: `bash` asks by default
    # A forged press (the digest does not match): 400, nothing stored, nothing runs.
    forged = press(message, "approve", "U1", value="0" * 12 + ":" + "0" * 16)
    assert (await bot.post(forged, form=True))[0] == 400
    assert (await bot.post(press(message, "approve", "U1"), form=True, secret="bad"))[0] == 401
    # Someone else may not decide: an ephemeral note, nothing changes.
    assert (await bot.post(press(message, "approve", "U2"), form=True))[0] == 200
    await until(lambda: len(slack.ephemerals) == 1)
    assert slack.ephemerals[0]["user"] == "U2" and "may not" in slack.ephemerals[0]["text"]
    assert runs == []
    # The requester approves; a double press is answered "already decided".
    assert (await bot.post(press(message, "approve", "U1"), form=True))[0] == 200
    assert (await bot.post(press(message, "approve", "U1"), form=True))[0] == 200
    await until(lambda: [p["text"] for p in slack.posts_in("C1", ts)][-1] == "deployed")
    await bot.idle(sid("C1", ts))
    assert runs == ["make deploy"]
    await until(lambda: len(slack.ephemerals) == 2)
    assert "Already decided" in slack.ephemerals[1]["text"]
    updated = slack.messages[("C1", message["ts"])]
    assert "Approved by u1" in updated["text"]
    assert not any(b["type"] == "actions" for b in updated["blocks"])
    assert len(await events(bot.tape(sid("C1", ts)), REQUEST)) == 1


async def test_press_deny(start_bot: StartBot, slack: FakeSlack, fake_openai) -> None:
    bot = await start_bot()
    runs = counting(bot)
    ts, message = await requested(bot, slack, fake_openai)
    assert (await bot.post(press(message, "deny", "U1"), form=True))[0] == 200
    await until(lambda: [p["text"] for p in slack.posts_in("C1", ts)][-1] == "deployed")
    assert runs == []
    tool = [m for m in fake_openai.last_messages() if m["role"] == "tool"]
    assert tool[0]["content"] == "error: denied by u1; the call did not run."
    assert "Denied by u1" in slack.messages[("C1", message["ts"])]["text"]


async def test_press_over_socket_mode(start_bot: StartBot, slack: FakeSlack, fake_openai) -> None:
    bot = await start_bot(slack_app_token=slack.app_token, slack_signing_secret=None)
    runs = counting(bot)
    await slack.wait_connected()
    fake_openai.script(tool_calls([("bash", {"command": "make deploy"})]), text("deployed"))
    ts = slack.next_ts()
    await slack.wait_for_ack(await slack.socket_send_event(app_mention("C1", "U1", "go", ts)))
    await bot.idle(sid("C1", ts))
    [posted] = [p for p in slack.posts_in("C1", ts) if p.get("blocks")]
    message = slack.messages[("C1", posted["ts"])]
    payload = json.loads(press(message, "approve", "U1")["payload"])
    forged = json.loads(press(message, "approve", "U1", value="0" * 12 + ":" + "0" * 16)["payload"])
    await slack.wait_for_ack(await slack.socket_send_interactive(forged))  # an ignored ack
    assert runs == []
    envelope = await slack.socket_send_interactive(payload)
    await slack.wait_for_ack(envelope)
    # Acknowledged only once stored: the decision is on the tape by now.
    assert len(await events(bot.tape(sid("C1", ts)), "approval.decision")) == 1
    await until(lambda: [p["text"] for p in slack.posts_in("C1", ts)][-1] == "deployed")
    assert runs == ["make deploy"]


async def test_malformed_presses_are_4xx_and_change_nothing(
    start_bot: StartBot, slack: FakeSlack, fake_openai, caplog
) -> None:
    bot = await start_bot()
    runs = counting(bot)
    ts, message = await requested(bot, slack, fake_openai)
    good = json.loads(press(message, "approve", "U1")["payload"])
    action = good["actions"][0]
    rid = action["value"].split(":")[0]
    bad_payloads: list[Any] = [
        "not json {",
        json.dumps([1, 2]),
        json.dumps({**good, "actions": []}),
        json.dumps({**good, "actions": "x"}),
        json.dumps({**good, "actions": [{**action, "value": "nope"}]}),
        json.dumps({**good, "actions": [{**action, "value": 7}]}),
        json.dumps({**good, "user": None}),
        json.dumps({**good, "user": {"id": ["U1"]}}),
        json.dumps({**good, "container": {"channel_id": "C1"}}),
        json.dumps({**good, "container": {**good["container"], "channel_id": "C9"}}),
        json.dumps({**good, "actions": [{**action, "value": "f" * 12 + ":" + "0" * 16}]}),
        json.dumps({**good, "actions": [{**action, "value": rid + ":" + "0" * 16}]}),
    ]
    for raw in bad_payloads:
        status, _ = await bot.post({"payload": raw}, form=True)
        assert 400 <= status < 500, (status, raw)
    assert (await bot.post({"nothing": "here"}, form=True))[0] < 500
    await bot.idle(sid("C1", ts))
    assert runs == []
    tape = bot.tape(sid("C1", ts))
    assert await events(tape, "approval.decision") == []
    # the buttons still work afterwards
    assert (await bot.post(press(message, "approve", "U1"), form=True))[0] == 200
    await until(lambda: [p["text"] for p in slack.posts_in("C1", ts)][-1] == "deployed")
    assert runs == ["make deploy"]
