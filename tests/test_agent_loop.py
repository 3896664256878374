"""The turn loop against the fake model server: tool steps, tape records, errors, retries."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bub_bot.agent import default_registry
from bub_bot.agent.tools import ToolContext
from bub_bot.config import ConfigError, load_settings
from bub_bot.tape import Tape, TapeEntry
from tests.fakes.openai_server import (
    bad_tool_schema,
    drop,
    echo_default,
    error,
    html_page,
    rate_limited,
    server_error,
    slow,
    text,
    tool_calls,
)

USER = {"role": "user", "content": "what is in the workspace?"}


async def events(tape: Tape, name: str) -> list[TapeEntry]:
    return await tape.query(kinds=["event"], names=[name])


async def step_statuses(tape: Tape) -> list[str]:
    return [e.payload["data"]["status"] for e in await events(tape, "loop.step")]


def tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["role"] == "tool"]


async def test_multi_step_loop_with_parallel_calls(fake_openai, agent, tape, workspace) -> None:
    (workspace / "notes.txt").write_text("hello", encoding="utf-8")
    usage = {
        "prompt_tokens": 120,
        "completion_tokens": 8,
        "total_tokens": 128,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    fake_openai.script(
        tool_calls([("tape_info", {}), ("fs_list", {"path": "."})], content="Let me look."),
        text("There is notes.txt.", usage=usage),
    )
    result = await agent().run_turn(tape, [USER], turn_id="t1")

    assert (result.status, result.reply, result.steps) == ("ok", "There is notes.txt.", 2)
    requests = fake_openai.completion_requests()
    assert len(requests) == 2
    first = requests[0].body["messages"]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == USER["content"]

    second = requests[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assistant = second[2]
    assert assistant["content"] == "Let me look."
    call_ids = [c["id"] for c in assistant["tool_calls"]]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["tape_info", "fs_list"]
    assert len(set(call_ids)) == 2
    assert [m["tool_call_id"] for m in second[3:]] == call_ids
    info = json.loads(second[3]["content"])
    assert info["last_anchor"] == "session/start" and info["entries"] >= 3
    assert json.loads(second[4]["content"]) == ["notes.txt"]

    entries = await tape.query()
    kinds = {e.kind for e in entries}
    assert {"message", "tool_call", "tool_result", "anchor", "event"} <= kinds
    (call_entry,) = [e for e in entries if e.kind == "tool_call"]
    (result_entry,) = [e for e in entries if e.kind == "tool_result"]
    assert [c["id"] for c in call_entry.payload["calls"]] == call_ids
    assert [r["tool_call_id"] for r in result_entry.payload["results"]] == call_ids
    assert call_entry.id < result_entry.id

    runs = await events(tape, "run")
    assert len(runs) == 2
    for run in runs:
        data = run.payload["data"]
        assert data["model"] == "fake-model"
        assert isinstance(data["latency_ms"], int | float) and data["latency_ms"] >= 0
        assert {"prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens"} <= set(
            data["usage"]
        )
        assert run.meta.get("context") is False
    assert runs[1].payload["data"]["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 8,
        "total_tokens": 128,
        "cached_tokens": 64,
    }
    assert result.usage["cached_tokens"] == 64
    assert result.usage["total_tokens"] == 128 + runs[0].payload["data"]["usage"]["total_tokens"]
    assert len(await events(tape, "loop.start")) == 1
    assert await step_statuses(tape) == ["continue", "ok"]
    final = await tape.store.get(tape.name, result.reply_entry)
    assert final is not None and final.payload == {
        "role": "assistant",
        "content": "There is notes.txt.",
    }
    assert result.seen_through == result_entry.id + 2  # + run + loop.step of step 1


async def test_unknown_tool_and_invalid_arguments_reach_the_model(fake_openai, agent, tape):
    fake_openai.script(
        tool_calls(
            [
                ("no_such_tool", {}),
                ("fs_read", {"path": "a.txt", "offset": "not a number"}),
                ("fs_read", "{not json"),
                ("fs_read", "[1, 2]"),
            ]
        ),
        text("sorry, done"),
    )
    result = await agent().run_turn(tape, [USER])

    assert (result.status, result.reply) == ("ok", "sorry, done")
    results = tool_messages(fake_openai.last_messages())
    assert len(results) == 4
    unknown, wrong_type, bad_json, not_object = (m["content"] for m in results)
    assert unknown.startswith("error: unknown tool 'no_such_tool'")
    assert "fs_read" in unknown  # the model is told what exists
    assert wrong_type.startswith("error: invalid arguments for fs_read")
    assert "offset" in wrong_type
    assert bad_json.startswith("error: invalid arguments for fs_read")
    assert not_object.startswith("error: invalid arguments for fs_read")
    assert "JSON object" in not_object
    (stored,) = await tape.query(kinds=["tool_result"])
    assert [r["ok"] for r in stored.payload["results"]] == [False] * 4


async def test_tool_exception_becomes_error_result(fake_openai, agent, tape):
    registry = default_registry()

    @registry.tool("demo.boom")
    async def boom(ctx: ToolContext, x: int) -> str:
        """Always fails."""
        raise RuntimeError(f"kaboom {x}")

    fake_openai.script(tool_calls([("demo_boom", {"x": 7})]), text("recovered"))
    result = await agent(registry).run_turn(tape, [USER])

    assert (result.status, result.reply) == ("ok", "recovered")
    (message,) = tool_messages(fake_openai.last_messages())
    assert message["content"] == "error: demo_boom failed: RuntimeError: kaboom 7"
    assert await step_statuses(tape) == ["continue", "ok"]


async def test_dotted_names_exposed_with_underscores_and_resolved_back(fake_openai, agent, tape):
    registry = default_registry()

    @registry.tool("demo.echo.back")
    async def echo_back(ctx: ToolContext, words: str) -> str:
        """Repeat the words."""
        return words + "!"

    fake_openai.script(tool_calls([("demo_echo_back", {"words": "hi"})]), text("ok"))
    await agent(registry).run_turn(tape, [USER])

    tools = fake_openai.completion_requests()[0].body["tools"]
    names = [t["function"]["name"] for t in tools]
    assert all("." not in n for n in names)
    expected = {"tape_info", "tape_search", "tape_anchors", "tape_handoff", "spill_read"}
    assert expected | {
        "fs_list",
        "fs_read",
        "fs_write",
        "fs_edit",
        "web_fetch",
        "skill",
        "demo_echo_back",
    } == set(names)
    echo = tools[names.index("demo_echo_back")]["function"]
    assert echo["parameters"]["properties"]["words"]["type"] == "string"
    assert echo["parameters"]["required"] == ["words"]
    (message,) = tool_messages(fake_openai.last_messages())
    assert message["content"] == "hi!"
    assert registry.get("demo_echo_back") is registry.get("demo.echo.back")


async def test_max_steps_ends_with_a_recorded_note(fake_openai, agent, tape, monkeypatch):
    monkeypatch.setenv("BUB_MAX_STEPS", "3")
    fake_openai.default = lambda body: tool_calls([("tape_info", {})])
    result = await agent().run_turn(tape, [USER])

    assert result.status == "max_steps"
    assert result.steps == 3
    assert len(fake_openai.completion_requests()) == 3
    assert "3 steps" in result.reply
    (notice,) = await events(tape, "turn.notice")
    assert notice.payload["data"] == {
        "status": "max_steps",
        "text": result.reply,
        "seen_through": result.seen_through,
    }
    assert notice.id == result.reply_entry
    assert await step_statuses(tape) == ["continue"] * 3
    assert len(await tape.query(kinds=["tool_result"])) == 3


async def test_message_arriving_during_a_slow_step_reaches_the_next_step(fake_openai, agent, tape):
    fake_openai.script(slow(tool_calls([("tape_info", {})]), 0.3), text("noted both"))
    turn = asyncio.create_task(agent().run_turn(tape, [USER]))
    for _ in range(500):
        if fake_openai.completion_requests():
            break
        await asyncio.sleep(0.005)
    assert fake_openai.completion_requests(), "the first model call never arrived"
    late = await tape.append_message({"role": "user", "content": "also: check the logs"})
    result = await asyncio.wait_for(turn, 10)

    assert result.status == "ok"
    first, second = (r.body["messages"] for r in fake_openai.completion_requests())
    assert all(m.get("content") != "also: check the logs" for m in first)
    users = [m["content"] for m in second if m["role"] == "user"]
    assert users == [USER["content"], "also: check the logs"]
    assert result.seen_through >= late.id


async def test_rate_limit_is_retried_within_one_turn(fake_openai, agent, tape):
    fake_openai.script(rate_limited(retry_after=0.1), text("after the wait"))
    result = await agent(model_retries=1).run_turn(tape, [USER])

    assert (result.status, result.reply, result.steps) == ("ok", "after the wait", 1)
    assert len(fake_openai.completion_requests()) == 2
    assert len(await events(tape, "run")) == 1
    assert await tape.query(kinds=["error"]) == []


async def test_server_errors_after_retries_end_the_turn_plainly(fake_openai, agent, tape):
    quick_500 = error(500, server_error().body, {"retry-after-ms": "10"})
    fake_openai.script(quick_500, quick_500)
    bot = agent(model_retries=1)
    result = await bot.run_turn(tape, [USER])

    assert result.status == "error"
    assert len(fake_openai.completion_requests()) == 2
    assert "HTTP 500" in result.reply and "try again" in result.reply
    assert "Traceback" not in result.reply and "{" not in result.reply
    (err,) = await tape.query(kinds=["error"])
    assert err.payload["kind"] == "model" and "500" in err.payload["message"]
    (notice,) = await events(tape, "turn.notice")
    assert notice.payload["data"]["status"] == "error"
    assert await step_statuses(tape) == ["error"]

    # the session stays usable
    again = await bot.run_turn(tape, [{"role": "user", "content": "second try"}])
    assert (again.status, again.reply) == ("ok", "echo: second try")


async def test_bad_request_that_is_not_overflow_is_an_error(fake_openai, agent, tape):
    fake_openai.script(bad_tool_schema())
    result = await agent().run_turn(tape, [USER])

    assert result.status == "error" and not result.auto_handoff
    assert "HTTP 400" in result.reply
    assert len(fake_openai.completion_requests()) == 1
    assert await tape.query(kinds=["anchor"], names=["auto_handoff/context_overflow"]) == []


def test_missing_api_key_with_default_base_url_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        load_settings(workspace=tmp_path, home=tmp_path / "home", _env_file=None)
    # a local OpenAI-compatible server needs no key
    local = load_settings(
        openai_base_url="http://127.0.0.1:1/v1", workspace=tmp_path, _env_file=None
    )
    assert local.openai_api_key is None


async def test_a_dropped_connection_is_reported_as_unreachable_not_slow(fake_openai, agent, tape):
    fake_openai.script(drop())
    result = await agent().run_turn(tape, [{"role": "user", "content": "hi"}])
    assert result.status == "error"
    assert "could not reach the model" in result.reply
    (err,) = await tape.query(kinds=["error"])
    assert err.payload["message"].startswith("cannot reach the model endpoint")


async def test_an_html_page_from_a_wrong_base_url_ends_the_turn_plainly(fake_openai, agent, tape):
    fake_openai.default = lambda body: html_page()
    bot = agent(openai_api_key="sk-html-test-SECRET-0123")
    result = await bot.run_turn(tape, [USER])

    assert result.status == "error"
    assert "OPENAI_BASE_URL" in result.reply and "<" not in result.reply
    (err,) = await tape.query(kinds=["error"])
    assert err.payload["kind"] == "model"
    assert fake_openai.base_url in err.payload["message"]
    assert "an HTML page" in err.payload["message"]
    assert "sk-html-test-SECRET-0123" not in json.dumps([e.payload for e in await tape.query()])
    assert await step_statuses(tape) == ["error"]

    # the endpoint is fixed: the same session answers again
    fake_openai.default = echo_default
    again = await bot.run_turn(tape, [{"role": "user", "content": "second try"}])
    assert (again.status, again.reply) == ("ok", "echo: second try")
