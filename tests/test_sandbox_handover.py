"""Handing the workspace to the sandbox uid (the bot runs as root) never re-owns a host file:
not through a directory a background job swaps for a symlink while the walk runs, not
through a symlink, not through a hard link. It happens once per start and workspace; what
the bot's file tools write later is created for the sandbox uid."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bub_bot.agent.sandbox.handover import hand_over
from tests import sandbox_harness as harness
from tests.sandbox_harness import BACKENDS

make_bash = harness.make_bash
reachable_workspace = harness.reachable_workspace

UID = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hand-over happens as root only")

# A background job that keeps swapping the directory `d` between a real directory (with
# many files, so the walk lingers in it) and a symlink to the host directory.
SWAP = r"""
mkdir -p real; i=0; while [ $i -lt 3000 ]; do : > real/f$i; i=$((i+1)); done
: > real/victim.txt; echo ready > ready
while true; do
  mv real d 2>/dev/null; ln -s {victim_dir} link 2>/dev/null
  mv -T d real; mv -T link d; sleep 0.0005; mv -T d link 2>/dev/null; rm -f link
done
"""


def host_victim(tmp_path: Path) -> Path:
    """A root-only host file in a directory outside the workspace."""
    victim_dir = tmp_path / "host-victim"
    victim_dir.mkdir()
    victim = victim_dir / "victim.txt"
    victim.write_text("root-only host data")
    victim.chmod(0o600)
    os.chown(victim, 0, 0)
    os.chown(victim_dir, 0, 0)
    return victim


def owners(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, st.st_mode


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_swapped_directory_never_leads_the_hand_over_outside(
    make_bash, reachable_workspace: Path, tmp_path: Path, backend: str
) -> None:
    victim = host_victim(tmp_path)
    before = owners(victim)
    bash = await make_bash(backend, ws=reachable_workspace)
    ok, started = await bash.call(
        "bash", cmd=SWAP.format(victim_dir=victim.parent), background=True, timeout_seconds=300
    )
    assert ok, started
    try:
        for _ in range(600):  # the job's set-up, however slow the machine is
            if (reachable_workspace / "ready").exists():
                break
            await asyncio.sleep(0.05)
        assert (reachable_workspace / "ready").exists(), "the swap job did not start"
        # A command hands a workspace over once per start (the swap job's own start did);
        # the walk it runs is exercised here, again and again, while the job swaps.
        for _ in range(150):  # before the fix: a host file was chowned within ~20 walks
            await asyncio.to_thread(hand_over, reachable_workspace, UID)
            assert owners(victim) == before, f"{backend}: a host file was re-owned"
        result = await bash.run("true")
        assert result["exit_code"] == 0
        job = bash.shell.jobs.jobs[started["job_id"]]
        assert job.state == "running", "the swap job ended early: the test proved nothing"
    finally:
        await bash.call("bash.kill", job_id=started["job_id"])
    assert owners(victim) == before
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]


def test_hand_over_leaves_links_to_host_files_alone(tmp_path: Path) -> None:
    victim = host_victim(tmp_path)
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "mine.txt").write_text("the bot wrote this as root")
    os.symlink(victim.parent, ws / "dir-link")
    os.symlink(victim, ws / "sub" / "file-link")
    os.link(victim, ws / "sub" / "hard-link")  # a host inode inside the tree
    before = owners(victim)
    changed = hand_over(ws, UID)
    assert owners(victim) == before  # neither followed nor re-owned through the hard link
    for path in (
        ws,
        ws / "sub",
        ws / "sub" / "mine.txt",
        ws / "dir-link",
        ws / "sub" / "file-link",
    ):
        assert owners(path)[:2] == (UID, UID), path
    assert changed == 5
    assert hand_over(ws, UID) == 0  # a second walk changes nothing


def test_hand_over_does_not_cross_into_a_symlinked_root(tmp_path: Path) -> None:
    victim = host_victim(tmp_path)
    os.symlink(victim.parent, tmp_path / "ws")
    changed = hand_over(tmp_path / "ws", UID)
    assert owners(victim.parent)[:2] == (0, 0) and owners(victim)[:2] == (0, 0)
    assert changed == 0


@pytest.mark.parametrize("backend", BACKENDS)
async def test_once_per_start_and_the_file_tools_write_for_the_sandbox_uid(
    make_bash, reachable_workspace: Path, backend: str
) -> None:
    from bub_bot.agent.fs_tools import register_fs_tools

    ws = reachable_workspace
    (ws / "from-operator.txt").write_text("there before the start\n")
    bash = await make_bash(backend, ws=ws)
    register_fs_tools(bash.registry)
    first = await bash.run("echo more >> from-operator.txt && echo ok")
    assert first["output"] == "ok\n", first  # handed over by the first command
    for args in (
        {"path": "from-operator.txt", "content": "replaced by fs_write\n"},
        {"path": "new/deeper/made.txt", "content": "made by fs_write\n"},
    ):
        ok, body = await bash.call("fs_write", **args)
        assert ok, body
    for path in ("from-operator.txt", "new", "new/deeper", "new/deeper/made.txt"):
        assert owners(ws / path)[:2] == (UID, UID), path
    later = await bash.run(
        "echo x >> from-operator.txt && echo y >> new/deeper/made.txt && touch new/deeper/z"
        " && echo ok"
    )
    assert later["output"] == "ok\n", later
    # Not walked again: a root file put there by something else stays root's.
    (ws / "root-later.txt").write_text("root's")
    await bash.run("true")
    assert owners(ws / "root-later.txt")[:2] == (0, 0)


async def test_a_workspace_made_again_is_handed_over_again(make_bash, reachable_workspace):
    ws = reachable_workspace
    bash = await make_bash("landlock", ws=ws)
    assert (await bash.run("echo 1 > a && echo ok"))["output"] == "ok\n"
    for child in ws.iterdir():
        child.unlink()
    ws.rmdir()
    ws.mkdir()  # a new root-owned directory at the same path
    again = await bash.run("echo 2 > b && echo ok")
    assert again["output"] == "ok\n", again


async def test_where_the_sandbox_runs_as_mapped_root_the_bot_writes_as_root(
    make_bash, workspace: Path
) -> None:
    """bubblewrap as root with a workspace the sandbox uid cannot reach: nothing is handed
    over, the command is root mapped in a user namespace, so what fs_write makes stays
    root's — a file of the sandbox uid would be read-only to it."""
    from bub_bot.agent.fs_tools import register_fs_tools

    bash = await make_bash("bwrap", ws=workspace)
    register_fs_tools(bash.registry)
    assert (await bash.run("true"))["exit_code"] == 0
    ok, body = await bash.call("fs_write", path="sub/made.txt", content="by fs_write\n")
    assert ok, body
    assert owners(workspace / "sub" / "made.txt")[:2] == (0, 0)
    result = await bash.run("echo more >> sub/made.txt && touch sub/new && echo ok")
    assert result["output"] == "ok\n", result
