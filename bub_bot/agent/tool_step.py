"""A step's tool calls run: concurrently, each result scrubbed, spilled when large, and a
call the approval policy denies answered without running (bub_bot/agent/approval_gate.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..secrets import Scrubber
from ..tape import Tape, TapeEntry
from . import spill
from .approval_gate import DENY, POLICY_DENIED
from .tools import ToolContext, ToolRegistry

Notify = Callable[[str, dict[str, Any]], None]


async def run_tools(
    tools: ToolRegistry,
    scrub: Scrubber,
    spill_threshold: int,
    notify: Notify,
    ctx: ToolContext,
    tape: Tape,
    calls: list[dict[str, Any]],
    content: str,
    policies: dict[str, str] | None = None,
    fixed: dict[str, str] | None = None,
) -> list[TapeEntry]:
    """Run the step's tool calls concurrently; results keep their `tool_call_id`s. A call
    the policy denies gets `fixed` text (or the policy's refusal) and does not run.
    `spill_threshold` is BUB_SPILL_THRESHOLD (tokens; about 4 characters each)."""
    policies = policies or {}
    fixed = fixed or {}

    async def one(call: dict[str, Any]) -> dict[str, Any]:
        name = call["function"]["name"]
        tool = tools.get(name, ctx.workspace)
        if policies.get(call["id"]) == DENY:
            text = fixed.get(call["id"], POLICY_DENIED)
            notify("tool_call", {"tool": tool.name if tool else "unknown", "ok": False})
            return {"tool_call_id": call["id"], "content": text, "ok": False}
        ok, result = await tools.call(ctx, name, call["function"].get("arguments", ""))
        result = scrub.value(result)  # before the tape, the spill and the model
        # A made-up name is "unknown": the model must not grow /metrics' label sets.
        notify("tool_call", {"tool": tool.name if tool else "unknown", "ok": ok})
        text = spill.render(result)
        if not _utf8_ok(text):
            # Lone surrogates (e.g. non-UTF-8 file names) cannot be stored as UTF-8 text.
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
            result = text
        threshold = spill_threshold * 4
        if threshold and len(text) >= threshold and (tool is None or tool.spillable):
            spilled = await spill.spill(tape, text, tool=name, call_id=call["id"])
            notify("spill", {"tool": name, "ok": spilled.handle is not None})
            return {"tool_call_id": call["id"], "content": spilled.text, "_event": spilled.event}
        shown: Any = result if ok else text
        return {"tool_call_id": call["id"], "content": shown, "ok": ok}

    results = await asyncio.gather(*(one(c) for c in calls))
    entries: list[TapeEntry] = []
    if content:
        entries.append(TapeEntry.message({"role": "assistant", "content": content}))
    entries.append(TapeEntry.tool_call(calls))
    events = [r.pop("_event") for r in results if "_event" in r]
    entries.append(TapeEntry.tool_result(list(results)))
    entries.extend(events)
    return entries


def _utf8_ok(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
