"""Built-in tools driven by scripted model calls: workspace confinement and the tape tools."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from bub_bot.agent import ToolContext, default_registry
from bub_bot.tape import Tape
from tests.fakes.openai_server import text, tool_calls

SECRET = "TOP-SECRET-OUTSIDE"


def tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


@pytest.fixture
def layout(tmp_path, workspace):
    """A workspace with a file, a subdirectory, and symlinks that lead outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET, encoding="utf-8")
    (workspace / "notes.txt").write_text("0123456789 héllo 世界 🙂 end", encoding="utf-8")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "inner.txt").write_text("inner", encoding="utf-8")
    os.symlink(outside, workspace / "out_dir")
    os.symlink(outside / "secret.txt", workspace / "out_file.txt")
    os.symlink(workspace / "notes.txt", workspace / "sub" / "ok_link.txt")
    return outside


async def test_fs_tools_are_confined_to_the_workspace(fake_openai, agent, tape, layout):
    absolute = str(layout / "secret.txt")
    fake_openai.script(
        tool_calls(
            [
                ("fs_read", {"path": "../outside/secret.txt"}),
                ("fs_read", {"path": "sub/../../outside/secret.txt"}),
                ("fs_read", {"path": absolute}),
                ("fs_list", {"path": str(layout)}),
                ("fs_read", {"path": "out_file.txt"}),
                ("fs_list", {"path": "out_dir"}),
                ("fs_read", {"path": "out_dir/secret.txt"}),
                ("fs_list", {"path": ".."}),
            ]
        ),
        tool_calls(
            [
                ("fs_read", {"path": "notes.txt", "offset": 11, "limit": 8}),
                ("fs_read", {"path": "sub/ok_link.txt", "limit": 4}),
                ("fs_list", {}),
                ("fs_list", {"path": "sub"}),
                ("fs_read", {"path": "missing.txt"}),
                ("fs_list", {"path": "notes.txt"}),
            ]
        ),
        text("done"),
    )
    result = await agent().run_turn(tape, [{"role": "user", "content": "look around"}])
    assert result.status == "ok"

    second, third = (r.body["messages"] for r in fake_openai.completion_requests()[1:])
    refused = tool_contents(second)
    assert len(refused) == 8
    assert refused[0] == "error: '..' is not allowed in paths: '../outside/secret.txt'"
    assert refused[1].startswith("error: '..' is not allowed")
    assert refused[2].startswith("error: absolute paths are not allowed")
    assert refused[3].startswith("error: absolute paths are not allowed")
    for escaped in refused[4:7]:
        assert escaped.startswith("error: ") and "outside the workspace" in escaped
    assert refused[7].startswith("error: '..' is not allowed")

    ok = tool_contents(third)[len(refused) :]
    notes_size = len("0123456789 héllo 世界 🙂 end".encode())
    assert ok[0] == (
        "héllo 世界\n\n[fs_read stopped before the end of 'notes.txt': this is characters"
        f" 11-19 of 25 ({notes_size} bytes). Continue with fs_read(path='notes.txt', offset=19)]"
    )
    assert ok[1].startswith("0123\n\n[fs_read stopped before the end of 'sub/ok_link.txt'")
    assert json.loads(ok[2]) == ["notes.txt", "out_dir/", "out_file.txt", "sub/"]
    assert json.loads(ok[3]) == ["inner.txt", "ok_link.txt"]
    assert ok[4] == "error: no such file: 'missing.txt'"
    assert ok[5] == "error: not a directory: 'notes.txt'"

    everything = json.dumps([r.body for r in fake_openai.completion_requests()])
    assert SECRET not in everything
    assert SECRET not in json.dumps([e.payload for e in await tape.query()])


