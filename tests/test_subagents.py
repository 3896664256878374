"""The `subagent` tool through the fake model: what each session mode's child sees, what the
parent's next request holds, narrowing, limits, failures."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bub_bot.agent import default_registry
from bub_bot.agent.subagent import Subagents, register_subagent_tool
from bub_bot.tape import Tape, TapeEntry
from tests.fakes.openai_server import slow, text, tool_calls

USER = {"role": "user", "content": "please research llamas"}


def with_subagents(agent, **overrides):
    registry = default_registry()
    made = agent(registry, **overrides)
    subagents = Subagents(made)
    register_subagent_tool(registry, subagents)
    return made, subagents


def call(prompt: str, **args: Any) -> tuple[str, dict[str, Any]]:
    return ("subagent", {"prompt": prompt, **args})


def tool_names(request) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools", [])]


async def test_temp_child_sees_only_its_prompt_and_parent_gets_its_answer(
    fake_openai, agent, tape, store
) -> None:
    made, _ = with_subagents(agent)
    fake_openai.script(
        tool_calls([call("summarise llamas")]),
        text("llamas are camelids", usage={"prompt_tokens": 10, "completion_tokens": 5}),
        text("Here you go: llamas are camelids.", usage={"prompt_tokens": 30}),
    )
    result = await made.run_turn(tape, [USER], turn_id="t1")
    assert result.reply == "Here you go: llamas are camelids."
    _, child, parent_next = fake_openai.completion_requests()
    assert [m["role"] for m in child.body["messages"]] == ["system", "user"]
    assert child.body["messages"][1]["content"] == "summarise llamas"
    assert "please research llamas" not in json.dumps(child.body["messages"])
    tool_msgs = [m for m in parent_next.body["messages"] if m["role"] == "tool"]
    assert tool_msgs[-1]["content"] == "llamas are camelids"
    # Child usage is added to the parent's turn.
    own = sum(
        e.payload["data"]["usage"]["prompt_tokens"]
        for e in await tape.query(kinds=["event"], names=["run"])
    )
    assert result.usage["prompt_tokens"] == own + 10
    # The child's tape is archived under the parent session; the parent records where.
    (end,) = await tape.query(kinds=["event"], names=["subagent.end"])
    data = end.payload["data"]
    assert data["status"] == "ok" and data["session"] == "temp" and "__archive__" in data["tape"]
    child_entries = await store.query(data["tape"])
    runs = [e for e in child_entries if e.name == "run"]
    assert runs and runs[0].payload["data"]["payer"]["session_id"] == tape.session_id
    prompt = next(e for e in child_entries if e.kind == "message")
    assert prompt.meta["parent"] == tape.name and prompt.meta["subagent"] == data["id"]
    # Exactly one run event per model call on each tape.
    parent_runs = await tape.query(kinds=["event"], names=["run"])
    assert len(parent_runs) == 2 and len(runs) == 1
    tapes = await store.list_tapes(include_all=True)
    archived = next(t for t in tapes if t.name == data["tape"])
    assert archived.session_id == f"{tape.session_id}/temp/{data['id']}"


async def test_inherit_child_sees_conversation_and_only_its_answer_returns(
    fake_openai, agent, tape, store
) -> None:
    made, _ = with_subagents(agent)
    await tape.append_many(
        [TapeEntry.message({"role": "user", "content": "earlier"})], bootstrap=True
    )
    await tape.append(TapeEntry.message({"role": "assistant", "content": "noted"}))
    fake_openai.script(
        tool_calls([call("check what I said", session="inherit")]),
        text("you said earlier"),
        text("done"),
    )
    await made.run_turn(tape, [USER], turn_id="t1")
    _, child, parent_next = fake_openai.completion_requests()
    contents = [m.get("content") for m in child.body["messages"][1:]]
    assert contents == ["earlier", "noted", USER["content"], "check what I said"]
    roles = [m["role"] for m in parent_next.body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool"]
    # The child's own messages stay out; its answer is the tool result.
    assert [m.get("content") for m in parent_next.body["messages"][1:]] == [
        "earlier",
        "noted",
        USER["content"],
        "",
        "you said earlier",
    ]
    assert await store.forks(tape.name) == []
    (end,) = await tape.query(kinds=["event"], names=["subagent.end"])
    archived = await store.query(end.payload["data"]["tape"])
    assert [e.payload.get("content") for e in archived if e.kind == "message"] == [
        "check what I said",
        "you said earlier",
    ]


async def test_named_child_continues_its_context_across_calls(
    fake_openai, agent, tape, store
) -> None:
    made, _ = with_subagents(agent)
    fake_openai.script(
        tool_calls([call("remember 42", session="research")]),
        text("remembered"),
        text("ok"),
        tool_calls([call("what number?", session="research")]),
        text("42"),
        text("it is 42"),
    )
    await made.run_turn(tape, [USER], turn_id="t1")
    await made.run_turn(tape, [{"role": "user", "content": "again"}], turn_id="t2")
    second_child = fake_openai.completion_requests()[4]
    contents = [m.get("content") for m in second_child.body["messages"][1:]]
    assert contents == ["remember 42", "remembered", "what number?"]
    named = Tape.for_session(store, f"{tape.session_id}/agents/research", made.settings.workspace)
    merges = await named.query(kinds=["event"], names=["fork.merge"])
    assert len(merges) == 2
    assert await store.forks(named.name) == []


async def test_tools_narrow_and_never_widen(fake_openai, agent, tape) -> None:
    made, _ = with_subagents(agent)
    fake_openai.script(
        tool_calls([call("look", tools=["fs.list"])]),
        tool_calls([("tape_info", {})]),  # not among its tools: refused even by name
        text("looked"),
        tool_calls([call("sneak", tools=["no.such"])]),
        text("fine"),
    )
    await made.run_turn(tape, [USER], turn_id="t1")
    requests = fake_openai.completion_requests()
    assert tool_names(requests[1]) == ["fs_list"]
    hidden = [m for m in requests[2].body["messages"] if m["role"] == "tool"][-1]["content"]
    assert hidden.startswith("error: unknown tool 'tape_info'") and "fs_list" in hidden
    refused = [m for m in requests[4].body["messages"] if m["role"] == "tool"][-1]["content"]
    assert "'no.such' is not a tool this conversation may use" in refused


async def test_depth_limit_hides_the_tool_at_the_maximum(fake_openai, agent, tape) -> None:
    made, _ = with_subagents(agent, subagent_max_depth=2)
    fake_openai.script(
        tool_calls([call("level one")]),
        tool_calls([call("level two")]),
        text("deepest"),
        text("middle"),
        text("top"),
    )
    result = await made.run_turn(tape, [USER], turn_id="t1")
    assert result.reply == "top"
    requests = fake_openai.completion_requests()
    assert "subagent" in tool_names(requests[0]) and "subagent" in tool_names(requests[1])
    assert "subagent" not in tool_names(requests[2])


async def test_depth_zero_offers_no_subagents(fake_openai, agent, tape) -> None:
    made, _ = with_subagents(agent, subagent_max_depth=0)
    fake_openai.script(text("hi"))
    await made.run_turn(tape, [USER], turn_id="t1")
    assert "subagent" not in tool_names(fake_openai.completion_requests()[0])


async def test_concurrency_limit_per_conversation(fake_openai, agent, tape) -> None:
    made, _ = with_subagents(agent, subagent_max_concurrent=2)

    def answer(body: dict[str, Any]):
        return slow(text("child done"), 0.2)

    fake_openai.script(tool_calls([call("a"), call("b"), call("c")]))
    fake_openai.default = answer
    fake_openai.script()
    result_task = asyncio.create_task(made.run_turn(tape, [USER], turn_id="t1"))
    await result_task
    results = (await tape.query(kinds=["tool_result"]))[0].payload["results"]
    contents = [r["content"] for r in results]
    assert contents.count("child done") == 2
    (refused,) = [c for c in contents if c != "child done"]
    assert "BUB_SUBAGENT_MAX_CONCURRENT=2" in refused


async def test_child_that_fails_says_so_and_named_context_stays_clean(
    fake_openai, agent, tape, store
) -> None:
    from tests.fakes.openai_server import server_error

    made, _ = with_subagents(agent)
    fake_openai.script(
        tool_calls([call("try", session="notes")]),
        server_error(500),
        text("the helper failed"),
    )
    await made.run_turn(tape, [USER], turn_id="t1")
    tool_msg = [
        m for m in fake_openai.completion_requests()[2].body["messages"] if m["role"] == "tool"
    ]
    assert "failed (error)" in tool_msg[-1]["content"]
    named = Tape.for_session(store, f"{tape.session_id}/agents/notes", made.settings.workspace)
    assert [e.kind for e in await named.query()] == ["anchor"]  # nothing half-done merged


async def test_timeout_and_model_allowlist(fake_openai, agent, tape) -> None:
    made, _ = with_subagents(agent, subagent_timeout_seconds=0.2, subagent_models=["gpt-4o-mini"])
    fake_openai.script(
        tool_calls([call("slow one")]),
        slow(text("too late"), 2.0),
        tool_calls([call("x", model="gpt-9")]),
        tool_calls([call("y", model="gpt-4o-mini")]),
        text("from other"),
        text("end"),
    )
    await made.run_turn(tape, [USER], turn_id="t1")
    requests = fake_openai.completion_requests()
    results = [
        r["content"] for e in await tape.query(kinds=["tool_result"]) for r in e.payload["results"]
    ]
    assert "did not finish within 0.2 s" in results[0]
    assert "'gpt-9' is not allowed" in results[1] and "BUB_SUBAGENT_MODELS" in results[1]
    assert results[2] == "from other"
    assert requests[-2].body["model"] == "gpt-4o-mini"


async def test_each_model_call_is_reported_once_with_its_payer(fake_openai, agent, tape) -> None:
    from bub_bot.agent import Origin

    made, _ = with_subagents(agent)
    seen: list[dict[str, Any]] = []
    made.hooks.append(lambda name, data: seen.append(data) if name == "model_call" else None)
    fake_openai.script(tool_calls([call("sub task")]), text("child"), text("parent"))
    origin = Origin(session_id=tape.session_id or "", channel="test", sender={"id": "u7"})
    await made.run_turn(tape, [USER], turn_id="t1", origin=origin)
    assert len(seen) == 3 == len(fake_openai.completion_requests())
    assert [d["subagent"] for d in seen] == [False, True, False]
    assert all(d["payer"]["sender"] == {"id": "u7"} for d in seen)
    assert all(d["payer"]["session_id"] == tape.session_id for d in seen)


async def test_metrics_count_subagent_runs(fake_openai, agent, tape) -> None:
    from bub_bot.metrics import Metrics

    made, _ = with_subagents(agent)
    metrics = Metrics()
    made.hooks.append(metrics.on_agent)
    fake_openai.script(
        tool_calls([call("a"), call("b", session="notes")]), text("x"), text("y"), text("z")
    )
    await made.run_turn(tape, [USER], turn_id="t1")
    page = metrics.render().decode()
    assert 'bub_subagents_total{mode="temp",status="ok"} 1.0' in page
    assert 'bub_subagents_total{mode="named",status="ok"} 1.0' in page
