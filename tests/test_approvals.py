"""Approvals in chat: the policy, and the flow through the real runtime (SQLite, the fake
model server, an in-process channel with buttons): a request bound to the exact calls, a
decision entering the session like a message, exactly one decision, each call run once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bub_bot.agent import ToolRegistry
from bub_bot.agent.builtin import register_builtins
from bub_bot.approvals.approvers import Approvers
from bub_bot.approvals.policy import ApprovalPolicy, ToolFacts, is_group_conversation
from bub_bot.approvals.requests import STARTED
from bub_bot.errors import ConfigError
from bub_bot.runtime import Runtime
from bub_bot.tape import TapeEntry
from bub_bot.workspaces import load_workspace_map
from channels.base import ApprovalClick, Sender
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.runtime_channel import RuntimeChannel, events, idle, make_runtime, tape_of, until

__all__ = ["make_runtime"]  # the fixture

GROUP = "slack:T1:C1:1.0"
PRIVATE = "slack:T1:D1"


# -- the policy --------------------------------------------------------------------------------
def test_defaults_ask_for_acting_tools_in_groups_only() -> None:
    policy = ApprovalPolicy.parse("")
    for name in ("bash", "fs.write", "fs.edit"):
        assert policy.decide(ToolFacts(name), GROUP) == "ask"
        assert policy.decide(ToolFacts(name), "telegram:-100123") == "ask"
        for private in (PRIVATE, "telegram:42", "web:abc", "cli:local"):
            assert policy.decide(ToolFacts(name), private) == "allow", (name, private)
    # bash.output and bash.kill only read or stop a job the conversation started
    for name in ("fs.read", "web.fetch", "tape.search", "schedule.add", "skill", "bash.output"):
        assert policy.decide(ToolFacts(name), GROUP) == "allow", name
    assert policy.decide(ToolFacts("bash.kill", "bash"), GROUP) == "allow"
    assert ApprovalPolicy.parse("bash=ask").decide(ToolFacts("bash.output"), PRIVATE) == "ask"
    assert is_group_conversation(GROUP) and not is_group_conversation(PRIVATE)


def test_mcp_tools_follow_their_annotations() -> None:
    policy = ApprovalPolicy.parse("")
    read = ToolFacts("mcp.gh.search", "mcp", read_only=True)
    write = ToolFacts("mcp.gh.create_issue", "mcp", read_only=False, destructive=False)
    bare = ToolFacts("mcp.gh.thing", "mcp")
    assert policy.decide(read, GROUP) == "allow"
    assert policy.decide(write, GROUP) == "ask"
    assert policy.decide(bare, GROUP) == "ask"
    assert policy.decide(bare, "web:x") == "allow"


def test_rules_most_specific_wins_and_workspace_overrides() -> None:
    policy = ApprovalPolicy.parse("fs=deny, fs.read=allow, mcp.gh.*=ask, mcp.*=deny, bash=allow")
    assert policy.decide(ToolFacts("fs.write"), PRIVATE) == "deny"
    assert policy.decide(ToolFacts("fs.read"), PRIVATE) == "allow"
    assert policy.decide(ToolFacts("mcp.gh.search", "mcp", read_only=True), PRIVATE) == "ask"
    assert policy.decide(ToolFacts("mcp.other.x", "mcp", read_only=True), PRIVATE) == "deny"
    assert policy.decide(ToolFacts("bash"), GROUP) == "allow"
    assert policy.decide(ToolFacts("bash"), GROUP, {"bash": "deny"}) == "deny"


@pytest.mark.parametrize("value", ["bash", "bash=maybe", "=ask"])
def test_bad_policy_names_the_setting(value: str) -> None:
    with pytest.raises(ConfigError, match="BUB_APPROVE"):
        ApprovalPolicy.parse(value)


def test_workspace_rule_approve_key(tmp_path) -> None:
    rules = tmp_path / "map.json"
    body = {"match": "slack:*", "path": str(tmp_path), "approve": {"bash": "deny"}}
    rules.write_text(json.dumps({"workspaces": [body]}))
    found = load_workspace_map(rules, tmp_path)
    assert found.rule_for(GROUP).approve == {"bash": "deny"}
    rules.write_text(json.dumps({"workspaces": [{**body, "approve": {"bash": "sure"}}]}))
    with pytest.raises(ConfigError, match="rule 1: approve"):
        load_workspace_map(rules, tmp_path)


def test_approvers() -> None:
    default = Approvers.parse("")
    assert default.allowed("slack", "U1", "U1") and not default.allowed("slack", "U2", "U1")
    team = Approvers.parse("requester,slack:U9,telegram:*")
    assert team.allowed("slack", "U9", "U1") and not team.allowed("slack", "U8", "U1")
    assert team.allowed("telegram", "5", "6")
    assert Approvers.parse("*").allowed("web", "x", "y")
    assert not Approvers.parse("slack:U9").allowed("slack", "U1", "U1")


# -- the flow ----------------------------------------------------------------------------------
class ButtonChannel(RuntimeChannel):
    """The runtime test channel with buttons: records requests posted and their updates."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[dict[str, Any]] = []
        self.settled: list[tuple[list[str], str]] = []

    async def ask(self, target: dict[str, Any], request: dict[str, Any]) -> list[str]:
        ids = await self.send(target, request["text"])
        self.asked.append(request)
        return ids

    async def settle(
        self, target: dict[str, Any], ids: list[str], request: dict[str, Any], text_: str
    ) -> None:
        self.settled.append((ids, text_))


