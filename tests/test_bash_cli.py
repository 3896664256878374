"""bash end to end: `bub-bot run` as a user runs it, the fake model calling the tool; in a
simulated container without user namespaces (Landlock), and without Landlock either (bash not
offered, never unsandboxed); /tools through the runtime with workspace rules."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.test_cli import BUB, bub, cli_env

DOCKERISH = [sys.executable, str(Path(__file__).with_name("dockerish.py"))]


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


def tool_results(fake: FakeOpenAI) -> list[str]:
    last = fake.completion_requests()[-1].body["messages"]
    return [m["content"] for m in last if m["role"] == "tool"]


def offered(fake: FakeOpenAI) -> set[str]:
    first = fake.completion_requests()[0].body
    return {t["function"]["name"] for t in first.get("tools", [])}


async def launch(*argv: str, env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    """Run `argv` (the bot under the dockerish wrapper) to its end."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_with_bash(fake, tmp_path, *prefix: str, extra: dict | None = None):
    env = cli_env(fake, tmp_path)
    env["OPENAI_API_KEY"] = "sk-SECRET-KEY-of-the-bot"
    env.update(extra or {})
    fake.script(
        tool_calls([("bash", {"cmd": "echo made > made.txt; cat made.txt; env; exit 4"})]),
        text("done"),
    )
    if prefix:
        return await launch(*prefix, *BUB, "run", "make a file", env=env, cwd=tmp_path)
    return await bub("run", "make a file", env=env, cwd=tmp_path, timeout=60)


async def test_bub_run_calls_bash_in_the_sandbox(fake, tmp_path) -> None:
    code, out, err = await run_with_bash(fake, tmp_path)
    assert code == 0, err
    assert out == "done\n"
    assert "bash" in offered(fake)
    (result,) = tool_results(fake)
    data = json.loads(result)
    assert data["exit_code"] == 4 and data["output"].startswith("made\n")
    assert "sk-SECRET" not in result and "BUB_" not in result
    assert (tmp_path / "ws" / "made.txt").read_text() == "made\n"


async def test_without_user_namespaces_landlock_runs_the_command(fake, tmp_path) -> None:
    code, _out, err = await run_with_bash(fake, tmp_path, *DOCKERISH, "--")
    assert code == 0, err
    (result,) = tool_results(fake)
    data = json.loads(result)
    assert data["exit_code"] == 4 and data["output"].startswith("made\n")
    assert (tmp_path / "ws" / "made.txt").exists()


async def test_without_any_sandbox_bash_is_not_offered(fake, tmp_path) -> None:
    code, _out, err = await run_with_bash(fake, tmp_path, *DOCKERISH, "--no-landlock", "--")
    assert code == 0, err
    assert "bash" not in offered(fake)
    (result,) = tool_results(fake)
    assert result.startswith("error: unknown tool 'bash'")
    assert not (tmp_path / "ws" / "made.txt").exists()  # never run unsandboxed
    assert "bash.unavailable" in err and "BUB_SHELL_SANDBOX=none" in err


async def test_forced_backend_that_cannot_work_stops_the_start(fake, tmp_path) -> None:
    env = cli_env(fake, tmp_path)
    env["BUB_SHELL_SANDBOX"] = "bwrap"
    code, _out, err = await launch(*DOCKERISH, "--", *BUB, "run", "hi", env=env, cwd=tmp_path)
    assert code == 2
    assert "BUB_SHELL_SANDBOX=bwrap cannot work here" in err
    assert fake.completion_requests() == []


async def test_bub_tools_turns_groups_off(fake, tmp_path) -> None:
    code, _out, err = await run_with_bash(fake, tmp_path, extra={"BUB_TOOLS": "tape,fs"})
    assert code == 0, err
    names = offered(fake)
    assert "bash" not in names and "web_fetch" not in names and "fs_read" in names
    (result,) = tool_results(fake)
    assert result.startswith("error: unknown tool 'bash'")


async def test_tools_command_says_why_a_tool_is_missing(fake, tmp_path) -> None:
    rules = tmp_path / "map.json"
    (tmp_path / "narrow").mkdir()
    rules.write_text(
        json.dumps(
            {"workspaces": [{"match": "cli:*", "path": str(tmp_path / "narrow"), "tools": ["fs"]}]}
        )
    )
    env = cli_env(fake, tmp_path)
    env["BUB_WORKSPACE_MAP"] = str(rules)
    env["BUB_TOOLS"] = "tape,fs,spill,bash,skills"
    code, out, err = await bub("run", "/tools", env=env, cwd=tmp_path, timeout=60)
    assert code == 0, err
    assert "- fs_read" in out
    assert "Not offered here" in out
    assert "- bash — turned off by workspace rule 1 (match 'cli:*') of BUB_WORKSPACE_MAP" in out
    assert "- web_fetch — turned off (BUB_TOOLS does not list it)" in out
