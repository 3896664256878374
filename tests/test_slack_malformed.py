"""Hostile and malformed requests on the Slack events endpoint (HTTP) and over Socket Mode.

Every request below passes or fails the signature check on purpose; none of them may be
stored, reach the model, get a 5xx or log an ERROR, and each one is counted in the metrics.
A genuine message is still answered afterwards. The bot runs in-process (real slack-bolt in a
real `BotServer`) against the fake Slack API and the fake model, like tests/test_slack.py.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pytest

import tests.test_slack as slack_tests
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_api import FakeSlack, app_mention, dm_message, sign_request
from tests.fakes.slack_api import slash_command_form as command_form
from tests.test_slack import SECRET, StartBot, sid

# The Slack channel tests' fixtures, shared (assigned, not imported, so they are not re-bound).
slack = slack_tests.slack
start_bot = slack_tests.start_bot

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
DROP = object()
"""As a field value in `mention(...)`: leave the field out."""
TS = f"{int(time.time())}.000100"
DEPTH = 100_000


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    body: bytes
    status: int
    outcome: str = "malformed"
    """The `bub_inbound_messages_total` outcome this request counts as."""
    content_type: str = JSON
    timestamp: str | None = None
    """X-Slack-Request-Timestamp as sent; the body is signed over it (None: now)."""
    signature: str | None = None
    """X-Slack-Signature instead of the correct one ("" leaves the header out)."""


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def mention(**changes: Any) -> dict[str, Any]:
    """A validly shaped app_mention that would be answered, with event fields changed."""
    body = app_mention("C1", "U1", "hello", TS)
    for key, value in changes.items():
        if value is DROP:
            body["event"].pop(key, None)
        else:
            body["event"][key] = value
    return body


def envelope(**changes: Any) -> dict[str, Any]:
    """The same mention with envelope (outer) fields changed."""
    body = app_mention("C1", "U1", "hello", TS)
    for key, value in changes.items():
        if value is DROP:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def form(fields: dict[str, str]) -> bytes:
    return urllib.parse.urlencode(fields).encode()


def command(**changes: Any) -> bytes:
    fields = command_form("/bub-status", "", "C1", "U1")
    for key, value in changes.items():
        if value is DROP:
            fields.pop(key, None)
        else:
            fields[key] = value
    return form(fields)


GOOD = js(mention())
NESTED = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH

BODIES = [
    # Not a JSON object or a form Slack would send: 400.
    Case("truncated json", b'{"type": "event_callback", "event": {', 400),
    Case("not utf-8", GOOD.replace(b"hello", b"hel\xff\xfelo"), 400),
    Case("deeply nested object", NESTED, 400),
    Case(
        "deeply nested event",
        b'{"type":"event_callback","event":' + b"[" * DEPTH + b"]" * DEPTH + b"}",
        400,
    ),
    Case("json array", b"[1, 2, 3]", 400),
    Case("json null", b"null", 400),
    Case("json string", b'"event_callback"', 400),
    Case("empty body", b"", 400),
    Case("NaN constant", GOOD.replace(b'"event_time": ', b'"event_time": NaN, "x": '), 400),
    Case("json labelled as form", GOOD, 400, content_type=FORM),
    Case("unknown shape", js({"hello": "world"}), 400),
    Case("type not a string", js({"type": {"a": 1}, "event": mention()["event"]}), 400),
    Case("event a string", js(envelope(event="hi")), 400),
    Case("event a list", js(envelope(event=[mention()["event"]])), 400),
    Case("event null", js(envelope(event=None)), 400),
    Case("event missing", js(envelope(event=DROP)), 400),
    Case("event type missing", js(mention(type=DROP)), 400),
    Case("event type a list", js(mention(type=["app_mention"])), 400),
    Case("url_verification without challenge", js({"type": "url_verification"}), 400),
    Case(
        "url_verification challenge object", js({"type": "url_verification", "challenge": {}}), 400
    ),
    # Forms: slash commands (and interactivity payloads, which this bot does not use).
    Case("form payload not json", form({"payload": "{not json"}), 400, content_type=FORM),
    Case("form payload a list", form({"payload": "[1]"}), 400, content_type=FORM),
    Case("form payload nested", form({"payload": "[" * DEPTH}), 400, content_type=FORM),
    Case("form garbage", b"%%%&&&===&a", 400, content_type=FORM),
    Case(
        "form not utf-8", command(text="x").replace(b"text=x", b"text=\xff"), 400, content_type=FORM
    ),
    Case("command without user", command(user_id=DROP), 400, content_type=FORM),
    Case("command without channel", command(channel_id=DROP), 400, content_type=FORM),
    Case("command with a colon channel", command(channel_id="C1:x"), 400, content_type=FORM),
    Case("command without slash", command(command="bub-status"), 400, content_type=FORM),
    Case(
        "command as json list",
        js({**command_form("/bub-status", "", "C1", "U1"), "command": ["/status"]}),
        400,
    ),
    Case(
        "command user as json object",
        js({**command_form("/bub-status", "", "C1", "U1"), "user_id": {"id": "U1"}}),
        400,
    ),
]

HEADERS = [
    # Not signed, or signed with a timestamp nobody can read: 401 like a wrong signature.
    Case("timestamp letters", GOOD, 401, "unauthorized", timestamp="abc"),
    Case("timestamp empty", GOOD, 401, "unauthorized", timestamp=""),
    Case("timestamp exponent", GOOD, 401, "unauthorized", timestamp="1.7e9"),
    Case("timestamp fraction", GOOD, 401, "unauthorized", timestamp=f"{int(time.time())}.5"),
    Case("timestamp huge", GOOD, 401, "unauthorized", timestamp="9" * 40),
    Case("timestamp negative", GOOD, 401, "unauthorized", timestamp="-1"),
    Case("timestamp hex", GOOD, 401, "unauthorized", timestamp="0x10"),
    Case("timestamp stale", GOOD, 401, "unauthorized", timestamp=str(int(time.time()) - 3600)),
    Case("signature garbage", GOOD, 401, "unauthorized", signature="v0=zz"),
    Case("signature missing", GOOD, 401, "unauthorized", signature=""),
    Case(
        "signature of another body",
        GOOD,
        401,
        "unauthorized",
        signature=sign_request(b"{}", SECRET)["X-Slack-Signature"],
    ),
]

EVENTS = [
    # Validly signed event_callbacks whose event is not a usable message: acknowledged (so
    # Slack does not retry them), not stored, no model call.
    Case("channel an object", js(mention(channel={"id": "C1"})), 200),
    Case("user a list", js(mention(user=["U1"])), 200),
    Case("user a list with id", js(mention(user=["id"])), 200),
    Case("ts an object", js(mention(ts={"t": 1})), 200),
    Case("text an object", js(mention(text={"text": "<@UBOT> hi"})), 200),
    Case("text a list", js(mention(text=["<@UBOT> hi"])), 200),
    Case("thread_ts a list", js(mention(thread_ts=[TS])), 200),
    Case("channel missing", js(mention(channel=DROP)), 200),
    Case("user missing", js(mention(user=DROP)), 200),
    Case("ts missing", js(mention(ts=DROP)), 200),
    Case("text missing", js(mention(text=DROP)), 200),
    Case("ts not a timestamp", js(mention(ts="yesterday")), 200),
    Case("thread_ts not a timestamp", js(mention(thread_ts="x:y")), 200),
    Case("channel with a colon", js(mention(channel="C1:other")), 200),
    Case("user empty", js(mention(user="")), 200),
    Case("team an object", js(mention(team={"id": "T1"})), 200),
    Case("team_id an object", js(envelope(team_id={"id": "T1"})), 200),
    Case("event_id a list", js(envelope(event_id=["Ev1"])), 200),
    Case("subtype a list", js(mention(subtype=["thread_broadcast"])), 200),
    Case("bot_id an object", js(mention(bot_id={"id": "B1"})), 200),
    Case("channel_type a list", js(mention(channel_type=["im"])), 200),
    Case("user_profile a list", js(mention(user_profile=["Ann"])), 200),
    Case("user_profile name a list", js(mention(user_profile={"display_name": ["Ann"]})), 200),
    Case("text a lone surrogate", js(mention(text="<@UBOT> hi \ud800")), 200),
    Case("hidden a string", js(mention(hidden="no")), 200),
    Case("dm channel an object", js(dm_message({"id": "D1"}, "U1", "hi", TS)), 200),  # type: ignore[arg-type]
]

CASES = BODIES + HEADERS + EVENTS
UNREAD_JUNK = {"enterprise": ["id"], "authorizations": "abc", "response_urls": 5}


def signed(case: Case) -> dict[str, str]:
    timestamp: int | str | None = case.timestamp
    headers = sign_request(case.body, SECRET, timestamp, case.content_type)
    if case.signature == "":
        del headers["X-Slack-Signature"]
    elif case.signature is not None:
        headers["X-Slack-Signature"] = case.signature
    return headers


async def test_malformed_http_requests_are_refused_and_counted(
    start_bot: StartBot,
    slack: FakeSlack,
    fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = await start_bot()
    caplog.set_level(logging.WARNING)
    wrong: list[str] = []
    for case in CASES:
        before = bot.inbound_count("slack", case.outcome)
        warned = len([r for r in caplog.records if r.name == "channels.slack"])
        async with bot.http.post(bot.events_url, data=case.body, headers=signed(case)) as resp:
            status, answer = resp.status, await resp.text()
        counted = bot.inbound_count("slack", case.outcome) - before
        warnings = [r for r in caplog.records if r.name == "channels.slack"][warned:]
        if status != case.status:
            wrong.append(f"{case.name}: HTTP {status} {answer[:80]!r}, expected {case.status}")
        elif case.status == 400 and not answer.strip():
            wrong.append(f"{case.name}: a 400 without a reason")
        if counted != 1:
            wrong.append(f"{case.name}: counted {counted} times as {case.outcome}")
        if not any(r.levelno == logging.WARNING for r in warnings):
            wrong.append(f"{case.name}: no WARNING line from channels.slack")
    assert wrong == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == []
    assert await bot.stored_nothing()
    assert fake_openai.completion_requests() == [] and slack.posts == []
    # The server is alive and a genuine message is still answered. Fields the bot does not
    # read do not matter, whatever their type (slack-bolt used to fail on these two).
    ts = slack.next_ts()
    genuine = app_mention("C1", "U1", "still there?", ts) | UNREAD_JUNK
    status, _ = await bot.post(genuine)
    assert status == 200
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == ["echo: still there?"]
    assert await bot.user_messages(sid("C1", ts)) == ["still there?"]


async def test_malformed_socket_mode_events_are_acknowledged_and_dropped(
    start_bot: StartBot,
    slack: FakeSlack,
    fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = await start_bot(slack_app_token=slack.app_token, slack_signing_secret=None)
    await slack.wait_connected()
    caplog.set_level(logging.WARNING)
    bad = [json.loads(case.body) for case in EVENTS]
    bad += [envelope(event="hi"), mention(type=["app_mention"]), envelope(event=DROP)]
    for body in bad:
        envelope_id = await slack.socket_send_event(body)
        await slack.wait_for_ack(envelope_id)
    assert bot.inbound_count("slack", "malformed") == len(bad)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert await bot.stored_nothing()
    assert fake_openai.completion_requests() == []
    ts = slack.next_ts()
    genuine = app_mention("C1", "U1", "ok?", ts) | UNREAD_JUNK
    await slack.wait_for_ack(await slack.socket_send_event(genuine))
    await bot.idle(sid("C1", ts))
    assert [p["text"] for p in slack.posts_in("C1", ts)] == ["echo: ok?"]
