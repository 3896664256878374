"""Built-in tools: the tape (info, search, anchors, handoff), spill.read, the workspace,
web.fetch (web_fetch.py) and skill (skills.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from ..secrets import Scrubber, secret_path_match
from ..tape import AnchorNotFound, TapeEntry
from . import spill
from .skills import register_skills
from .tools import ToolContext, ToolError, ToolRegistry
from .web_fetch import register_web_fetch

SEARCH_SNIPPET = 400
FS_READ_DEFAULT = 20_000
FS_READ_LIMIT = 256 * 1024
"""At most this many characters per fs.read: a 200 KB file fits one call (and is spilled)."""
COUNT_CHARS_UP_TO = 8 * 1024 * 1024
"""Files up to this size get their exact character count in a partial read's note."""
BINARY_SNIFF = 8192


def _brief(entry: TapeEntry) -> dict[str, Any]:
    text = json.dumps(entry.payload, ensure_ascii=False)
    if len(text) > SEARCH_SNIPPET:
        text = text[:SEARCH_SNIPPET] + "…"
    return {"id": entry.id, "kind": entry.kind, "date": entry.date, "payload": text}


def summary_note(summary: str) -> TapeEntry:
    """A handoff's summary as model input, written right after its anchor (seed 003: a
    handoff does not inject its state by itself)."""
    return TapeEntry.message(
        {"role": "user", "content": f"[Summary of the previous phase]\n{summary}"},
        handoff_summary=True,
    )


def _resolve(ctx: ToolContext, path: str) -> Path:
    """A path inside the workspace that may be read; absolute paths, `..`, escaping symlinks,
    secret files and bub-bot's own data are refused."""
    if not path or path == ".":
        return ctx.workspace.resolve()
    raw = Path(path)
    if raw.is_absolute():
        raise ToolError(
            f"absolute paths are not allowed: {path!r} (use a path relative to the workspace)"
        )
    if ".." in raw.parts:
        raise ToolError(f"'..' is not allowed in paths: {path!r}")
    root = ctx.workspace.resolve()
    target = (root / raw).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"{path!r} leads outside the workspace (through a symlink)")
    # The name asked for and the file it leads to (a symlink to .env is still .env).
    pattern = secret_path_match(raw) or secret_path_match(target.relative_to(root))
    if pattern is not None:
        raise ToolError(
            f"refused: {path!r} may hold secrets (it matches {pattern!r}); the file tools"
            " never open secret files"
        )
    if _is_own_data(ctx, root, target):
        raise ToolError(
            f"refused: {path!r} is bub-bot's own data (the tapes of every conversation)"
        )
    return target


def _is_own_data(ctx: ToolContext, root: Path, target: Path) -> bool:
    """True for the tape database (and its journal files), and for anything in BUB_HOME
    when BUB_HOME is a directory inside the workspace."""
    home = ctx.settings.home.expanduser().resolve()
    if root in home.parents and (target == home or home in target.parents):
        return True
    database = ctx.settings.database_path
    if "://" in database:
        return False
    db = Path(database).expanduser().resolve()
    return target.parent == db.parent and target.name in {
        db.name + suffix for suffix in ("", "-wal", "-shm", "-journal")
    }


def _read_text(
    target: Path, name: str, offset: int, limit: int, scrub: Scrubber | None = None
) -> tuple[str, int, bool, int, int | None]:
    """Characters `offset`..`offset+limit` of a UTF-8 file, line endings kept as they are,
    secrets replaced (also a secret that starts before the page or ends after it).

    Returns (text, characters read, whether more follows, size in bytes, total characters
    or None when the file is too big to count cheaply). Runs in a thread: it reads no further than needed,
    except to count the characters of a file up to COUNT_CHARS_UP_TO bytes.
    """
    margin = max(scrub.longest - 1, 0) if scrub else 0
    size = target.stat().st_size
    with target.open("rb") as raw:
        if b"\0" in raw.read(BINARY_SNIFF):
            raise ToolError(f"{name!r} is a binary file ({size} bytes); fs_read reads text")
    with target.open(encoding="utf-8", errors="replace", newline="") as f:
        skipped, before = 0, ""
        while skipped < offset:
            piece = f.read(min(offset - skipped, 1 << 20))
            if not piece:
                break
            skipped += len(piece)
            before = (before + piece)[-margin:] if margin else ""
        text = f.read(limit)
        if offset and not text:
            raise ToolError(
                f"offset {offset} is at or past the end of {name!r} ({skipped} characters)"
            )
        after = f.read(max(margin, 1))
        more = after != ""
        total: int | None = None
        if more and size <= COUNT_CHARS_UP_TO:
            total = offset + len(text) + len(after) + len(f.read())
    read = len(text)
    if scrub:
        text = scrub.text_in(text, before, after)
    return text, read, more, size, total


