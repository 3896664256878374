"""Self-test of the fake Slack server against the real slack_sdk clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack_api import (
    FakeSlack,
    app_mention,
    dm_message,
    sign_request,
    slash_command_form,
)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(
        bot_token="xoxb-test",
        app_token="xapp-test",
        team_id="T1",
        bot_user_id="UBOT",
        bot_id="BBOT",
    ) as fake:
        yield fake


def web(slack: FakeSlack, token: str = "xoxb-test") -> AsyncWebClient:
    return AsyncWebClient(token=token, base_url=slack.api_url, retry_handlers=[])


async def test_auth_and_tokens(slack: FakeSlack) -> None:
    assert slack.api_url == f"http://127.0.0.1:{slack.port}/api/"
    resp = await web(slack).auth_test()
    assert resp["user_id"] == "UBOT" and resp["bot_id"] == "BBOT" and resp["team_id"] == "T1"
    with pytest.raises(SlackApiError) as err:
        await web(slack, "xoxb-wrong").auth_test()
    assert err.value.response["error"] == "invalid_auth"
    with pytest.raises(SlackApiError) as err:
        await web(slack).api_call("nope.nothing")
    assert err.value.response["error"] == "unknown_method"


async def test_post_update_and_reactions(slack: FakeSlack) -> None:
    client = web(slack)
    first = await client.chat_postMessage(channel="C1", text="hello", thread_ts="1.000100")
    second = await client.chat_postMessage(channel="C1", text="again")
    assert first["ts"] < second["ts"] and first["message"]["text"] == "hello"
    assert [p["text"] for p in slack.posts_in("C1", thread_ts="1.000100")] == ["hello"]
    assert slack.posts[0]["ts"] == first["ts"] and len(slack.posts_in("C1")) == 2
    await client.chat_update(channel="C1", ts=first["ts"], text="edited")
    assert slack.messages[("C1", first["ts"])]["text"] == "edited"
    with pytest.raises(SlackApiError, match="msg_too_long"):
        await client.chat_postMessage(channel="C1", text="x" * 40001)
    await client.reactions_add(channel="C1", timestamp="1.000100", name="eyes")
    with pytest.raises(SlackApiError, match="already_reacted"):
        await client.reactions_add(channel="C1", timestamp="1.000100", name="eyes")
    assert slack.reactions == {("C1", "1.000100", "eyes")}
    await client.reactions_remove(channel="C1", timestamp="1.000100", name="eyes")
    with pytest.raises(SlackApiError, match="no_reaction"):
        await client.reactions_remove(channel="C1", timestamp="1.000100", name="eyes")
    await client.assistant_threads_setStatus(channel_id="D1", thread_ts="1.2", status="thinking")
    slack.assistant_enabled = False
    with pytest.raises(SlackApiError):
        await client.assistant_threads_setStatus(channel_id="D1", thread_ts="1.2", status="x")
    assert [s["status"] for s in slack.statuses] == ["thinking"]
    assert len(slack.calls_to("chat.postMessage")) == 3


async def test_faults(slack: FakeSlack) -> None:
    client = web(slack)
    slack.fail_next("chat.postMessage", status=429, retry_after=1)
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel="C1", text="hi")
    assert err.value.response.status_code == 429
    assert err.value.response.headers["Retry-After"] == "1"
    assert err.value.response["error"] == "ratelimited" and slack.posts == []
    slack.fail_next("reactions.add", error="some_error")
    with pytest.raises(SlackApiError, match="some_error"):
        await client.reactions_add(channel="C1", timestamp="1.1", name="eyes")
    slack.drop_next("chat.postMessage", after_processing=True)
    with pytest.raises(aiohttp.ClientError):
        await client.chat_postMessage(channel="C1", text="lost reply")
    assert [p["text"] for p in slack.posts] == ["lost reply"]
    slack.drop_next("chat.postMessage", after_processing=False)
    with pytest.raises(aiohttp.ClientError):
        await client.chat_postMessage(channel="C1", text="never made")
    assert len(slack.posts) == 1
    assert (await client.chat_postMessage(channel="C1", text="ok"))["ok"]


async def test_socket_mode_roundtrip(slack: FakeSlack) -> None:
    received: list[SocketModeRequest] = []

    async def on_request(client: SocketModeClient, req: SocketModeRequest) -> None:
        received.append(req)
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

    client = SocketModeClient(app_token="xapp-test", web_client=web(slack), ping_interval=1)
    client.socket_mode_request_listeners.append(on_request)
    try:
        await client.connect()
        await slack.wait_connected(timeout=10)
        assert slack.calls_to("apps.connections.open")
        event = app_mention("C1", "U1", "hi", "1700000001.000100")
        assert "<@UBOT>" in event["event"]["text"]
        envelope_id = await slack.socket_send_event(event)
        await slack.wait_for_ack(envelope_id, timeout=5)
        assert slack.acks == [envelope_id]
        assert received[0].type == "events_api" and received[0].payload == event
        cmd_id = await slack.socket_send_slash_command(slash_command_form("/bub", "x", "C1", "U1"))
        await slack.wait_for_ack(cmd_id)
        assert received[1].type == "slash_commands"
        dm = dm_message("D1", "U1", "yo", "1700000002.000100")
        assert dm["event"]["channel_type"] == "im" and dm["event_id"] != event["event_id"]
    finally:
        await client.close()
        await asyncio.sleep(0)


def test_sign_request() -> None:
    body = json.dumps({"type": "url_verification", "challenge": "c"}).encode()
    headers = sign_request(body, "s3cret")
    assert SignatureVerifier("s3cret").is_valid_request(body, headers)
    assert not SignatureVerifier("other").is_valid_request(body, headers)
    assert headers["Content-Type"] == "application/json"