def counting_registry() -> tuple[ToolRegistry, list[str]]:
    """The built-in tools and a `bash` stand-in that records each run."""
    registry = register_builtins(ToolRegistry())
    runs: list[str] = []

    @registry.tool("bash")
    async def bash(ctx, command: str) -> str:
        """Run a command."""
        runs.append(command)
        return f"ran {command}"

    return registry, runs


def click(runtime: Runtime, request: dict[str, Any], decision: str, user: str = "u1", **kw):
    return runtime.decide(
        ApprovalClick(
            channel="test",
            session_id=kw.get("session", "test:a"),
            request_id=request["id"],
            digest=kw.get("digest", request["digest"]),
            decision=decision,
            user=Sender(user, user.upper()),
        )
    )


def tool_texts(fake: FakeOpenAI) -> list[str]:
    last = fake.completion_requests()[-1].body["messages"]
    return [m["content"] for m in last if m["role"] == "tool"]


async def asked_once(runtime, channel: ButtonChannel, fake: FakeOpenAI, say: str = "go"):
    fake.script(tool_calls([("bash", {"command": "echo hi"})]), text("done"))
    await channel.say(say)
    await until(lambda: len(channel.asked) == 1)
    await idle(runtime, "test:a")
    return channel.asked[0]


async def test_approve_runs_the_call_once(make_runtime, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    request = await asked_once(runtime, channel, fake_openai)
    assert "echo hi" in request["text"] and runs == []
    assert await click(runtime, request, "approve", user="u2") == "not_allowed"
    assert await click(runtime, request, "approve", digest="0" * 16) == "unknown"
    assert runs == []
    assert await click(runtime, request, "approve") == "approve"
    assert await click(runtime, request, "approve") == "already"  # the double click
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert runs == ["echo hi"]
    assert channel.texts("a")[-1] == "done"
    assert tool_texts(fake_openai) == ["ran echo hi"]
    assert channel.settled and channel.settled[0][0] and "Approved by U1" in channel.settled[0][1]
    assert await click(runtime, request, "deny") == "already"
    assert len(fake_openai.completion_requests()) == 2


async def test_deny_is_a_result_the_model_sees(make_runtime, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(
        ButtonChannel(), registry, approve="bash=ask", approvers="requester,test:boss"
    )
    request = await asked_once(runtime, channel, fake_openai)
    assert await click(runtime, request, "deny", user="boss") == "deny"
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert runs == []
    assert tool_texts(fake_openai) == ["error: denied by BOSS; the call did not run."]


async def test_expiry_and_a_click_after_it(make_runtime, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(
        ButtonChannel(), registry, approve="bash=ask", approval_timeout_seconds=0.05
    )
    request = await asked_once(runtime, channel, fake_openai)
    await asyncio.sleep(0.1)
    assert await click(runtime, request, "approve") == "expired"  # stores the expiry
    fired = await runtime.timer.fire_due()
    assert [f.entry for f in fired] == [None]  # the job's decision shares the key: a duplicate
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert runs == []
    assert tool_texts(fake_openai) == ["error: not approved in time; the call did not run."]
    assert await click(runtime, request, "approve") == "already"


async def test_messages_while_waiting_reach_the_model_after(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    request = await asked_once(runtime, channel, fake_openai)
    await channel.say("also, hurry")
    await idle(runtime, "test:a")
    assert len(fake_openai.completion_requests()) == 1  # held: no model call
    assert await click(runtime, request, "approve") == "approve"
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    body = fake_openai.completion_requests()[-1].body["messages"]
    assert any(m["role"] == "user" and m["content"] == "also, hurry" for m in body)
    assert runs == ["echo hi"]


async def test_typed_deny(make_runtime, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    await asked_once(runtime, channel, fake_openai)
    await channel.say("/deny")
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert runs == [] and "denied by U1" in tool_texts(fake_openai)[0]


async def test_a_typed_decision_that_decides_nothing_says_why(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    await channel.say("/approve")
    await channel.wait_sent("a", 1)
    assert channel.texts()[-1] == "No approval request is waiting here."
    request = await asked_once(runtime, channel, fake_openai)
    await channel.say("/approve", sender="u2")  # not the requester: refused, nothing changes
    await channel.wait_sent("a", 3)
    await idle(runtime, "test:a")
    assert channel.texts()[-1].startswith("You may not decide this request") and runs == []
    await channel.say("/approve 123")
    await channel.wait_sent("a", 4)
    assert channel.texts()[-1].startswith("give a request id or nothing")
    await channel.say(f"/approve {request['id']}")
    await until(lambda: channel.texts()[-1:] == ["done"])
    await idle(runtime, "test:a")
    assert runs == ["echo hi"]
    await channel.say(f"/deny {request['id']}")
    await channel.wait_sent("a", 6)
    assert channel.texts()[-1] == f"No approval request {request['id']} is waiting here."
    assert runs == ["echo hi"] and len(fake_openai.completion_requests()) == 2


async def test_restart_while_waiting_then_approve(
    make_runtime, fake_openai: FakeOpenAI, store
) -> None:
    registry, runs = counting_registry()
    first, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    request = await asked_once(first, channel, fake_openai)
    await first.shutdown(grace=1)
    second, channel2 = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    await second.start()
    assert await click(second, request, "approve") == "approve"
    await channel2.wait_sent("a", 1)
    await idle(second, "test:a")
    assert runs == ["echo hi"]
    assert channel2.texts("a") == ["done"]


async def test_a_policy_that_denies_by_the_click_wins_over_the_approval(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    first, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    request = await asked_once(first, channel, fake_openai)
    await first.shutdown(grace=1)
    # The operator turned bash off while the request waited: the approval runs nothing.
    second, channel2 = make_runtime(ButtonChannel(), registry, approve="bash=deny")
    await second.start()
    assert await click(second, request, "approve") == "approve"
    await channel2.wait_sent("a", 1)
    await idle(second, "test:a")
    assert runs == [] and "not allowed here" in tool_texts(fake_openai)[0]


async def test_a_run_interrupted_by_a_crash_is_not_repeated(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask")
    request = await asked_once(runtime, channel, fake_openai)
    tape = tape_of(runtime, "test:a")
    # What a crash after the marker and before the results leaves behind.
    await tape.append(TapeEntry.event(STARTED, {"request": request["id"]}, context=False))
    assert await click(runtime, request, "approve") == "approve"
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert runs == []
    assert "restarted while this call was running" in tool_texts(fake_openai)[0]
    assert len(await events(tape, "approval.closed")) == 1


async def test_expiry_job_settles_without_a_click(make_runtime, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(
        ButtonChannel(), registry, approve="bash=ask", approval_timeout_seconds=0.05
    )
    request = await asked_once(runtime, channel, fake_openai)
    await asyncio.sleep(0.1)
    fired = await runtime.timer.fire_due()
    assert [f.entry is not None for f in fired] == [True]
    await channel.wait_sent("a", 2)
    await idle(runtime, "test:a")
    assert runs == [] and "not approved in time" in tool_texts(fake_openai)[0]
    assert "Not approved in time" in channel.settled[0][1]
    assert await click(runtime, request, "approve") == "already"


async def test_allowed_and_denied_calls_need_no_click(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=deny")
    fake_openai.script(tool_calls([("bash", {"command": "rm -rf /"})]), text("ok"))
    await channel.say("go")
    await channel.wait_sent("a", 1)
    await idle(runtime, "test:a")
    assert runs == [] and channel.asked == []
    assert "not allowed here" in tool_texts(fake_openai)[0]


async def test_reset_cancels_a_waiting_request(make_runtime, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(
        ButtonChannel(), registry, approve="bash=ask", approval_timeout_seconds=0.05
    )
    request = await asked_once(runtime, channel, fake_openai)
    await channel.say("/reset")
    await channel.wait_sent("a", 2)
    await channel.say("hello again")  # not held: the request went with the reset
    await channel.wait_sent("a", 3)
    await idle(runtime, "test:a")
    assert channel.texts("a")[-1] == "done"  # the model's next (scripted) answer
    last = fake_openai.completion_requests()[-1].body["messages"]
    assert [m["content"] for m in last if m["role"] == "user"] == ["hello again"]
    calls = len(fake_openai.completion_requests())
    await asyncio.sleep(0.1)
    await runtime.timer.fire_due()  # the expiry finds no request: no model call, no message
    await idle(runtime, "test:a")
    assert len(fake_openai.completion_requests()) == calls and len(channel.texts("a")) == 3
    assert await click(runtime, request, "approve") == "unknown" and runs == []


def test_request_describes_what_will_run() -> None:
    from bub_bot.approvals.requests import describe_call

    assert describe_call("bash", '{"command": "make deploy"}') == "bash: $ make deploy"
    assert describe_call("bash", '{"cmd": "make test", "background": true}') == "bash: $ make test"
    body = json.dumps({"path": "src/app.py", "content": "x = 1\n" * 40})
    assert (
        describe_call("fs.write", body) == "fs.write src/app.py (content: 40 lines, 240 characters)"
    )
    edit = json.dumps({"path": "a.txt", "old_text": "a\nb\n", "new_text": "c\n"})
    assert describe_call("fs.edit", edit) == "fs.edit a.txt (-2 +1 lines)"
    assert describe_call("mcp.gh.create", '{"title": "x"}') == 'mcp.gh.create {"title": "x"}'


async def test_web_fetch_runs_once_after_approval(make_runtime, fake_openai: FakeOpenAI) -> None:
    from tests.fakes.web_site import FakeSite

    async with FakeSite("127.0.0.1") as site:
        site.page("/page", "<h1>Release notes</h1><p>all good</p>")
        registry, _ = counting_registry()
        runtime, channel = make_runtime(
            ButtonChannel(), registry, approve="web=ask", fetch_allow="127.0.0.1:*"
        )
        fake_openai.script(tool_calls([("web_fetch", {"url": site.url("/page")})]), text("read it"))
        await channel.say("read the notes")
        await until(lambda: len(channel.asked) == 1)
        await idle(runtime, "test:a")
        assert site.paths() == []  # nothing fetched before the click
        request = channel.asked[0]
        assert await click(runtime, request, "approve") == "approve"
        assert await click(runtime, request, "approve") == "already"
        await channel.wait_sent("a", 2)
        await idle(runtime, "test:a")
        assert site.paths() == ["/page"]  # once
        assert "Release notes" in tool_texts(fake_openai)[0]


# -- the acting tools (fs.write, fs.edit) with the default policy --------------------------------
async def test_fs_write_asks_in_a_group_and_not_in_a_dm(
    make_runtime, fake_openai: FakeOpenAI, workspace
) -> None:
    channel = ButtonChannel()
    channel.name = "slack"  # sessions slack:<chat>: a channel thread, and a DM
    runtime, channel = make_runtime(channel)
    group, dm = "T1:C1:1.0", "T1:D1"
    write = ("fs_write", {"path": "notes.txt", "content": "one\ntwo\n"})
    fake_openai.script(tool_calls([write]), text("written"))
    await channel.say("write it", chat=dm)
    await channel.wait_sent(dm, 1)
    assert channel.asked == [] and (workspace / "notes.txt").read_text() == "one\ntwo\n"

    edit = ("fs_edit", {"path": "notes.txt", "old": "two\n", "new": "2\n"})
    fake_openai.script(tool_calls([edit]), text("edited"), tool_calls([edit]), text("fine"))
    await channel.say("edit it", chat=group)
    await until(lambda: len(channel.asked) == 1)
    await idle(runtime, f"slack:{group}")
    request = channel.asked[0]
    assert "fs.edit notes.txt (-1 +1 lines)" in request["text"]
    assert (workspace / "notes.txt").read_text() == "one\ntwo\n"  # not before the click
    deny = ApprovalClick(
        "slack", f"slack:{group}", request["id"], request["digest"], "deny", Sender("u1")
    )
    assert await runtime.decide(deny) == "deny"
    await channel.wait_sent(group, 2)
    await idle(runtime, f"slack:{group}")
    assert (workspace / "notes.txt").read_text() == "one\ntwo\n"

    await channel.say("edit it now", chat=group)
    await until(lambda: len(channel.asked) == 2)
    await idle(runtime, f"slack:{group}")
    second = channel.asked[1]
    approve = ApprovalClick(
        "slack", f"slack:{group}", second["id"], second["digest"], "approve", Sender("u1")
    )
    assert await runtime.decide(approve) == "approve"
    await channel.wait_sent(group, 4)
    await idle(runtime, f"slack:{group}")
    assert (workspace / "notes.txt").read_text() == "one\n2\n"


async def test_a_subagent_cannot_ask(agent, tape, fake_openai: FakeOpenAI) -> None:
    registry, runs = counting_registry()
    built = agent(registry, approve="bash=ask")
    fake_openai.script(tool_calls([("bash", {"command": "make deploy"})]), text("could not"))
    result = await built.run_turn(tape, [{"role": "user", "content": "deploy"}], depth=1)
    assert result.status == "ok" and runs == []
    assert "a subagent cannot ask" in tool_texts(fake_openai)[0]
    assert await events(tape, "approval.request") == []


# -- with budgets and tool groups (main's bash, BUB_TOOLS, budgets) ----------------------------
USED = {"prompt_tokens": 80, "completion_tokens": 30, "total_tokens": 110}


async def test_the_asking_call_counts_and_the_continued_turn_is_the_askers(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask", approvers="*")
    fake_openai.script(
        tool_calls([("bash", {"command": "echo hi"})], usage=USED), text("done", usage=USED)
    )
    await channel.say("go")
    await until(lambda: len(channel.asked) == 1)
    await idle(runtime, "test:a")
    rows = await runtime.budgets.rows(["u:test:u1", "u:test:u2"])
    assert rows["u:test:u1"][0].tokens == 110  # the call that asked is paid for
    assert await click(runtime, channel.asked[0], "approve", user="u2") == "approve"
    await until(lambda: channel.texts()[-1:] == ["done"])
    await idle(runtime, "test:a")
    assert runs == ["echo hi"]
    rows = await runtime.budgets.rows(["u:test:u1", "u:test:u2"])
    # the turn the click continued is charged to who asked, not to who clicked
    assert rows["u:test:u1"][0].tokens == 220 and rows["u:test:u2"][0].tokens == 0
    decision = (await events(tape_of(runtime, "test:a"), "approval.decision"))[0]
    assert decision.meta["payer"]["user"] == "test:u1"


async def test_a_spent_budget_stops_the_continued_turn(make_runtime, fake_openai) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(
        ButtonChannel(), registry, approve="bash=ask", budget_user="100/day"
    )
    fake_openai.script(tool_calls([("bash", {"command": "echo hi"})], usage=USED), text("no"))
    await channel.say("go")
    await until(lambda: len(channel.asked) == 1)
    await idle(runtime, "test:a")
    request = channel.asked[0]
    assert await click(runtime, request, "approve") == "approve"
    await until(lambda: "budget" in channel.texts()[-1])
    await idle(runtime, "test:a")
    assert runs == ["echo hi"]  # the approved call ran; the model was not called again
    assert len(fake_openai.completion_requests()) == 1


async def test_a_tool_the_session_is_not_offered_is_not_asked_about(
    make_runtime, fake_openai: FakeOpenAI
) -> None:
    registry, runs = counting_registry()
    runtime, channel = make_runtime(ButtonChannel(), registry, approve="bash=ask", tools="fs,tape")
    fake_openai.script(tool_calls([("bash", {"command": "echo hi"})]), text("ok"))
    await channel.say("go")
    await until(lambda: channel.texts()[-1:] == ["ok"])
    await idle(runtime, "test:a")
    assert channel.asked == [] and runs == []
    assert "unknown tool" in tool_texts(fake_openai)[0]


async def test_a_sandboxed_command_waits_for_the_click_in_a_group_and_runs_once(
    make_runtime, fake_openai: FakeOpenAI, settings, workspace
) -> None:
    from bub_bot.agent.bash import install_bash

    registry = register_builtins(ToolRegistry())
    assert await install_bash(registry, settings()) is not None  # bwrap or Landlock here
    channel = ButtonChannel()
    channel.name = "slack"
    runtime, channel = make_runtime(channel, registry)  # the default policy
    group = "T1:C1:2.0"
    run = ("bash", {"cmd": "echo ran >> ran.txt; cat ran.txt"})
    fake_openai.script(tool_calls([run]), text("done"))
    await channel.say("run it", chat=group)
    await until(lambda: len(channel.asked) == 1)
    await idle(runtime, f"slack:{group}")
    request = channel.asked[0]
    assert "bash: $ echo ran >> ran.txt; cat ran.txt" in request["text"]
    assert not (workspace / "ran.txt").exists()  # not before the click
    press = ApprovalClick(
        "slack", f"slack:{group}", request["id"], request["digest"], "approve", Sender("u1")
    )
    assert await runtime.decide(press) == "approve"
    assert await runtime.decide(press) == "already"  # a double click
    await channel.wait_sent(group, 2)
    await idle(runtime, f"slack:{group}")
    assert (workspace / "ran.txt").read_text() == "ran\n"  # in the sandbox, once
    (result,) = tool_texts(fake_openai)
    assert '"exit_code": 0' in result and "ran" in result
