"""Spill: oversized tool output goes to the `spill` sidecar tape; the main tape keeps a preview.

Layout on the sidecar, per handle: for each chunk an anchor `spill/<handle>/chunk/<i>`
followed by a `tool_result` holding the chunk's text; then the manifest anchor
`spill/<handle>/manifest` and the `spill.manifest` event. The manifest is the commit marker:
a handle without it does not exist.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from ..tape import AnchorNotFound, Tape, TapeEntry

log = logging.getLogger(__name__)

CHUNK_BYTES = 16 * 1024
PREVIEW_CHARS = 600
MAX_CHUNKS_PER_READ = 4
SIDECAR = "spill"


def render(result: Any) -> str:
    """A tool result as the text the model reads (structured results as JSON)."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, default=str)


def utf8_chunks(text: str, limit: int = CHUNK_BYTES) -> list[bytes]:
    """Cut UTF-8 bytes into pieces of at most `limit` bytes, never inside a character."""
    data = text.encode("utf-8")
    chunks: list[bytes] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        # Step back over continuation bytes (10xxxxxx) so a character is never split.
        while end < len(data) and end > start and (data[end] & 0xC0) == 0x80:
            end -= 1
        chunks.append(data[start:end])
        start = end
    return chunks


def preview(text: str, handle: str | None, note: str) -> str:
    """Head and tail of `text` (about PREVIEW_CHARS) around a marker saying where the rest is."""
    half = PREVIEW_CHARS // 2
    head, tail = text[:half], text[-half:]
    where = (
        f"use spill.read(handle={handle!r}) to page through it"
        if handle
        else "the rest was not stored"
    )
    return f"{head}\n…[{note}: {len(text)} characters in all; {where}]…\n{tail}"


@dataclass(frozen=True, slots=True)
class SpillResult:
    """What the main tape gets instead of the full output."""

    text: str
    handle: str | None
    event: TapeEntry


async def spill(tape: Tape, text: str, *, tool: str, call_id: str) -> SpillResult:
    """Store `text` on the spill sidecar and return the bounded preview for the main tape."""
    handle = "sp_" + uuid.uuid4().hex[:16]
    chunks = utf8_chunks(text)
    sidecar = tape.sidecar(SIDECAR)
    try:
        batch: list[TapeEntry] = []
        for index, chunk in enumerate(chunks):
            batch.append(TapeEntry.anchor(f"spill/{handle}/chunk/{index}", {"bytes": len(chunk)}))
            batch.append(
                TapeEntry.tool_result([{"tool_call_id": call_id, "content": chunk.decode("utf-8")}])
            )
            if len(batch) >= 32:
                await sidecar.append_many(batch)
                batch = []
        manifest = {
            "handle": handle,
            "chunks": len(chunks),
            "bytes": sum(len(c) for c in chunks),
            "chars": len(text),
            "lines": text.count("\n") + 1,
            "tool": tool,
        }
        batch.append(TapeEntry.anchor(f"spill/{handle}/manifest", manifest))
        batch.append(TapeEntry.event("spill.manifest", manifest))
        await sidecar.append_many(batch)
    except Exception as exc:
        log.error("spill.write failed session=%s tool=%s: %s", tape.session_id, tool, exc)
        event = TapeEntry.event(
            "spill.write",
            {"ok": False, "tool": tool, "chars": len(text), "error": str(exc)},
            context=False,
        )
        return SpillResult(preview(text, None, "output truncated, spill failed"), None, event)
    event = TapeEntry.event("spill.write", {"ok": True, **manifest}, context=False)
    return SpillResult(preview(text, handle, f"output spilled as {handle}"), handle, event)


async def read(
    tape: Tape, handle: str, cursor: int = 0, count: int = 1, from_end: bool = False
) -> str:
    """Page through a spilled output: at most MAX_CHUNKS_PER_READ chunks per call."""
    sidecar = tape.sidecar(SIDECAR)
    manifests = await sidecar.query(
        kinds=["anchor"], names=[f"spill/{handle}/manifest"], newest_first=True, limit=1
    )
    if not manifests:
        partial = await sidecar.query(kinds=["anchor"], names=[f"spill/{handle}/chunk/0"], limit=1)
        if partial:
            return f"spill handle {handle!r} has no manifest: the spill never completed, so its chunks cannot be trusted"
        return f"unknown spill handle {handle!r}"
    manifest = manifests[0].payload["state"]
    total = int(manifest["chunks"])
    count = max(1, min(int(count), MAX_CHUNKS_PER_READ))
    cursor = max(0, int(cursor))
    if cursor >= total:
        return f"cursor {cursor} is past the end: handle {handle!r} has {total} chunks (0..{total - 1})"
    if from_end:
        last = total - 1 - cursor
        first = max(0, last - count + 1)
    else:
        first = cursor
        last = min(total - 1, cursor + count - 1)
    pieces: list[str] = []
    byte_count = 0
    for index in range(first, last + 1):
        try:
            found = await sidecar.query(after_anchor=f"spill/{handle}/chunk/{index}", limit=1)
        except AnchorNotFound:
            found = []
        content = None
        if found and found[0].kind == "tool_result":
            results = found[0].payload.get("results") or [{}]
            content = results[0].get("content")
        if not isinstance(content, str):
            return f"chunk {index} of spill handle {handle!r} is missing or invalid"
        pieces.append(content)
        byte_count += len(content.encode("utf-8"))
    next_cursor = cursor + (last - first + 1)
    complete = next_cursor >= total
    header = {
        "handle": handle,
        "chunks": [first, last],
        "total_chunks": total,
        "bytes": byte_count,
        "total_bytes": manifest.get("bytes"),
        "next_cursor": None if complete else next_cursor,
        "complete": complete,
        "from_end": from_end,
    }
    return json.dumps(header) + "\n" + "".join(pieces)
