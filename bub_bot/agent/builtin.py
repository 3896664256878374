"""Built-in tools: the tape (info, search, anchors, handoff), spill.read, the workspace
files (fs_tools.py), web.fetch (web_fetch.py) and skill (skills.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

from pydantic import Field

from ..tape import AnchorNotFound, TapeEntry
from . import spill
from .fs_tools import register_fs_tools
from .skills import register_skills
from .tools import ToolContext, ToolError, ToolRegistry
from .web_fetch import register_web_fetch

SEARCH_SNIPPET = 400


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

    register_fs_tools(registry)
    register_web_fetch(registry)
    register_skills(registry)
    return registry


def default_registry() -> ToolRegistry:
    """A registry with the built-in tools."""
    return register_builtins(ToolRegistry())


__all__ = ["AnchorNotFound", "default_registry", "register_builtins", "summary_note"]
