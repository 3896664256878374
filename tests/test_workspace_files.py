"""The workspace file module and the file tools on it: a symlink swapped in between the check
and the open never leads outside, hard links, FIFOs, and fs.write / fs.edit (atomic, capped,
confined like fs.read)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from bub_bot.agent import ToolContext, default_registry
from bub_bot.beneath import open_beneath
from bub_bot.secrets import Scrubber
from bub_bot.workspace_files import FileRefused, WorkspaceFiles

OUTSIDE = "OUTSIDE-CONTENT-42"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "file.txt").write_text(OUTSIDE, encoding="utf-8")
    (path / ".env").write_text(OUTSIDE, encoding="utf-8")
    return path


def test_a_directory_swapped_for_a_symlink_never_leads_outside(workspace: Path, outside: Path):
    """The review's race: check, then swap `d` for a symlink out, then open. Before the fix
    172 of 3000 reads returned the outside file."""
    files = WorkspaceFiles(workspace)
    real = workspace / "d"
    real.mkdir()
    (real / "file.txt").write_text("inside", encoding="utf-8")
    spare = workspace / "d.real"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(real, spare)
            os.symlink(outside, real)
            os.unlink(real)
            os.rename(spare, real)

    swapper = threading.Thread(target=swap)
    swapper.start()
    read: dict[str, int] = {}
    refused = 0
    try:
        for _ in range(3000):
            try:
                data = files.read_bytes("d/file.txt", 1024).decode()
            except FileRefused:
                refused += 1  # whatever the reason: nothing was read
            else:
                read[data] = read.get(data, 0) + 1
    finally:
        stop.set()
        swapper.join()
    assert read.get("inside", 0) > 0 and refused > 0  # the race really ran both ways
    assert set(read) == {"inside"}, read  # never the outside file


def test_open_beneath_refuses_every_symlink(workspace: Path, outside: Path):
    os.symlink(outside, workspace / "link")
    (workspace / "sub").mkdir()
    os.symlink(workspace / "sub", workspace / "inner_link")
    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for parts in (("link", "file.txt"), ("inner_link",), ("link",)):
            with pytest.raises(OSError):
                os.close(open_beneath(root, parts))
        for bad in ((".."), ("sub", ".."), ("",)):
            with pytest.raises(OSError):
                open_beneath(root, tuple(bad) if isinstance(bad, tuple) else (bad,))
        os.close(open_beneath(root, ("sub",), os.O_RDONLY | os.O_DIRECTORY))
    finally:
        os.close(root)


def test_hard_links_are_refused_unless_allowed(workspace: Path):
    (workspace / ".env").write_text("SECRET=1", encoding="utf-8")
    os.link(workspace / ".env", workspace / "notes.txt")
    with pytest.raises(FileRefused, match=r"2 hard links.*BUB_FS_ALLOW_HARDLINKS"):
        WorkspaceFiles(workspace).read_bytes("notes.txt", 100)
    assert WorkspaceFiles(workspace, allow_hardlinks=True).read_bytes("notes.txt", 100)


def test_a_fifo_is_refused_without_hanging(workspace: Path):
    os.mkfifo(workspace / "pipe")
    with pytest.raises(FileRefused, match="not a regular file"):
        WorkspaceFiles(workspace).read_bytes("pipe", 100)


def test_writes_are_atomic_replace_symlinks_and_keep_the_mode(workspace: Path, outside: Path):
    files = WorkspaceFiles(workspace)
    assert files.write("a/b/new.txt", b"one") is False
    assert (workspace / "a/b/new.txt").read_bytes() == b"one"
    os.chmod(workspace / "a/b/new.txt", 0o600)
    assert files.write("a/b/new.txt", b"two") is True
    assert (workspace / "a/b/new.txt").read_bytes() == b"two"
    assert (workspace / "a/b/new.txt").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(workspace / "a/b")) == ["new.txt"]  # no temporary file left
    # A symlink inside the workspace pointing out: refused as leading outside.
    os.symlink(outside / "file.txt", workspace / "planted.txt")
    with pytest.raises(FileRefused, match="outside the workspace"):
        files.write("planted.txt", b"x")
    os.symlink(outside, workspace / "planted_dir")
    with pytest.raises(FileRefused, match="outside the workspace"):
        files.write("planted_dir/file.txt", b"x")
    assert (outside / "file.txt").read_text() == OUTSIDE


def test_save_new_never_overwrites(workspace: Path):
    files = WorkspaceFiles(workspace)
    assert files.save_new("inbox", "report.pdf", b"1") == "inbox/report.pdf"
    assert files.save_new("inbox", "report.pdf", b"2") == "inbox/report-2.pdf"
    assert (workspace / "inbox/report.pdf").read_bytes() == b"1"
    with pytest.raises(FileRefused):
        files.save_new("inbox", "../x", b"3")


async def test_fs_write_and_edit_through_the_registry(tape, settings, workspace, outside):
    registry = default_registry()
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings(fs_write_max_bytes=64))

    async def call(name: str, **args: object) -> tuple[bool, str]:
        return await registry.call(ctx, name, json.dumps(args))

    ok, body = await call("fs_write", path="src/app.py", content="x = 1\ny = 1\n")
    assert ok and body == "created 'src/app.py' (12 bytes)"
    ok, body = await call("fs_read", path="src/app.py")
    assert ok and body == "x = 1\ny = 1\n"
    ok, body = await call("fs_edit", path="src/app.py", old="= 1", new="= 2")
    assert not ok and "found 2 times" in body
    assert (workspace / "src/app.py").read_text() == "x = 1\ny = 1\n"
    ok, body = await call("fs_edit", path="src/app.py", old="y = 1", new="y = 3")
    assert ok and (workspace / "src/app.py").read_text() == "x = 1\ny = 3\n"
    ok, body = await call("fs_edit", path="src/app.py", old="= 1", new="= 0", replace_all=True)
    assert ok and "1 replacement" in body
    ok, body = await call("fs_edit", path="src/app.py", old="zzz", new="q")
    assert not ok and "0 times" in body
    ok, body = await call("fs_write", path="big.txt", content="é" * 40)
    assert not ok and "80 bytes, over the limit of 64 (BUB_FS_WRITE_MAX_BYTES)" in body
    assert not (workspace / "big.txt").exists()
    for path in ("../escape.txt", "/tmp/abs.txt", ".env", "keys/id_rsa", ".git/config"):
        ok, body = await call("fs_write", path=path, content="x")
        assert not ok and body.startswith("error: "), (path, body)
    os.symlink(outside, workspace / "out")
    ok, body = await call("fs_write", path="out/file.txt", content="pwned")
    assert not ok and "outside the workspace" in body
    assert (outside / "file.txt").read_text() == OUTSIDE
    assert not (workspace / "escape.txt").exists() and not Path("/tmp/abs.txt").exists()


async def test_fs_write_refuses_the_tape_database(store, tape, settings, tmp_path):
    """The workspace holds the bot's home: the database and its journal are refused."""
    home = tmp_path / "bothome"
    home.mkdir()
    conf = settings(home=home, workspace=tmp_path, database_url=f"sqlite:///{home / 'bub.db'}")
    ctx = ToolContext(tape=tape, workspace=tmp_path, settings=conf)
    registry = default_registry()
    for path in ("bothome/bub.db", "bothome/bub.db-wal", "bothome/other.txt"):
        ok, body = await registry.call(ctx, "fs_write", json.dumps({"path": path, "content": "x"}))
        assert not ok and "bub-bot's own data" in body, (path, body)


