"""Self-test of the fake OpenAI server, driven by the real ``openai.AsyncOpenAI`` client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import openai
import pytest

from tests.fakes.openai_server import (
    FakeOpenAI,
    drop,
    overflow_llamacpp,
    overflow_openai,
    rate_limited,
    slow,
    text,
    tool_calls,
)

USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def client(fake: FakeOpenAI, **kw: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0, **kw)  # type: ignore[arg-type]


async def test_text_and_default_echo(fake: FakeOpenAI) -> None:
    fake.script(slow(text("scripted"), 0.05))
    c = client(fake)
    r1 = await c.chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    r2 = await c.chat.completions.create(
        model="fake-model",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )
    assert r1.choices[0].message.content == "scripted"
    assert r1.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "echo: ab" and r2.model == "fake-model"
    assert r1.usage is not None and r1.usage.prompt_tokens == len("hello there") // 4
    assert r1.usage.prompt_tokens_details is not None
    assert fake.requests[0].headers["authorization"] == "Bearer sk-test"
    assert fake.last_messages()[0]["content"][1]["text"] == "b"


async def test_tool_calls_round_trip(fake: FakeOpenAI) -> None:
    fake.script(tool_calls([("lookup", {"q": "x"}), ("bad", "{not json")]), text("done"))
    c = client(fake)
    r = await c.chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    assert [tc.id for tc in msg.tool_calls] == ["call_1", "call_2"]
    assert json.loads(msg.tool_calls[0].function.arguments) == {"q": "x"}  # type: ignore[union-attr]
    assert msg.tool_calls[1].function.arguments == "{not json"  # type: ignore[union-attr]
    follow = [*USER, msg.model_dump(exclude_none=True)]
    follow.append({"role": "tool", "tool_call_id": "call_1", "content": "42"})
    r2 = await c.chat.completions.create(model="gpt-4o-mini", messages=follow)  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "done"
    assert fake.last_messages()[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}


async def test_stream_tool_call_deltas(fake: FakeOpenAI) -> None:
    fake.script(tool_calls([("lookup", {"q": "x"})], content="let me check"))
    stream = await client(fake).chat.completions.create(
        model="gpt-4o-mini",
        messages=USER,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    content, args, ids, finish, usage = "", "", [], None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                ids += [tc.id] if tc.id else []
                args += (tc.function.arguments or "") if tc.function else ""
    assert content == "let me check" and ids == ["call_1"] and json.loads(args) == {"q": "x"}
    assert finish == "tool_calls" and usage is not None and usage.total_tokens > 0


async def test_stream_helper_accumulates(fake: FakeOpenAI) -> None:
    fake.script(tool_calls([("lookup", {"q": "x"})]))
    async with client(fake).chat.completions.stream(model="gpt-4o-mini", messages=USER) as s:  # type: ignore[arg-type]
        final = await s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == '{"q": "x"}'  # type: ignore[index,union-attr]


async def test_rate_limited(fake: FakeOpenAI) -> None:
    fake.script(rate_limited(retry_after=7))
    with pytest.raises(openai.RateLimitError) as ei:
        await client(fake).chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    assert ei.value.response.headers["retry-after"] == "7"
    assert ei.value.code == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("reply", "code"),
    [(overflow_openai(), "context_length_exceeded"), (overflow_llamacpp(), "400")],
)
async def test_overflow_is_bad_request(fake: FakeOpenAI, reply: object, code: object) -> None:
    fake.script(reply)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as ei:
        await client(fake).chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    assert ei.value.code == code


async def test_unknown_model_and_models_list(fake: FakeOpenAI) -> None:
    c = client(fake)
    with pytest.raises(openai.NotFoundError) as ei:
        await c.chat.completions.create(model="gpt-9", messages=USER)  # type: ignore[arg-type]
    assert ei.value.code == "model_not_found"
    assert {m.id async for m in c.models.list()} == {"gpt-4o-mini", "fake-model"}


async def test_drop_is_connection_error(fake: FakeOpenAI) -> None:
    fake.script(drop())
    with pytest.raises(openai.APIConnectionError):
        await client(fake).chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    r = await client(fake).chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "echo: hello there"


async def test_auth_key() -> None:
    async with FakeOpenAI(auth_key="right") as fake:
        with pytest.raises(openai.AuthenticationError) as ei:
            await client(fake).chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
        assert ei.value.code == "invalid_api_key"


async def test_retry_after_ms_is_honoured(fake: FakeOpenAI) -> None:
    fake.script(rate_limited(retry_after=None, retry_after_ms=50), text("ok"))
    c = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=1)
    r = await c.chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "ok" and len(fake.requests) == 2
