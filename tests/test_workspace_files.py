"""The safe workspace-file module: confinement against symlinks (also swapped in during a
call), FIFOs, hard links, atomic writes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from bub_bot.agent import ToolContext, default_registry
from bub_bot.agent import workspace_files as wf

OUTSIDE = "CONTENT-FROM-OUTSIDE"


def test_reads_and_lists_beneath_the_root(tmp_path):
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("hello")
    os.symlink("b/f.txt", root / "a" / "rel_link")
    os.symlink(root / "a" / "b", root / "abs_link")  # absolute, but inside
    assert wf.read_file(root, "a/b/f.txt", 100) == b"hello"
    assert wf.read_file(root, "a/rel_link", 100) == b"hello"
    assert wf.read_file(root, "abs_link/f.txt", 100) == b"hello"
    assert wf.list_dir(root, "a") == ["b/", "rel_link"]
    with pytest.raises(wf.WorkspaceError, match="larger than 3 bytes"):
        wf.read_file(root, "a/b/f.txt", 3)


def test_refuses_links_out_and_secret_targets(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "out"
    root.mkdir()
    outside.mkdir()
    (outside / "s.txt").write_text(OUTSIDE)
    (root / ".env").write_text("KEY=1")
    os.symlink("../out/s.txt", root / "rel_out")
    os.symlink(outside, root / "dir_out")
    os.symlink(".env", root / "innocent.txt")
    for path in ("rel_out", "dir_out/s.txt"):
        with pytest.raises(wf.WorkspaceError, match="outside the workspace"):
            wf.read_file(root, path, 100)
    with pytest.raises(wf.WorkspaceError, match="outside the workspace"):
        wf.list_dir(root, "dir_out")
    with pytest.raises(wf.WorkspaceError, match="may hold secrets"):
        wf.read_file(root, "innocent.txt", 100)


def test_a_fifo_does_not_hang_and_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(wf.WorkspaceError, match="not a regular file"):
        wf.read_file(tmp_path, "pipe", 100)


def test_hard_links_are_refused_unless_allowed(tmp_path):
    (tmp_path / ".env").write_text("KEY=hunter2")
    os.link(tmp_path / ".env", tmp_path / "notes.txt")
    with pytest.raises(wf.WorkspaceError, match="hard links"):
        wf.read_file(tmp_path, "notes.txt", 100)
    allowed = wf.FilePolicy(allow_hardlinks=True)
    assert wf.read_file(tmp_path, "notes.txt", 100, allowed) == b"KEY=hunter2"


def test_protected_paths_are_refused(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "bub.db").write_text("tapes")
    policy = wf.FilePolicy(protected=(tmp_path / "home",))
    with pytest.raises(wf.WorkspaceError, match="own data"):
        wf.read_file(tmp_path, "home/bub.db", 100, policy)
    with pytest.raises(wf.WorkspaceError, match="own data"):
        wf.write_file_atomic(tmp_path, "home/x", b"x", policy)


def test_atomic_write_makes_parents_and_never_follows_a_planted_symlink(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "out"
    outside.mkdir()
    assert wf.write_file_atomic(root, "new/deep/f.txt", b"one") == 3
    assert (root / "new" / "deep" / "f.txt").read_bytes() == b"one"
    os.chmod(root / "new" / "deep" / "f.txt", 0o600)
    wf.write_file_atomic(root, "new/deep/f.txt", b"two")
    assert (root / "new" / "deep" / "f.txt").read_bytes() == b"two"
    assert (root / "new" / "deep" / "f.txt").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(root / "new" / "deep")) == ["f.txt"]  # no temp file left
    (outside / "target").write_text("keep")
    os.symlink(outside / "target", root / "planted")
    os.symlink(outside, root / "planted_dir")
    with pytest.raises(wf.WorkspaceError, match="is a symlink"):
        wf.write_file_atomic(root, "planted", b"evil")
    with pytest.raises(wf.WorkspaceError, match="outside the workspace"):
        wf.write_file_atomic(root, "planted_dir/x", b"evil")
    assert (outside / "target").read_text() == "keep"
    assert os.listdir(outside) == ["target"]


def _swapper(root: Path, outside: Path, stop: threading.Event) -> None:
    """Swap `root/d` between a real directory and a symlink out, as fast as it can."""
    real, link, spare = root / "d", root / "d_link", root / "d_real"
    while not stop.is_set():
        os.rename(link, real)  # now a symlink out
        os.rename(real, link)
        os.rename(spare, real)  # now the real directory
        os.rename(real, spare)


def test_a_directory_swapped_for_a_symlink_never_leaks_outside_content(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "out"
    root.mkdir()
    outside.mkdir()
    (outside / "f.txt").write_text(OUTSIDE)
    (root / "d_real").mkdir()
    (root / "d_real" / "f.txt").write_text("inside")
    os.symlink(outside, root / "d_link")
    stop = threading.Event()
    thread = threading.Thread(target=_swapper, args=(root, outside, stop), daemon=True)
    thread.start()
    seen: dict[str, int] = {}
    try:
        for _ in range(3000):
            try:
                body = wf.read_file(root, "d/f.txt", 100).decode()
            except wf.WorkspaceError as exc:
                body = str(exc).split(":")[0]
            assert OUTSIDE not in body
            seen[body] = seen.get(body, 0) + 1
            try:
                names = wf.list_dir(root, "d")
            except wf.WorkspaceError:
                names = []
            assert names in ([], ["f.txt"])
    finally:
        stop.set()
        thread.join()
    assert seen.get("inside", 0) > 0  # the race was really run both ways


async def test_fs_read_through_the_registry_is_safe_and_uses_the_agent_scrubber(
    tape, settings, workspace
):
    from bub_bot.secrets import Scrubber

    (workspace / "notes.txt").write_text("token=SCRUB-ME-PLEASE here")
    (workspace / "linked.txt").write_text("x")
    os.link(workspace / "linked.txt", workspace / "linked2.txt")
    ctx = ToolContext(
        tape=tape,
        workspace=workspace,
        settings=settings(),
        scrubber=Scrubber(["SCRUB-ME-PLEASE"]),
    )
    registry = default_registry()
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "notes.txt"}))
    assert ok and body == "token=[redacted] here"
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "linked2.txt"}))
    assert not ok and "hard links" in body


def test_common_credential_files_are_refused(tmp_path):
    names = [
        ".envrc",
        ".cargo/credentials.toml",
        ".config/gh/hosts.yml",
        ".vault-token",
        ".my.cnf",
        ".s3cfg",
        ".boto",
        ".terraformrc",
        "service-account.json",
        "deploy/my-service-account-key.json",
        ".bash_history",
        ".zsh_history",
        ".python_history",
        ".psql_history",
        ".config/gcloud/application_default_credentials.json",
    ]
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("SECRET")
        with pytest.raises(wf.WorkspaceError, match="may hold secrets"):
            wf.read_file(tmp_path, name, 100)
    (tmp_path / "hosts.yml").write_text("fine")
    assert wf.read_file(tmp_path, "hosts.yml", 100) == b"fine"
