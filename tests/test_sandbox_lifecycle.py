"""The bash tool's life cycle in real sandboxes: background jobs (limits, shutdown, restart),
a SIGKILLed bot, no user namespaces, a sandbox failing mid-run, BUB_SHELL_SANDBOX=none, the
workspace rule's tools and network keys."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from bub_bot.agent import ToolRegistry
from bub_bot.agent.bash import install_bash
from bub_bot.config import ConfigError
from bub_bot.tape import SQLiteTapeStore, Tape
from tests import sandbox_harness as harness
from tests.sandbox_harness import (
    BACKENDS,
    CONNECT,
    Bash,
    Listener,
    failing_bwrap,
    leftovers,
    no_leftovers,
)

bash = harness.bash
make_bash = harness.make_bash
reachable_workspace = harness.reachable_workspace


async def test_background_job_lifecycle(bash: Bash, store: SQLiteTapeStore, workspace) -> None:
    ok, started = await bash.call("bash", cmd="echo first; sleep 0.5; echo second", background=True)
    assert ok and started["state"] == "running"
    job = started["job_id"]
    for _ in range(100):
        ok, seen = await bash.call("bash.output", job_id=job)
        if seen["state"] != "running":
            break
        await asyncio.sleep(0.1)
    assert seen["state"] == "exited" and seen["exit_code"] == 0
    assert seen["output"] == "first\nsecond\n"
    ok, rest = await bash.call("bash.output", job_id=job, offset=6)
    assert rest["output"] == "second\n"

    marker = f"5{os.getpid() % 1000:03d}3"
    ok, long = await bash.call(
        "bash", cmd=f"setsid sleep {marker} & sleep {marker}", background=True
    )
    ok, killed = await bash.call("bash.kill", job_id=long["job_id"])
    assert ok and killed["state"] == "killed"
    assert await no_leftovers(f"sleep\0{marker}") == []

    # Shutdown: running jobs are killed and the tape says so.
    ok, last = await bash.call("bash", cmd=f"sleep {marker}", background=True)
    await bash.shell.close()
    assert await no_leftovers(f"sleep\0{marker}") == []
    states = [
        (e.payload["data"]["job_id"], e.payload["data"]["state"])
        for e in await bash.ctx.tape.query(kinds=["event"], names=["bash.job"])
    ]
    assert (job, "exited") in states and (long["job_id"], "killed") in states
    assert (last["job_id"], "stopped_by_shutdown") in states
    ok, unknown = await bash.call("bash.output", job_id="nope")
    assert not ok and "no background job 'nope'" in unknown


async def test_a_job_of_an_earlier_process_says_it_was_stopped_by_the_restart(
    make_bash, settings, store
) -> None:
    before = await make_bash("bwrap")
    ok, started = await before.call("bash", cmd="sleep 60", background=True)
    assert ok
    # A new bot process: its own job table, the same tape.
    after_registry = ToolRegistry()
    shell = await install_bash(after_registry, settings(shell_sandbox="bwrap"))
    assert shell is not None
    ok, seen = await after_registry.call(
        before.ctx, "bash.output", json.dumps({"job_id": started["job_id"]})
    )
    assert ok and seen["state"] == "stopped_by_restart" and "restarted" in seen["note"]
    await shell.close()


async def test_background_jobs_are_limited_per_session(make_bash) -> None:
    bash = await make_bash("bwrap", shell_max_jobs=1)
    ok, _ = await bash.call("bash", cmd="sleep 30", background=True)
    ok, second = await bash.call("bash", cmd="sleep 30", background=True)
    assert not ok and "BUB_SHELL_MAX_JOBS" in second


async def test_timeout_above_the_maximum_is_refused(make_bash) -> None:
    bash = await make_bash("bwrap", shell_timeout_max=5)
    ok, refused = await bash.call("bash", cmd="true", timeout_seconds=6)
    assert not ok and "BUB_SHELL_TIMEOUT_MAX=5" in refused


async def test_no_user_namespaces_means_landlock_or_a_clear_refusal(
    settings, reachable_workspace
) -> None:
    fake = failing_bwrap(reachable_workspace.parent)  # as root it runs as the sandbox uid
    registry = ToolRegistry()
    shell = await install_bash(registry, settings(shell_bwrap=str(fake)))
    assert shell is not None and shell.availability.name == "landlock"
    assert "No permissions to create new namespace" in shell.availability.reasons["bwrap"]
    await shell.close()
    with pytest.raises(ConfigError, match="BUB_SHELL_SANDBOX=bwrap cannot work here"):
        await install_bash(ToolRegistry(), settings(shell_sandbox="bwrap", shell_bwrap=str(fake)))


async def test_sandbox_failing_mid_run_is_an_error_never_unsandboxed(
    make_bash, reachable_workspace
) -> None:
    workspace = reachable_workspace
    bash = await make_bash("bwrap", ws=workspace)
    fake = failing_bwrap(workspace.parent)
    bash.shell.availability.backend.bwrap = str(fake)  # bwrap breaks after the start
    ok, result = await bash.call("bash", cmd="echo ran > ran.txt")
    assert not ok and "could not start the command, so it did not run" in result
    assert not (workspace / "ran.txt").exists()


def test_tools_and_network_rule_keys(tmp_path: Path) -> None:
    from bub_bot.workspaces import load_workspace_map

    rules = tmp_path / "map.json"
    rules.write_text(
        json.dumps(
            {
                "workspaces": [
                    {"match": "web:*", "path": str(tmp_path), "tools": ["fs"], "network": True},
                    {"match": "x:*", "path": str(tmp_path), "tools": ["shell"]},
                ]
            }
        )
    )
    with pytest.raises(ConfigError, match="rule 2: unknown tool group 'shell'"):
        load_workspace_map(rules, tmp_path)
    rules.write_text(
        json.dumps({"workspaces": [{"match": "*", "path": str(tmp_path), "network": "yes"}]})
    )
    with pytest.raises(ConfigError, match="network must be true or false"):
        load_workspace_map(rules, tmp_path)


async def test_workspace_rule_turns_the_network_on_for_its_sessions_only(
    fake_openai, agent, store, tmp_path, workspace
) -> None:
    from tests.fakes.openai_server import text, tool_calls

    rules = tmp_path / "map.json"
    rules.write_text(
        json.dumps({"workspaces": [{"match": "net:*", "path": str(workspace), "network": True}]})
    )
    registry = ToolRegistry()
    made = agent(registry, workspace_map=rules)
    shell = await install_bash(registry, made.settings)
    listener = Listener()
    try:
        async with listener as port:
            for session in ("net:1", "plain:1"):
                fake_openai.script(
                    tool_calls([("bash", {"cmd": CONNECT.format(host="127.0.0.1", port=port)})]),
                    text("ok"),
                )
                tape = Tape.for_session(store, session, workspace)
                result = await made.run_turn(tape, [{"role": "user", "content": "connect"}])
                assert result.status == "ok"
            first, second = (
                [m for m in r.body["messages"] if m["role"] == "tool"][-1]["content"]
                for r in fake_openai.completion_requests()[1::2]
            )
    finally:
        await shell.close()
    assert "REACHED" in first and "REACHED" not in second
    assert listener.hits == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_nothing_survives_a_sigkilled_bot(backend, tmp_path, workspace) -> None:
    marker = f"6{os.getpid() % 1000:03d}{BACKENDS.index(backend)}"
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("bash_kill_child.py")),
        backend, str(workspace), str(tmp_path / "home"), marker,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 30)
    assert line.strip() == b"READY"
    assert len(leftovers(f"sleep\0{marker}")) >= 3  # the job really runs
    child.kill()
    await child.wait()
    assert await no_leftovers(f"sleep\0{marker}") == []


async def test_none_runs_unsandboxed_only_when_asked_and_warns(
    make_bash, workspace, caplog
) -> None:
    with caplog.at_level("WARNING", logger="bub_bot.sandbox"):
        bash = await make_bash("none")
    assert "bash.UNSANDBOXED BUB_SHELL_SANDBOX=none" in caplog.text
    result = await bash.run("pwd; env | cut -d= -f1 | sort | tr '\\n' ' '")
    assert result["output"].splitlines()[0] == str(workspace.resolve())
    assert "OPENAI" not in result["output"] and "BUB_" not in result["output"]
