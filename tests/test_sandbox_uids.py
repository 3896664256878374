"""BUB_SHELL_UIDS: each workspace's commands run as their own uid (the bot runs as root), so
under Landlock one conversation can neither change another workspace's file modes and times
nor starve its commands of processes (RLIMIT_NPROC counts per uid)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bub_bot.config import ConfigError, load_settings
from bub_bot.config_values import workspace_uid
from tests import sandbox_harness as harness
from tests.sandbox_harness import BACKENDS, no_leftovers

make_bash = harness.make_bash

UIDS = "300000-399999"
RANGE = (300000, 399999)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="uids are switched as root only")


@pytest.fixture
def two_workspaces() -> Iterator[tuple[Path, Path]]:
    """Two workspaces under one root the sandbox uids can traverse (a per-conversation
    BUB_WORKSPACE_MAP template), with distinct uids in RANGE."""
    top = Path(tempfile.mkdtemp(prefix="bub-test-uids-"))
    top.chmod(0o711)
    a = top / "conv-a"
    a.mkdir()
    for n in range(100):  # a hash collision is possible in principle: pick another name
        b = top / f"conv-b{n}"
        if workspace_uid(b, 65534, RANGE) != workspace_uid(a, 65534, RANGE):
            break
    b.mkdir()
    yield a, b
    shutil.rmtree(top, ignore_errors=True)


def test_each_workspace_gets_a_stable_uid_of_the_range(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert workspace_uid(one, 65534, None) == 65534 == workspace_uid(two, 65534, None)
    uid = workspace_uid(one, 65534, RANGE)
    assert RANGE[0] <= uid <= RANGE[1] and uid == workspace_uid(one, 65534, RANGE)
    assert len({workspace_uid(tmp_path / str(n), 65534, RANGE) for n in range(50)}) > 40


@pytest.mark.parametrize("value", ["abc", "5-", "300000-200000", "0-99999", "1000-9999999999"])
def test_a_bad_range_is_a_clear_error(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BUB_SHELL_UIDS", value)
    with pytest.raises(ConfigError, match="BUB_SHELL_UIDS"):
        load_settings(require_model=False, _env_file=None, home=tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_another_workspace_s_modes_and_times_cannot_be_changed(
    make_bash, two_workspaces: tuple[Path, Path], backend: str
) -> None:
    a, b = two_workspaces
    a_bash = await make_bash(backend, ws=a, shell_uids=UIDS)
    b_bash = await make_bash(backend, ws=b, shell_uids=UIDS)
    made = await b_bash.run("echo B-DATA > data.txt; chmod 600 data.txt; id -u")
    assert made["exit_code"] == 0
    inside = made["output"].split()[-1]
    assert inside == ("65534" if backend == "bwrap" else str(workspace_uid(b, 65534, RANGE)))
    before = os.stat(b / "data.txt"), os.stat(b)
    result = await a_bash.run(
        f"chmod 666 {b}/data.txt; chmod 777 {b}; touch -d 2001-01-01 {b}/data.txt;"
        f" cat {b}/data.txt; echo end"
    )
    assert "B-DATA" not in result["output"] and result["output"].endswith("end\n")
    after = os.stat(b / "data.txt"), os.stat(b)
    for old, new in zip(before, after, strict=True):
        assert (old.st_mode, old.st_mtime_ns) == (new.st_mode, new.st_mtime_ns), result


def processes_of(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += 1
        except OSError:
            pass
    return count


async def test_a_fork_bomb_does_not_starve_another_conversation(
    make_bash, two_workspaces: tuple[Path, Path]
) -> None:
    a, b = two_workspaces
    nproc = 24
    a_bash = await make_bash("landlock", ws=a, shell_uids=UIDS, shell_nproc=nproc)
    b_bash = await make_bash("landlock", ws=b, shell_uids=UIDS, shell_nproc=nproc)
    # B runs first and forks only once A's bomb has used up its budget (the test says go).
    wait_then_fork = (
        "while [ ! -e go ]; do sleep 0.05; done;"
        " for i in 1 2 3 4 5; do sh -c 'echo forked-$0' $i || echo FORK-FAILED; done"
    )
    ok, b_job = await b_bash.call("bash", cmd=wait_then_fork, background=True, timeout_seconds=120)
    assert ok, b_job
    # A bomb that holds its processes at the limit (a shell bomb collapses when a fork fails
    # and may be gone between two looks): every process forks on, and sleeps when it cannot.
    marker = f"bomb-{os.getpid()}"
    bomb = (
        "python3 -c 'import os, time\nwhile True:\n try: os.fork()\n"
        f" except OSError: time.sleep(0.05)' {marker}"
    )
    ok, a_job = await a_bash.call("bash", cmd=bomb, background=True, timeout_seconds=120)
    assert ok, a_job
    try:
        a_uid = workspace_uid(a, 65534, RANGE)
        for _ in range(600):
            if processes_of(a_uid) >= nproc:
                break
            await asyncio.sleep(0.05)
        if processes_of(a_uid) < nproc:
            _, a_out = await a_bash.call("bash.output", job_id=a_job["job_id"])
            raise AssertionError(f"the bomb never reached its limit: {a_out}")
        (b / "go").touch()
        for _ in range(600):
            ok, out = await b_bash.call("bash.output", job_id=b_job["job_id"])
            if out["state"] != "running":
                break
            await asyncio.sleep(0.05)
        assert out["state"] == "exited", out
        assert "FORK-FAILED" not in out["output"] and "Cannot fork" not in out["output"], out
        assert [f"forked-{i}" for i in range(1, 6)] == out["output"].split(), out
    finally:
        await a_bash.call("bash.kill", job_id=a_job["job_id"])
    assert await no_leftovers(marker) == []