# -- from the security branch (issue 18 §3, §4): coverage main's tests above do not have --


def test_symlinks_inside_work_and_links_out_are_refused_for_reading(workspace: Path, outside: Path):
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "b" / "f.txt").write_text("hello", encoding="utf-8")
    os.symlink("b/f.txt", workspace / "a" / "rel_link")
    os.symlink(workspace / "a" / "b", workspace / "abs_link")  # absolute, but inside
    os.symlink("../outside/file.txt", workspace / "rel_out")
    os.symlink(outside, workspace / "dir_out")
    files = WorkspaceFiles(workspace)
    assert files.read_bytes("a/rel_link", 100) == b"hello"
    assert files.read_bytes("abs_link/f.txt", 100) == b"hello"
    assert files.list_dir("a") == ["b/", "rel_link"]
    for path in ("rel_out", "dir_out/file.txt"):
        with pytest.raises(FileRefused, match="outside the workspace"):
            files.read_bytes(path, 100)
    with pytest.raises(FileRefused, match="outside the workspace"):
        files.list_dir("dir_out")


def test_reading_and_listing_bub_bots_own_data_are_refused(workspace: Path):
    """BUB_HOME inside the workspace and the tape database (with its journals) are refused
    for reading and listing too, not only for writing."""
    home = workspace / "home"
    home.mkdir()
    (home / "notes.txt").write_text("x", encoding="utf-8")
    (workspace / "tapes.db-wal").write_text("tapes", encoding="utf-8")
    files = WorkspaceFiles(workspace, home=home, database=workspace / "tapes.db")
    for path in ("home/notes.txt", "tapes.db-wal"):
        with pytest.raises(FileRefused, match="own data"):
            files.read_bytes(path, 100)
    with pytest.raises(FileRefused, match="own data"):
        files.list_dir("home")
    assert "tapes.db-wal" in (files.list_dir(".") or [])  # the name still shows


def test_a_directory_swapped_for_a_symlink_never_lists_outside(workspace: Path, outside: Path):
    """fs.list under the same race as the read above: never the outside directory."""
    files = WorkspaceFiles(workspace)
    real = workspace / "d"
    real.mkdir()
    (real / "inside.txt").write_text("inside", encoding="utf-8")
    spare = workspace / "d.real"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(real, spare)
            os.symlink(outside, real)
            os.unlink(real)
            os.rename(spare, real)

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: dict[str, int] = {}
    try:
        for _ in range(3000):
            try:
                names = files.list_dir("d")
            except FileRefused:
                names = None
            key = repr(names)
            seen[key] = seen.get(key, 0) + 1
    finally:
        stop.set()
        swapper.join()
    assert seen.get(repr(["inside.txt"]), 0) > 0  # the race really ran
    assert set(seen) <= {repr(["inside.txt"]), "None"}, seen  # never outside's names


async def test_fs_read_uses_the_agents_scrubber_and_refuses_hard_links(tape, settings, workspace):
    """The tool scrubs with the scrubber the agent gave (every secret it knows, MCP servers'
    too), and the hard-link refusal reaches the model as an error."""
    (workspace / "notes.txt").write_text("token=SCRUB-ME-PLEASE here", encoding="utf-8")
    (workspace / "linked.txt").write_text("x", encoding="utf-8")
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