async def test_fs_read_directly_through_the_registry(tape, settings, workspace, layout):
    registry = default_registry()
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "notes.txt", "offset": 2}))
    assert ok and body == "23456789 héllo 世界 🙂 end"
    ok, body = await registry.call(ctx, "fs_read", json.dumps({"path": "out_file.txt"}))
    assert not ok and "outside the workspace" in body and SECRET not in body
    ok, body = await registry.call(ctx, "fs_read", json.dumps({"path": "notes.txt", "limit": 0}))
    assert not ok and body.startswith("error: invalid arguments for fs_read: limit")


async def seed_earlier_exchange(tape: Tape) -> None:
    await tape.ensure_bootstrap_anchor()
    await tape.append_message({"role": "user", "content": "请帮我配置数据库连接 (database)"})
    await tape.append_message({"role": "assistant", "content": "OLD-ANSWER: use DATABASE_URL"})


async def test_tape_tools_through_scripted_calls(fake_openai, agent, tape):
    await seed_earlier_exchange(tape)
    fake_openai.script(
        tool_calls(
            [
                ("tape_search", {"query": "数据库", "kinds": ["message"]}),
                ("tape_search", {"query": "DATABASE", "until": "2000-01-01"}),
                ("tape_search", {"since": "not a date"}),
                ("tape_info", {}),
                ("tape_anchors", {}),
            ]
        ),
        tool_calls(
            [
                (
                    "tape_handoff",
                    {"summary": "User set up the database; next: backups.", "name": "db"},
                )
            ]
        ),
        text("Fresh phase."),
    )
    turn_message = {"role": "user", "content": "NEW-QUESTION: now the backups"}
    result = await agent().run_turn(tape, [turn_message])
    assert (result.status, result.reply) == ("ok", "Fresh phase.")

    requests = [r.body["messages"] for r in fake_openai.completion_requests()]
    assert len(requests) == 3
    search, empty, bad_date, info, anchors = tool_contents(requests[1])
    found = json.loads(search)
    assert [f["kind"] for f in found] == ["message"]
    assert "数据库" in found[0]["payload"]
    assert json.loads(empty) == []
    assert bad_date.startswith("error: ") and "not a date" in bad_date
    info = json.loads(info)
    assert info["last_anchor"] == "session/start"
    assert info["anchors"] == 1 and info["entries"] == info["entries_since_anchor"] + 1
    assert [a["name"] for a in json.loads(anchors)] == ["session/start"]

    after = requests[2]
    assert tool_contents(after) == []  # the handoff call itself is before the new anchor
    assert [m["role"] for m in after] == ["system", "user", "user"]
    assert after[1]["content"] == (
        "[Summary of the previous phase]\nUser set up the database; next: backups."
    )
    assert after[2]["content"] == turn_message["content"]
    earlier = json.dumps(after[1:])
    for gone in ("OLD-ANSWER", "数据库", "tape_search", "tool_calls"):
        assert gone not in earlier

    (anchor,) = await tape.query(kinds=["anchor"], names=["db"])
    assert anchor.payload["state"] == {
        "summary": "User set up the database; next: backups.",
        "owner": "agent",
    }
    (event,) = await tape.query(kinds=["event"], names=["handoff"])
    assert event.id == anchor.id + 1 and event.payload["data"]["name"] == "db"
    (handoff_call,) = [
        e for e in await tape.query(kinds=["tool_call"]) if "tape_handoff" in json.dumps(e.payload)
    ]
    assert handoff_call.id < anchor.id  # the call and its result stay before the anchor
    assert (await tape.info()).last_anchor == "db"
    assert [m["content"] for m in await tape.read_messages()][-1] == "Fresh phase."


async def test_second_handoff_in_one_step_is_refused(fake_openai, agent, tape):
    fake_openai.script(
        tool_calls(
            [
                ("tape_handoff", {"summary": "first"}),
                ("tape_handoff", {"summary": "second"}),
            ]
        ),
        text("ok"),
    )
    await agent().run_turn(tape, [{"role": "user", "content": "hand off twice"}])
    results = (await tape.query(kinds=["tool_result"]))[0].payload["results"]
    contents = sorted(r["content"] for r in results)
    assert contents[0] == "error: already handed off in this step"
    assert contents[1].startswith("handoff 'handoff' recorded")
    assert len(await tape.query(kinds=["anchor"], names=["handoff"])) == 1


