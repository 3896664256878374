"""fs.write and fs.edit through the scripted model and the agent loop (tests/
test_workspace_files.py calls the registry directly): write, edit, read back, on the tape;
every refusal reaches the model as an error and changes nothing (`..`, absolute, a planted
symlink, secret files, the tape database at its own path, BUB_HOME, size cap, fs_edit too)."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.fakes.openai_server import text, tool_calls

OUTSIDE = "KEEP-OUTSIDE"


def tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


async def test_write_edit_and_read_back_on_the_tape(fake_openai, agent, tape, workspace):
    fake_openai.script(
        tool_calls([("fs_write", {"path": "docs/plan.md", "content": "step one\nstep one\n"})]),
        tool_calls([("fs_edit", {"path": "docs/plan.md", "old": "step one", "new": "x"})]),
        tool_calls([("fs_edit", {"path": "docs/plan.md", "old": "missing", "new": "x"})]),
        tool_calls(
            [("fs_edit", {"path": "docs/plan.md", "old": "one", "new": "two", "replace_all": True})]
        ),
        tool_calls([("fs_read", {"path": "docs/plan.md"})]),
        text("done"),
    )
    result = await agent().run_turn(tape, [{"role": "user", "content": "write a plan"}])
    assert result.status == "ok"
    requests = [r.body["messages"] for r in fake_openai.completion_requests()]
    results = tool_contents(requests[-1])
    assert results[0] == "created 'docs/plan.md' (18 bytes)"
    assert results[1].startswith("error: 'old' was found 2 times in 'docs/plan.md'")
    assert results[2].startswith("error: 'old' was not found in 'docs/plan.md' (0 times)")
    assert results[3].startswith("edited 'docs/plan.md': 2 replacement(s)")
    assert results[4] == "step two\nstep two\n"
    assert (workspace / "docs" / "plan.md").read_text() == "step two\nstep two\n"
    # Every write and edit is on the tape like any tool call.
    calls = [e.payload for e in await tape.query(kinds=["tool_call"])]
    assert "fs_write" in json.dumps(calls) and "fs_edit" in json.dumps(calls)


async def test_refusals_change_nothing(fake_openai, agent, tape, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text(OUTSIDE)
    os.symlink(outside / "target.txt", workspace / "planted.txt")  # as a command would
    os.symlink(outside, workspace / "planted_dir")
    (workspace / ".env").write_text("KEY=1")
    home = workspace / "bubhome"  # an operator who put BUB_HOME inside the workspace
    home.mkdir()
    db = workspace / "tapes.db"
    db.write_text("tapes")
    attempts = [
        ("fs_write", {"path": "../outside/x.txt", "content": "x"}),
        ("fs_write", {"path": str(outside / "x.txt"), "content": "x"}),
        ("fs_write", {"path": "planted.txt", "content": "evil"}),
        ("fs_write", {"path": "planted_dir/new.txt", "content": "evil"}),
        ("fs_write", {"path": ".env", "content": "KEY=2"}),
        ("fs_write", {"path": "conf/.aws/credentials", "content": "x"}),
        ("fs_write", {"path": "tapes.db", "content": "gone"}),
        ("fs_write", {"path": "tapes.db-wal", "content": "gone"}),
        ("fs_write", {"path": "bubhome/bub.db", "content": "gone"}),
        ("fs_write", {"path": "big.txt", "content": "x" * 2000}),
        ("fs_edit", {"path": "planted.txt", "old": "KEEP", "new": "LOST"}),
        ("fs_edit", {"path": ".env", "old": "1", "new": "2"}),
        ("fs_write", {"path": "", "content": "x"}),
    ]
    fake_openai.script(tool_calls(attempts), text("done"))
    conf = {"database_url": f"sqlite:///{db}", "fs_write_max_bytes": 1000, "home": home}
    result = await agent(**conf).run_turn(tape, [{"role": "user", "content": "try"}])
    assert result.status == "ok"
    got = tool_contents(fake_openai.completion_requests()[1].body["messages"])
    assert len(got) == len(attempts)
    assert all(r.startswith("error: ") for r in got), got
    assert "'..' is not allowed" in got[0]
    assert "absolute paths are not allowed" in got[1]
    assert "outside the workspace" in got[2] and "outside the workspace" in got[3]
    assert "may hold secrets" in got[4] and "may hold secrets" in got[5]
    assert all("own data" in r for r in got[6:9]), got[6:9]
    assert "BUB_FS_WRITE_MAX_BYTES" in got[9]
    assert "outside the workspace" in got[10]
    assert "may hold secrets" in got[11]
    assert "not a file" in got[12]
    assert (outside / "target.txt").read_text() == OUTSIDE
    assert os.listdir(outside) == ["target.txt"]
    assert (workspace / ".env").read_text() == "KEY=1"
    assert db.read_text() == "tapes"
    assert not (workspace / "big.txt").exists() and not (workspace / "conf").exists()
    assert os.listdir(home) == []
