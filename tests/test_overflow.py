"""Auto-handoff: every provider's context-overflow dialect, and what is not an overflow."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from bub_bot.agent import AUTO_HANDOFF_ANCHOR, is_context_overflow
from bub_bot.tape import Tape
from tests.fakes.openai_server import (
    ErrorReply,
    bad_tool_schema,
    drop,
    echo_default,
    overflow_413,
    overflow_anthropic,
    overflow_llamacpp,
    overflow_new_openai,
    overflow_openai,
    overflow_openrouter,
    overflow_vllm,
    rate_limited,
    server_error,
    text,
)

DIALECTS: dict[str, Callable[[], ErrorReply]] = {
    "openai": overflow_openai,
    "new_openai": overflow_new_openai,
    "vllm": overflow_vllm,
    "llamacpp": overflow_llamacpp,
    "anthropic": overflow_anthropic,
    "openrouter": overflow_openrouter,
    "413": overflow_413,
}
NEW = {"role": "user", "content": "NEW-QUESTION: what now?"}


async def seed_earlier_exchange(tape: Tape) -> None:
    await tape.ensure_bootstrap_anchor()
    await tape.append_message({"role": "user", "content": "OLD-QUESTION about the past"})
    await tape.append_message({"role": "assistant", "content": "OLD-ANSWER about the past"})


def error_message(reply: ErrorReply) -> str:
    body = reply.body["error"]
    return body["message"]


async def step_statuses(tape: Tape) -> list[str]:
    found = await tape.query(kinds=["event"], names=["loop.step"])
    return [e.payload["data"]["status"] for e in found]


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_auto_handoff_per_dialect(fake_openai, agent, tape, dialect):
    await seed_earlier_exchange(tape)
    overflow = DIALECTS[dialect]()
    fake_openai.script(overflow, text("fresh answer"))
    result = await agent().run_turn(tape, [NEW])

    assert (result.status, result.reply, result.auto_handoff) == ("ok", "fresh answer", True)
    assert result.steps == 1
    first, retry = (r.body["messages"] for r in fake_openai.completion_requests())
    assert "OLD-QUESTION" in json.dumps(first)  # the seed really was in context before
    assert retry[1:] == [NEW]
    assert retry[0]["role"] == "system"
    assert "OLD-" not in json.dumps(retry)

    (anchor,) = await tape.query(kinds=["anchor"], names=[AUTO_HANDOFF_ANCHOR])
    assert anchor.payload["state"] == {
        "reason": "context_length_exceeded",
        "error": error_message(overflow),
    }
    assert await step_statuses(tape) == ["auto_handoff", "ok"]
    # the new phase holds this turn's question and the answer, nothing older
    assert await tape.read_messages() == [NEW, {"role": "assistant", "content": "fresh answer"}]
    assert await tape.query(kinds=["error"]) == []


async def test_bad_tool_schema_is_not_an_overflow(fake_openai, agent, tape):
    await seed_earlier_exchange(tape)
    fake_openai.script(bad_tool_schema())
    result = await agent().run_turn(tape, [NEW])

    assert result.status == "error" and not result.auto_handoff
    assert len(fake_openai.completion_requests()) == 1
    assert await tape.query(kinds=["anchor"], names=[AUTO_HANDOFF_ANCHOR]) == []
    assert await step_statuses(tape) == ["error"]
    assert "OLD-QUESTION" in json.dumps(await tape.read_messages())


async def test_double_overflow_then_the_session_still_works(fake_openai, agent, tape):
    await seed_earlier_exchange(tape)
    huge = {"role": "user", "content": "HUGE " + "x" * 50_000}

    def length_aware(body: dict[str, Any]):
        if any(len(str(m.get("content") or "")) > 40_000 for m in body["messages"]):
            return overflow_openai()
        return echo_default(body)

    fake_openai.default = length_aware
    bot = agent()
    result = await bot.run_turn(tape, [huge])

    assert result.status == "overflow" and result.auto_handoff
    assert "too long" in result.reply and "Traceback" not in result.reply
    assert len(fake_openai.completion_requests()) == 2
    retry = fake_openai.last_messages()
    assert [m["content"][:5] for m in retry[1:]] == ["HUGE "]
    (notice,) = await tape.query(kinds=["event"], names=["turn.notice"])
    assert notice.payload["data"] == {
        "status": "overflow",
        "text": result.reply,
        "seen_through": result.seen_through,
    }
    assert notice.id == result.reply_entry
    assert len(await tape.query(kinds=["anchor"], names=[AUTO_HANDOFF_ANCHOR])) == 1
    (err,) = await tape.query(kinds=["error"])
    assert err.payload["kind"] == "context_overflow"

    after = await bot.run_turn(tape, [{"role": "user", "content": "short one"}])
    assert (after.status, after.reply) == ("ok", "echo: short one")
    # The too-long message was left behind an anchor: the next turn needs one request only.
    assert len(fake_openai.completion_requests()) == 3 and not after.auto_handoff
    last = fake_openai.last_messages()
    assert last[-1] == {"role": "user", "content": "short one"}
    assert "HUGE" not in json.dumps(last) and "OLD-" not in json.dumps(last)


# -- the classifier against the SDK's own exceptions --------------------------------------------


async def sdk_error(fake_openai, reply) -> BaseException:
    fake_openai.script(reply)
    client = openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="sk-test", max_retries=0)
    try:
        await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}]
        )
    except openai.OpenAIError as exc:
        return exc
    finally:
        await client.close()
    raise AssertionError("the fake answered without an error")


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_classifier_recognises_each_dialect(fake_openai, dialect):
    exc = await sdk_error(fake_openai, DIALECTS[dialect]())
    assert isinstance(exc, openai.APIStatusError)
    assert is_context_overflow(exc)


@pytest.mark.parametrize(
    "reply",
    [bad_tool_schema, lambda: rate_limited(retry_after=0.1), server_error, drop],
    ids=["bad_tool_schema", "429", "500", "dropped"],
)
async def test_classifier_rejects_other_errors(fake_openai, reply):
    exc = await sdk_error(fake_openai, reply())
    assert not is_context_overflow(exc)


def test_classifier_ignores_non_api_errors():
    assert not is_context_overflow(ValueError("maximum context length is 10 tokens"))
