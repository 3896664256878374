"""What a chat-completions answer holds: the checks that turn any 200 answer into a
completion or a precise `Unusable` (what it was instead), and the fields read from it."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class Unusable(Exception):
    """A 200 answer that is not a chat completion; the text says what it was instead."""


def decoded(raw: bytes) -> Any:
    """A body read by hand: its JSON, else its text (for the same checks as a plain answer)."""
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def field_of(raw: Any, name: str) -> Any:
    """A field of an SDK object or of a plain JSON dict."""
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def usage_of(raw: Any) -> dict[str, Any]:
    """Token counts of a usage block (SDK object or JSON dict); anything else counts nothing."""
    if raw is None or isinstance(raw, str | int | float | list):
        return {}
    usage = {
        "prompt_tokens": field_of(raw, "prompt_tokens"),
        "completion_tokens": field_of(raw, "completion_tokens"),
        "total_tokens": field_of(raw, "total_tokens"),
    }
    details = field_of(raw, "prompt_tokens_details")
    cached = field_of(details, "cached_tokens") if details is not None else None
    if cached is not None:
        usage["cached_tokens"] = cached
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


def public_url(url: str) -> str:
    """`url` without user-info, query and fragment: fit for logs and error texts (proxies
    take credentials as `user:pass@` or `?api-key=`)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(an invalid URL)"
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def describe(data: Any) -> str:
    """What a 200 answer was, in a few words (never its text: it may echo our headers)."""
    if isinstance(data, str):
        stripped = data.lstrip()
        if not stripped:
            return "an empty body"
        if stripped[:1] == "<":
            return "an HTML page" if "html" in stripped[:512].lower() else "an XML/HTML body"
        return "a non-JSON body"
    if data is None:
        return "JSON null"
    return f"a JSON {type(data).__name__}"


def content_of(message: dict[str, Any]) -> str:
    """The assistant text: a string, null, or a list of text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(p["text"] for p in content if isinstance(p.get("text"), str))
    raise Unusable(f"a message whose content is a {type(content).__name__}")


def tool_calls_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls in our tape's shape; a missing id is made up, dict arguments dumped."""
    raw = message.get("tool_calls")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Unusable(f"tool_calls that are a {type(raw).__name__}, not a list")
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise Unusable("a tool call without a function name")
        arguments = function.get("arguments")  # type: ignore[union-attr]
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = "call_" + uuid.uuid4().hex[:24]
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def completion_of(data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the completion, its first choice's message) or Unusable."""
    if isinstance(data, str) and data.strip():
        try:  # a valid completion sent with a sloppy content type
            data = json.loads(data)
        except ValueError:
            pass
    if not isinstance(data, dict):
        raise Unusable(describe(data))
    choices = data.get("choices")
    if choices is None:
        raise Unusable("JSON with no choices")
    if not isinstance(choices, list):
        raise Unusable("choices that are not a list")
    if not choices:
        raise Unusable("no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise Unusable("a choice without a message")
    return data, message
