"""Tape entries and model messages as readable, safe HTML for the tape viewer."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from bub_bot.tape import TapeEntry

from .render import json_arguments, markdown, plain, pre, when


def _content_html(content: Any, *, rich: bool) -> str:
    """Message content: assistant text as Markdown (`rich`), everything else as plain text;
    images are named, never loaded."""
    if isinstance(content, str):
        return markdown(content) if rich else plain(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(plain(str(part.get("text", ""))))
            elif isinstance(part, dict) and part.get("type") == "image_url":
                url = str((part.get("image_url") or {}).get("url", ""))
                kind = url.split(";", 1)[0] if url.startswith("data:") else "link"
                parts.append(plain(f"[image: {kind}, {len(url)} characters]", "muted"))
            else:
                parts.append(pre(part))
        return "".join(parts)
    return pre(content)


def _calls_html(calls: list[Any]) -> str:
    out = []
    for call in calls:
        if not isinstance(call, dict):
            out.append(pre(call))
            continue
        function = call.get("function") or {}
        out.append(
            f'<div class="call"><span class="tool">{escape(str(function.get("name", "?")))}</span>'
            f' <span class="muted">{escape(str(call.get("id", "")))}</span>'
            f"{json_arguments(function.get('arguments', ''))}</div>"
        )
    return "".join(out)


def message_html(message: dict[str, Any]) -> str:
    """One model message (the "context now" view): role, content, tool calls."""
    role = str(message.get("role", "?"))
    html = f'<div class="msg role-{escape(role)}"><div class="role">{escape(role)}'
    if message.get("tool_call_id"):
        html += f' <span class="muted">for {escape(str(message["tool_call_id"]))}</span>'
    html += "</div>"
    content = message.get("content")
    if content not in (None, ""):
        html += _content_html(content, rich=False)
    if message.get("tool_calls"):
        html += _calls_html(message["tool_calls"])
    return html + "</div>"


def call_names(entries: list[TapeEntry]) -> dict[str, str]:
    """Tool call id -> tool name, so results can say which tool they came from."""
    names = {}
    for entry in entries:
        if entry.kind == "tool_call":
            for call in entry.payload.get("calls", []):
                names[str(call.get("id"))] = str((call.get("function") or {}).get("name", "?"))
    return names


def _body(entry: TapeEntry, names: dict[str, str]) -> str:
    payload = entry.payload
    if entry.kind == "message":
        role = str(payload.get("role", "?"))
        html = f'<div class="role">{escape(role)}</div>'
        html += _content_html(payload.get("content"), rich=role == "assistant")
        if payload.get("tool_calls"):
            html += _calls_html(payload["tool_calls"])
        return html
    if entry.kind == "tool_call":
        return _calls_html(payload.get("calls", []))
    if entry.kind == "tool_result":
        out = []
        for result in payload.get("results", []):
            call_id = str(result.get("tool_call_id", ""))
            label = names.get(call_id, "")
            failed = ' <span class="bad">error</span>' if result.get("ok") is False else ""
            out.append(
                f'<div class="result"><span class="tool">{escape(label or "result")}</span>'
                f' <span class="muted">{escape(call_id)}</span>{failed}'
                f"{pre(result.get('content', ''))}</div>"
            )
        return "".join(out)
    if entry.kind == "anchor":
        state = payload.get("state") or {}
        html = f'<div class="anchor-name">⚓ {escape(str(payload.get("name", "")))}</div>'
        summary = state.get("summary")
        if isinstance(summary, str) and summary.strip():
            html += f'<div class="summary">{markdown(summary)}</div>'
        return html + pre(state)
    if entry.kind == "event":
        return (
            f'<div class="event-name">{escape(str(payload.get("name", "")))}</div>'
            f"{pre(payload.get('data') or {})}"
        )
    return pre(payload)


def entry_html(entry: TapeEntry, names: dict[str, str]) -> str:
    """One entry: id, kind, date, `context=False` marked, the body, the meta folded away."""
    hidden = entry.meta.get("context", True) is False
    flag = ' <span class="flag">not in context</span>' if hidden else ""
    meta = ""
    if entry.meta:
        shown = json.dumps(entry.meta, ensure_ascii=False, indent=2, default=str)
        meta = f"<details><summary>meta</summary><pre>{escape(shown)}</pre></details>"
    return (
        f'<article class="entry kind-{escape(entry.kind)}" id="e{entry.id}">'
        f'<header><a href="#e{entry.id}">#{entry.id}</a> <b>{escape(entry.kind)}</b>'
        f" <time>{when(entry.date)}</time>{flag}</header>"
        f"{_body(entry, names)}{meta}</article>"
    )