async def test_undecodable_file_name_does_not_crash_the_turn(fake_openai, agent, tape, workspace):
    # Linux file names are bytes; Python hands non-UTF-8 ones over as lone surrogates,
    # which SQLite cannot store as text.
    name = os.fsencode(workspace) + b"/bad\xff.txt"
    os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
    fake_openai.script(tool_calls([("fs_list", {})]), text("listed"))
    result = await agent().run_turn(tape, [{"role": "user", "content": "list it"}])

    assert (result.status, result.reply) == ("ok", "listed")
    (listing,) = tool_contents(fake_openai.last_messages())
    assert "bad" in listing and ".txt" in listing
    (stored,) = await tape.query(kinds=["tool_result"])
    assert "bad" in json.dumps(stored.payload)


def continue_offset(result: str) -> int | None:
    """The offset a partial fs.read result says to continue from (None: it read to the end)."""
    found = re.search(r"\[fs_read stopped before the end of .*offset=(\d+)\)\]$", result)
    return int(found.group(1)) if found else None


async def test_partial_read_says_so_and_continues_to_the_end(tape, settings, workspace):
    registry = default_registry()
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    lines = [f"{i:05d} 数据 🙂 line\r\n" for i in range(4000)]
    content = "".join(lines)
    (workspace / "big.log").write_bytes(content.encode("utf-8"))
    size = len(content.encode("utf-8"))

    ok, first = await registry.call(ctx, "fs.read", json.dumps({"path": "big.log"}))
    assert ok and len(content) > 20_000
    body, _, note = first.rpartition("\n\n")
    assert body == content[:20_000]
    assert note == (
        "[fs_read stopped before the end of 'big.log': this is characters 0-20000 of"
        f" {len(content)} ({size} bytes). Continue with fs_read(path='big.log', offset=20000)]"
    )

    pieces, offset, calls = [body], continue_offset(first), 1
    while offset is not None:
        args = {"path": "big.log", "offset": offset, "limit": 30_000}
        ok, out = await registry.call(ctx, "fs.read", json.dumps(args))
        assert ok
        calls += 1
        following = continue_offset(out)
        pieces.append(out.rpartition("\n\n")[0] if following is not None else out)
        offset = following
    assert "".join(pieces).encode("utf-8") == content.encode("utf-8")  # CRLF kept
    assert calls == 1 + -(-(len(content) - 20_000) // 30_000)

    # a read that ends exactly at the end of the file needs no note
    ok, tail = await registry.call(
        ctx, "fs.read", json.dumps({"path": "big.log", "offset": len(content) - 10})
    )
    assert ok and tail == content[-10:]
    ok, past = await registry.call(
        ctx, "fs.read", json.dumps({"path": "big.log", "offset": len(content)})
    )
    assert not ok and past == (
        f"error: offset {len(content)} is at or past the end of 'big.log'"
        f" ({len(content)} characters)"
    )


async def test_note_of_a_file_too_big_to_count(tape, settings, workspace):
    registry = default_registry()
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    data = b"0123456789abcdef" * (9 * 1024 * 1024 // 16)  # 9 MiB
    (workspace / "huge.bin.txt").write_bytes(data)
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "huge.bin.txt"}))
    assert ok and body.endswith(
        f"this is characters 0-20000 of a {len(data)}-byte file."
        " Continue with fs_read(path='huge.bin.txt', offset=20000)]"
    )


async def test_empty_and_binary_files(tape, settings, workspace):
    registry = default_registry()
    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    (workspace / "empty.txt").write_bytes(b"")
    (workspace / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(500))
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "empty.txt"}))
    assert ok and body == ""
    ok, body = await registry.call(ctx, "fs.read", json.dumps({"path": "image.png"}))
    assert not ok and body == "error: 'image.png' is a binary file (516 bytes); fs_read reads text"