def register_builtins(registry: ToolRegistry) -> ToolRegistry:
    """Add the built-in tools to `registry`."""

    @registry.tool("tape.info")
    async def tape_info(ctx: ToolContext) -> dict[str, Any]:
        """Facts about this conversation's tape: entries, anchors, the last anchor, entries since it, last token usage."""
        return asdict(await ctx.tape.info())

    @registry.tool("tape.search")
    async def tape_search(
        ctx: ToolContext,
        query: Annotated[str, Field(description="text to find (any language)")] = "",
        kinds: Annotated[
            list[str] | None, Field(description="entry kinds, e.g. ['message']")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
        since: Annotated[str | None, Field(description="ISO date or time (UTC)")] = None,
        until: Annotated[
            str | None, Field(description="ISO date or time (UTC); a bare date includes that day")
        ] = None,
    ) -> list[dict[str, Any]]:
        """Search the whole tape of this conversation (also before the last anchor), newest first."""
        try:
            found = await ctx.tape.query(
                text=query or None,
                kinds=kinds,
                limit=limit,
                since=since,
                until=until,
                newest_first=True,
            )
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        return [_brief(e) for e in found]

    @registry.tool("tape.anchors")
    async def tape_anchors(
        ctx: ToolContext, limit: Annotated[int, Field(ge=1, le=100)] = 20
    ) -> list[dict[str, Any]]:
        """The most recent anchors (phase boundaries) of this conversation."""
        return [
            {"id": a.id, "name": a.payload["name"], "state": a.payload.get("state"), "date": a.date}
            for a in await ctx.tape.anchors(limit)
        ]

    @registry.tool("tape.handoff")
    async def tape_handoff(
        ctx: ToolContext,
        summary: Annotated[
            str, Field(min_length=1, description="what the next phase needs to know")
        ],
        name: Annotated[str, Field(min_length=1, max_length=100)] = "handoff",
    ) -> str:
        """Start a new phase of this conversation: earlier messages leave your context and the summary is carried over."""
        if ctx.handed_off:
            raise ToolError("already handed off in this step")
        state = {"summary": summary, "owner": "agent"}
        # The same entries as Tape.handoff + /handoff <text>, written after this step.
        ctx.deferred.extend(
            [
                TapeEntry.anchor(name, state),
                TapeEntry.event("handoff", {"name": name, "state": state}),
                summary_note(summary),
            ]
        )
        ctx.handed_off = True
        return f"handoff {name!r} recorded; the next step starts from the summary"

    @registry.tool("spill.read", spillable=False)
    async def spill_read(
        ctx: ToolContext,
        handle: str,
        cursor: Annotated[int, Field(ge=0)] = 0,
        count: Annotated[int, Field(ge=1, le=spill.MAX_CHUNKS_PER_READ)] = 1,
        from_end: bool = False,
    ) -> str:
        """Read chunks of a spilled (oversized) tool output by handle. The first line is a JSON header with next_cursor and complete."""
        return await spill.read(ctx.tape, handle, cursor, count, from_end)

    @registry.tool("fs.list")
    async def fs_list(ctx: ToolContext, path: str = ".") -> list[str]:
        """List a directory of the workspace (directories end with /)."""
        target = _resolve(ctx, path)
        if not target.is_dir():
            if target == ctx.workspace.resolve():
                return []  # the workspace directory was not created: nothing to show
            raise ToolError(f"not a directory: {path!r}")
        return sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())[:1000]

    @registry.tool("fs.read")
    async def fs_read(
        ctx: ToolContext,
        path: str,
        offset: Annotated[int, Field(ge=0, description="first character to read")] = 0,
        limit: Annotated[
            int, Field(ge=1, le=FS_READ_LIMIT, description="how many characters")
        ] = FS_READ_DEFAULT,
    ) -> str:
        """Read a text file of the workspace, `limit` characters from `offset`. When the file goes on, the result ends with a note giving its size and the offset to continue from."""
        target = _resolve(ctx, path)
        if not target.is_file():
            raise ToolError(f"no such file: {path!r}")
        text, read, more, size, total = await asyncio.to_thread(
            _read_text, target, path, offset, limit, Scrubber.for_settings(ctx.settings)
        )
        if not more:
            return text  # the whole rest of the file, exactly
        end = offset + read
        of = f"{total} ({size} bytes)" if total is not None else f"a {size}-byte file"
        return (
            f"{text}\n\n[fs_read stopped before the end of {path!r}: this is characters"
            f" {offset}-{end} of {of}. Continue with fs_read(path={path!r}, offset={end})]"
        )

    register_web_fetch(registry)
    register_skills(registry)
    return registry


def default_registry() -> ToolRegistry:
    """A registry with the built-in tools."""
    return register_builtins(ToolRegistry())


__all__ = ["AnchorNotFound", "default_registry", "register_builtins", "summary_note"]
