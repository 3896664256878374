"""An MCP `CallToolResult` as the result the model reads.

Text blocks are the answer; `structuredContent` is used when a tool returns no text (the
spec asks tools to repeat structured results as text, so using both would say it twice).
Images and audio cannot go into an OpenAI tool message (those take text only): the model
gets a note saying what was returned. Resource links and embedded resources become text.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def _size(data: str) -> str:
    """The decoded size of base64 `data`, for a note."""
    try:
        size = len(base64.b64decode(data, validate=False))
    except (ValueError, TypeError):
        size = len(data) * 3 // 4
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    if size >= 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size} bytes"


def block_text(block: Any) -> str:
    """One content block as text (a note for binary content)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return (
            f"[{kind} result: {block.mime_type}, {_size(block.data)}; {kind}s returned by tools"
            " cannot be shown to the model here]"
        )
    if kind == "resource_link":
        parts = [f"[resource link] {block.name}: {block.uri}"]
        if block.mime_type:
            parts.append(f"({block.mime_type})")
        if block.description:
            parts.append(f"— {block.description}")
        return " ".join(parts)
    if kind == "resource":
        resource = block.resource
        header = f"[resource {resource.uri}" + (
            f" ({resource.mime_type})]" if resource.mime_type else "]"
        )
        text = getattr(resource, "text", None)
        if text is not None:
            return f"{header}\n{text}"
        return f"{header} binary, {_size(resource.blob)}; not shown to the model"
    dumped = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps(dumped, ensure_ascii=False)


def result_value(result: Any) -> str | Any:
    """The value handed to the model for a successful call: text, or the structured
    result (a dict or list the loop renders as JSON)."""
    blocks = list(result.content or [])
    texts = [b for b in blocks if getattr(b, "type", None) == "text"]
    structured = result.structured_content
    if structured is not None and not texts:
        notes = [block_text(b) for b in blocks]
        if not notes:
            return structured
        return json.dumps(structured, ensure_ascii=False) + "\n" + "\n".join(notes)
    if len(blocks) == 1 and texts:
        return texts[0].text
    return "\n".join(block_text(b) for b in blocks)


def error_text(result: Any) -> str:
    """What an `isError` result says."""
    text = "\n".join(block_text(b) for b in result.content or []).strip()
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return text or "the tool reported an error without a message"
