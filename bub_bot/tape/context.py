"""Context selectors: turn tape entries into the OpenAI message list for one model call."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .entries import TapeEntry

Selector = Callable[[Sequence[TapeEntry]], list[dict[str, Any]]]


def visible(entries: Sequence[TapeEntry]) -> list[TapeEntry]:
    """Drop entries marked `context=False` (operational records) and messages refused over a
    rate limit (stored, never sent to the model); runs before any selector."""
    return [
        e for e in entries if e.meta.get("context", True) is not False and "refused" not in e.meta
    ]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def default_selector(entries: Sequence[TapeEntry]) -> list[dict[str, Any]]:
    """Map entries to chat messages as DESIGN.md's table says.

    Tool results are paired to their calls by id; a result whose call is not in view is
    dropped, and so is a call none of whose results is in view (the API rejects both).
    Assistant text written just before a tool call joins that call's message.
    """
    answered = {
        r.get("tool_call_id")
        for e in entries
        if e.kind == "tool_result"
        for r in e.payload.get("results", [])
    }
    messages: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for entry in entries:
        if entry.kind == "message":
            messages.append(dict(entry.payload))
        elif entry.kind == "tool_call":
            calls = [c for c in entry.payload.get("calls", []) if c.get("id") in answered]
            if not calls:
                continue
            open_calls.update(c["id"] for c in calls)
            last = messages[-1] if messages else None
            if (
                last is not None
                and last.get("role") == "assistant"
                and not last.get("tool_calls")
                and isinstance(last.get("content"), str)
            ):
                last["tool_calls"] = calls
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        elif entry.kind == "tool_result":
            for result in entry.payload.get("results", []):
                call_id = result.get("tool_call_id")
                if call_id not in open_calls:
                    continue
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": _as_text(result.get("content", "")),
                    }
                )
        elif entry.kind == "anchor":
            state = json.dumps(entry.payload.get("state", {}), ensure_ascii=False)
            messages.append(
                {
                    "role": "assistant",
                    "content": f"[Anchor created: {entry.payload.get('name')}]: {state}",
                }
            )
        # event, system, error: audit only, never model input.
    return messages


def load_selector(ref: str) -> Selector:
    """The selector `module:function` names (BUB_CONTEXT_SELECTOR): a replacement strategy
    (compaction, summary, retrieval) with the default's signature, entries -> messages.
    ValueError says what is wrong with `ref`."""
    import importlib

    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{ref!r} is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module failing as it loads
        raise ValueError(f"cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ValueError(f"{module_name!r} has no {attr!r}")
    if not callable(found):
        raise ValueError(f"{ref!r} is not callable")
    return found
