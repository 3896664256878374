"""The model client against unusable answers: an HTML page, broken JSON, JSON of the wrong
shape. Each is the client's own ModelError naming the base URL, never the key."""

from __future__ import annotations

from typing import Any

import pytest

from bub_bot.agent import ContextOverflow, ModelClient, ModelError
from bub_bot.agent.model import public_url
from bub_bot.secrets import REDACTED
from tests.fakes.openai_server import html_page, raw, text

KEY = "sk-proj-NEVERshowTHISkey0123456789"
USER = [{"role": "user", "content": "hello"}]


def completion(message: Any = None, **choice: Any) -> dict[str, Any]:
    """A chat completion body with one choice (`message` as given)."""
    first = {"index": 0, "finish_reason": "stop", **choice}
    if message is not None:
        first["message"] = message
    return {"id": "x", "object": "chat.completion", "model": "fake-model", "choices": [first]}


UNUSABLE = {
    "html page": (html_page(), "an HTML page"),
    "html with json content type": (raw("<html><body>hi</body></html>"), "not valid JSON"),
    "broken json": (raw('{"choices": [', "application/json"), "not valid JSON"),
    "plain text": (raw("Service Unavailable", "text/plain"), "a non-JSON body"),
    "empty body": (raw("", "text/plain"), "an empty body"),
    "json null": (raw("null"), "JSON null"),
    "json list": (raw([1, 2]), "a JSON list"),
    "json string": (raw('"hello"'), "not a chat completion"),
    "no choices": (raw({"id": "x", "object": "chat.completion"}), "no choices"),
    "choices not a list": (raw({"choices": {"0": {}}}), "choices that are not a list"),
    "empty choices": (raw({"choices": []}), "no choices"),
    "choice not an object": (raw({"choices": ["hi"]}), "without a message"),
    "missing message": (raw(completion()), "without a message"),
    "message a string": (raw(completion("hello")), "without a message"),
    "content a number": (raw(completion({"role": "assistant", "content": 42})), "content"),
    "tool_calls a string": (
        raw(completion({"role": "assistant", "content": None, "tool_calls": "lookup"})),
        "tool_calls",
    ),
    "tool call without function": (
        raw(completion({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]})),
        "tool call",
    ),
    "tool call name a number": (
        raw(completion({"role": "assistant", "tool_calls": [{"function": {"name": 5}}]})),
        "tool call",
    ),
    "echo of the request headers": (
        raw({"headers": {"Authorization": f"Bearer {KEY}"}, "url": "https://httpbin/anything"}),
        "no choices",
    ),
}


@pytest.mark.parametrize("case", UNUSABLE)
async def test_unusable_answers_are_model_errors_naming_the_base_url(fake_openai, settings, case):
    reply, reason = UNUSABLE[case]
    fake_openai.script(reply)
    client = ModelClient(settings(openai_api_key=KEY))
    try:
        with pytest.raises(ModelError) as caught:
            await client.complete(USER)
    finally:
        await client.close()
    exc = caught.value
    assert type(exc) is ModelError and not isinstance(exc, ContextOverflow)
    message = str(exc)
    assert fake_openai.base_url in message, message
    assert reason in message, message
    assert KEY not in message
    assert "OPENAI_BASE_URL" in exc.user_message and fake_openai.base_url not in exc.user_message
    assert exc.__cause__ is None or not isinstance(exc.__cause__, AttributeError | TypeError)


async def test_error_object_in_a_200_answer_is_reported(fake_openai, settings):
    fake_openai.script(raw({"error": {"message": f"upstream timed out for {KEY}", "code": 504}}))
    client = ModelClient(settings(openai_api_key=KEY))
    with pytest.raises(ModelError) as caught:
        await client.complete(USER)
    await client.close()
    assert "upstream timed out for" in str(caught.value) and KEY not in str(caught.value)
    assert REDACTED in str(caught.value)
    assert "try again" in caught.value.user_message


async def test_lenient_answers_that_still_make_sense_are_used(fake_openai, settings):
    body = completion(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}],
            "tool_calls": [
                {"function": {"name": "lookup", "arguments": {"q": "x"}}},
                {"id": "c2", "type": "function", "function": {"name": "other"}},
            ],
        },
    )
    body["usage"] = "not an object"
    fake_openai.script(
        raw(body, "text/plain"),  # sloppy content type, valid completion
        raw(completion({"role": "assistant", "content": None})),
        text(f"the key is {KEY}"),
    )
    client = ModelClient(settings(openai_api_key=KEY))
    try:
        first = await client.complete(USER)
        second = await client.complete(USER)
        third = await client.complete(USER)
    finally:
        await client.close()
    assert first.content == "part one, two" and first.usage == {}
    (a, b) = first.tool_calls
    assert a["function"] == {"name": "lookup", "arguments": '{"q": "x"}'}
    assert a["id"] and a["type"] == "function"
    assert b == {"id": "c2", "type": "function", "function": {"name": "other", "arguments": ""}}
    assert (second.content, second.tool_calls) == ("", [])
    assert third.content == f"the key is {REDACTED}"  # replies never carry a configured secret


def test_public_url_drops_credentials():
    assert public_url("http://u:pw@127.0.0.1:8080/v1?api-key=k#x") == "http://127.0.0.1:8080/v1"
    assert public_url("https://user@[fe80::1]:8443/v1") == "https://[fe80::1]:8443/v1"
    assert public_url("https://api.openai.com/v1") == "https://api.openai.com/v1"
    assert public_url("http://host:99999/v1") == "(an invalid URL)"


async def test_credentials_in_the_base_url_are_a_model_error_without_them(fake_openai, settings):
    # The aiohttp transport refuses user-info next to the Authorization header (ValueError).
    base = fake_openai.base_url.replace("http://", "http://proxyuser:proxy-pass-123@")
    client = ModelClient(settings(openai_api_key=KEY, openai_base_url=base))
    try:
        with pytest.raises(ModelError) as caught:
            await client.complete(USER)
    finally:
        await client.close()
    message = str(caught.value)
    assert fake_openai.base_url in message and "ValueError" in message
    assert "proxy-pass-123" not in message and KEY not in message
    assert "OPENAI_BASE_URL" in caught.value.user_message
