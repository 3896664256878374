"""Spill sidecar: oversized tool output stored aside, previewed on the main tape, read back."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from bub_bot.agent import ToolContext, ToolError, default_registry
from bub_bot.tape import Tape, TapeEntry
from tests.fakes.openai_server import text, tool_calls

CHUNK_BYTES = 16 * 1024  # DESIGN.md: chunks of at most 16 KiB of UTF-8
USER = {"role": "user", "content": "run the big tool"}
PIECES = [
    "plain ascii text ",
    "line break\n",
    "数据库连接配置",
    "日本語のテキスト",
    "한국어 ",
    "🙂",
    "👩‍💻",  # a ZWJ sequence: several code points
    "🇺🇳",
    "é",
    "\t{json: [1, 2]} ",
]


def big_text(min_bytes: int = 1_000_000, seed: int = 3) -> str:
    """A deterministic ~1 MB string mixing ASCII, CJK and emoji (4-byte UTF-8)."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < min_bytes:
        piece = rng.choice(PIECES)
        parts.append(piece)
        size += len(piece.encode("utf-8"))
    return "".join(parts)


BIG = big_text()


def registry_with(result: Any = None, *, fail: str | None = None):
    registry = default_registry()

    @registry.tool("demo.big")
    async def demo_big(ctx: ToolContext) -> Any:
        """Return a huge output."""
        if fail is not None:
            raise ToolError(fail)
        return result

    return registry


async def run_big_tool(fake_openai, agent, tape, registry, **overrides) -> tuple[Any, str]:
    """One turn calling demo.big; returns (turn result, what the model saw as the tool result)."""
    fake_openai.script(tool_calls([("demo_big", {})]), text("got it"))
    result = await agent(registry, **overrides).run_turn(tape, [USER])
    assert result.status == "ok"
    seen = [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"][-1]
    return result, seen


async def spill_events(tape: Tape) -> list[TapeEntry]:
    return await tape.query(kinds=["event"], names=["spill.write"])


async def read_all(registry, ctx: ToolContext, handle: str, *, from_end: bool) -> tuple[str, int]:
    """Page through a handle 4 chunks at a time; returns (text, number of calls)."""
    pieces: list[str] = []
    cursor: int | None = 0
    calls = 0
    while cursor is not None:
        args = {"handle": handle, "cursor": cursor, "count": 4, "from_end": from_end}
        ok, out = await registry.call(ctx, "spill.read", json.dumps(args))
        assert ok, out
        calls += 1
        head, _, body = out.partition("\n")
        header = json.loads(head)
        first, last = header["chunks"]
        assert 1 <= last - first + 1 <= 4
        assert header["bytes"] == len(body.encode("utf-8"))
        pieces.append(body)
        cursor = header["next_cursor"]
        assert header["complete"] == (cursor is None)
    if from_end:
        pieces.reverse()
    return "".join(pieces), calls


async def test_big_result_spills_and_reads_back_exactly(fake_openai, agent, tape, settings):
    registry = registry_with(BIG)
    _, seen = await run_big_tool(fake_openai, agent, tape, registry)

    # the main tape and the model get a bounded preview with the handle
    (stored,) = await tape.query(kinds=["tool_result"])
    (entry,) = stored.payload["results"]
    preview = entry["content"]
    assert preview == seen
    assert isinstance(preview, str) and len(preview) < 1000
    (event,) = await spill_events(tape)
    assert event.meta["context"] is False
    data = event.payload["data"]
    handle = data["handle"]
    assert handle in preview and "spill.read" in preview
    assert preview.startswith(BIG[:200]) and preview.endswith(BIG[-200:])
    total_bytes = len(BIG.encode("utf-8"))
    chunks = math.ceil(total_bytes / CHUNK_BYTES)
    assert data == {
        "ok": True,
        "handle": handle,
        "chunks": data["chunks"],
        "bytes": total_bytes,
        "chars": len(BIG),
        "lines": BIG.count("\n") + 1,
        "tool": "demo_big",
    }
    assert chunks <= data["chunks"] <= chunks + 2
    assert max(len(json.dumps(r.body)) for r in fake_openai.completion_requests()) < 20_000
    assert await tape.read_messages() == [
        USER,
        {"role": "assistant", "content": "", "tool_calls": stored_calls(await tape.query())},
        {"role": "tool", "tool_call_id": entry["tool_call_id"], "content": preview},
        {"role": "assistant", "content": "got it"},
    ]

    # the sidecar: chunk anchors each followed by its chunk, then the manifest
    side = await tape.sidecar("spill").query()
    n = data["chunks"]
    assert [e.payload["name"] for e in side[: 2 * n : 2]] == [
        f"spill/{handle}/chunk/{i}" for i in range(n)
    ]
    assert {e.kind for e in side[1 : 2 * n : 2]} == {"tool_result"}
    sizes = [len(e.payload["results"][0]["content"].encode("utf-8")) for e in side[1 : 2 * n : 2]]
    assert max(sizes) <= CHUNK_BYTES and sum(sizes) == total_bytes
    manifest_anchor, manifest_event = side[2 * n :]
    assert manifest_anchor.payload["name"] == f"spill/{handle}/manifest"
    assert manifest_anchor.payload["state"]["chunks"] == n
    assert manifest_event.payload["name"] == "spill.manifest"
    assert manifest_event.payload["data"]["bytes"] == total_bytes
    assert side[1].payload["results"][0]["tool_call_id"] == entry["tool_call_id"]

    # read back, forward and from the end, byte-identical
    conf = settings()
    ctx = ToolContext(tape=tape, workspace=conf.workspace, settings=conf)
    forward, calls = await read_all(registry, ctx, handle, from_end=False)
    assert forward.encode("utf-8") == BIG.encode("utf-8")
    assert calls == math.ceil(n / 4)
    backward, calls = await read_all(registry, ctx, handle, from_end=True)
    assert backward == BIG and calls == math.ceil(n / 4)

    # at most 4 chunks per call; a cursor past the end is a clear message
    ok, out = await registry.call(ctx, "spill.read", json.dumps({"handle": handle, "count": 5}))
    assert not ok and out.startswith("error: invalid arguments for spill_read: count")
    ok, out = await registry.call(ctx, "spill.read", json.dumps({"handle": handle, "cursor": n}))
    assert ok and out == (
        f"cursor {n} is past the end: handle {handle!r} has {n} chunks (0..{n - 1})"
    )


def stored_calls(entries: list[TapeEntry]) -> list[dict[str, Any]]:
    (call,) = [e for e in entries if e.kind == "tool_call"]
    return call.payload["calls"]


async def test_model_pages_through_spill_read_and_its_output_is_not_spilled(
    fake_openai, agent, tape
):
    registry = registry_with(BIG)
    await run_big_tool(fake_openai, agent, tape, registry)
    (event,) = await spill_events(tape)
    handle = event.payload["data"]["handle"]

    fake_openai.script(
        tool_calls([("spill_read", {"handle": handle, "count": 4})]),
        tool_calls([("spill_read", {"handle": handle, "count": 2, "from_end": True})]),
        text("read it"),
    )
    result = await agent(registry).run_turn(tape, [{"role": "user", "content": "read it"}])
    assert result.status == "ok"
    head_read, tail_read = [
        m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"
    ][-2:]
    header, _, body = head_read.partition("\n")
    assert json.loads(header)["chunks"] == [0, 3] and json.loads(header)["next_cursor"] == 4
    assert len(body) > 4 * 4096  # over the spill threshold, yet delivered whole
    assert BIG.startswith(body)
    header, _, body = tail_read.partition("\n")
    assert json.loads(header)["next_cursor"] == 2
    assert BIG.endswith(body)
    assert len(await spill_events(tape)) == 1  # spill.read never spills


async def test_threshold_zero_keeps_results_inline_and_old_handles_readable(
    fake_openai, agent, tape, settings
):
    registry = registry_with(BIG)
    await run_big_tool(fake_openai, agent, tape, registry)
    (event,) = await spill_events(tape)
    handle = event.payload["data"]["handle"]
    side_before = len(await tape.sidecar("spill").query())

    _, seen = await run_big_tool(fake_openai, agent, tape, registry, spill_threshold=0)
    assert seen == BIG
    last_result = (await tape.query(kinds=["tool_result"]))[-1]
    assert last_result.payload["results"][0]["content"] == BIG
    assert len(await spill_events(tape)) == 1
    assert len(await tape.sidecar("spill").query()) == side_before

    conf = settings(spill_threshold=0)
    ctx = ToolContext(tape=tape, workspace=conf.workspace, settings=conf)
    forward, _ = await read_all(registry, ctx, handle, from_end=False)
    assert forward == BIG


async def test_small_result_under_threshold_stays_inline(fake_openai, agent, tape):
    small = "x" * (4 * 100 - 1)
    _, seen = await run_big_tool(
        fake_openai, agent, tape, registry_with(small), spill_threshold=100
    )
    assert seen == small and await spill_events(tape) == []
    _, seen = await run_big_tool(
        fake_openai, agent, tape, registry_with(small + "y"), spill_threshold=100
    )
    assert seen != small + "y" and len(await spill_events(tape)) == 1


async def test_structured_result_spills_as_json(fake_openai, agent, tape, settings):
    rows = {"rows": [{"id": i, "name": f"名前-{i} 🙂"} for i in range(3000)]}
    registry = registry_with(rows)
    _, seen = await run_big_tool(fake_openai, agent, tape, registry)
    assert len(seen) < 1000
    (event,) = await spill_events(tape)
    conf = settings()
    ctx = ToolContext(tape=tape, workspace=conf.workspace, settings=conf)
    back, _ = await read_all(registry, ctx, event.payload["data"]["handle"], from_end=False)
    assert json.loads(back) == rows


async def test_error_result_over_threshold_spills(fake_openai, agent, tape, settings):
    registry = registry_with(fail="disk exploded: " + BIG[:100_000])
    _, seen = await run_big_tool(fake_openai, agent, tape, registry)
    assert len(seen) < 1000 and seen.startswith("error: disk exploded")
    (event,) = await spill_events(tape)
    conf = settings()
    ctx = ToolContext(tape=tape, workspace=conf.workspace, settings=conf)
    back, _ = await read_all(registry, ctx, event.payload["data"]["handle"], from_end=False)
    assert back == "error: disk exploded: " + BIG[:100_000]


@pytest.fixture
def reader(tape, settings):
    registry = default_registry()
    conf = settings()
    ctx = ToolContext(tape=tape, workspace=conf.workspace, settings=conf)

    async def read(handle: str, **args: Any) -> str:
        ok, out = await registry.call(ctx, "spill.read", json.dumps({"handle": handle, **args}))
        assert ok
        return out

    return read


async def test_handle_without_manifest_and_unknown_handle(tape, reader):
    side = tape.sidecar("spill")
    await side.append_many(
        [
            TapeEntry.anchor("spill/sp_partial/chunk/0", {"bytes": 5}),
            TapeEntry.tool_result([{"tool_call_id": "call_1", "content": "hello"}]),
        ]
    )
    no_manifest = await reader("sp_partial")
    unknown = await reader("sp_nothing")
    assert no_manifest == (
        "spill handle 'sp_partial' has no manifest: the spill never completed,"
        " so its chunks cannot be trusted"
    )
    assert unknown == "unknown spill handle 'sp_nothing'"


async def test_manifest_with_missing_chunk(tape, reader):
    side = tape.sidecar("spill")
    manifest = {"handle": "sp_gap", "chunks": 2, "bytes": 10, "chars": 10, "lines": 1}
    await side.append_many(
        [
            TapeEntry.anchor("spill/sp_gap/chunk/0", {"bytes": 5}),
            TapeEntry.tool_result([{"tool_call_id": "call_1", "content": "hello"}]),
            TapeEntry.anchor("spill/sp_gap/manifest", manifest),
            TapeEntry.event("spill.manifest", manifest),
        ]
    )
    first = await reader("sp_gap")
    assert json.loads(first.partition("\n")[0])["next_cursor"] == 1
    assert first.endswith("\nhello")
    assert await reader("sp_gap", cursor=0, count=2) == (
        "chunk 1 of spill handle 'sp_gap' is missing or invalid"
    )


@pytest.mark.parametrize("kind", ["ascii", "utf8_crlf"])
async def test_whole_200kb_file_read_at_max_limit_spills_and_pages_back_identical(
    fake_openai, agent, tape, settings, workspace, kind
):
    size = 200 * 1024
    if kind == "ascii":
        data = b"".join(b"%06d some log text here\n" % i for i in range(size // 24 + 1))[:size]
    else:
        data = big_text(size).replace("\n", "\r\n").encode("utf-8")
    (workspace / "big.txt").write_bytes(data)
    registry = default_registry()
    limit = registry.get("fs.read").schema()["function"]["parameters"]["properties"]["limit"]
    assert limit["maximum"] >= len(data)  # the whole file fits one call at the maximum

    fake_openai.script(
        tool_calls([("fs_read", {"path": "big.txt", "limit": limit["maximum"]})]), text("read")
    )
    result = await agent(registry).run_turn(tape, [USER])
    assert result.status == "ok"
    (seen,) = [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"]
    assert len(seen) < 1000 and "stopped before the end" not in seen
    (event,) = await spill_events(tape)
    assert event.payload["data"]["bytes"] == len(data)
    conf = settings()
    ctx = ToolContext(tape=tape, workspace=conf.workspace, settings=conf)
    back, _ = await read_all(registry, ctx, event.payload["data"]["handle"], from_end=False)
    assert back.encode("utf-8") == data


async def test_partial_read_that_spills_keeps_its_note_in_the_preview(
    fake_openai, agent, tape, workspace
):
    data = "".join(f"{i:07d}\n" for i in range(50_000))  # 400 000 characters
    (workspace / "huge.txt").write_text(data, encoding="utf-8")
    fake_openai.script(
        tool_calls([("fs_read", {"path": "huge.txt", "offset": 100, "limit": 100_000})]),
        text("read"),
    )
    await agent().run_turn(tape, [USER])
    (seen,) = [m["content"] for m in fake_openai.last_messages() if m["role"] == "tool"]
    assert "spill.read" in seen and seen.startswith(data[100:400])
    assert seen.endswith(
        "[fs_read stopped before the end of 'huge.txt': this is characters 100-100100 of"
        " 400000 (400000 bytes). Continue with fs_read(path='huge.txt', offset=100100)]"
    )
