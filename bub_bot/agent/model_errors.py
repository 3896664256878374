"""Model errors: what a failed call raises, and how a provider's error is read (context
overflow in every dialect, a server that refuses to stream, the note a user gets)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

_OVERFLOW_TEXT = re.compile(
    r"maximum context length|context (?:length|window|size)|exceeds the available context"
    r"|prompt is too long|input tokens exceed|exceed(?:s|ed)? (?:the )?context limit"
    r"|too many tokens",
    re.IGNORECASE,
)


class ModelError(Exception):
    """The model call failed for good (after the SDK's bounded retries).

    `user_message` is plain text that can go to the chat; the exception text is for logs.
    """

    def __init__(self, message: str, user_message: str) -> None:
        super().__init__(message)
        self.user_message = user_message


class ContextOverflow(ModelError):
    """The provider rejected the request for its length."""


TIMED_OUT_MESSAGE = "The model took too long to answer. Please try again."
UNREACHABLE_MESSAGE = "I could not reach the model service. Please try again in a moment."
UNUSABLE_MESSAGE = (
    "The model service sent an answer I could not read. The operator needs to check"
    " OPENAI_BASE_URL (it should point at an OpenAI-compatible API, usually ending in /v1)."
)


def error_fields(exc: openai.APIStatusError) -> tuple[str, str, str]:
    """(code, type, message) from whatever error body shape the server used."""
    body: Any = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    code = getattr(exc, "code", None)
    if isinstance(body, dict):
        code = code if code is not None else body.get("code")
        type_ = body.get("type") or getattr(exc, "type", None) or ""
        message = body.get("message") or body.get("error") or exc.message
    else:
        type_, message = getattr(exc, "type", None) or "", str(body or exc.message)
    if not isinstance(message, str):
        message = json.dumps(message)
    return str(code or ""), str(type_), message


def is_context_overflow(exc: BaseException) -> bool:
    """True when a provider error means "the prompt is longer than the model's window".

    Covers OpenAI (`context_length_exceeded`), llama.cpp (`exceed_context_size_error`),
    vLLM / OpenRouter / DeepSeek ("maximum context length"), Anthropic ("prompt is too long"),
    newer OpenAI ("Input tokens exceed"), and HTTP 413; other 400s (bad tool schema) are not.
    """
    import openai

    if not isinstance(exc, openai.APIStatusError):
        return False
    if exc.status_code == 413:
        return True
    if exc.status_code != 400:
        return False
    code, type_, message = error_fields(exc)
    if code == "context_length_exceeded" or type_ == "exceed_context_size_error":
        return True
    return bool(_OVERFLOW_TEXT.search(message) or _OVERFLOW_TEXT.search(str(exc.body)))


def is_overflow_error(error: Any) -> bool:
    """The same judgement for an error object that came as an event inside a stream."""
    if not isinstance(error, dict):
        return bool(_OVERFLOW_TEXT.search(str(error)))
    if error.get("code") == "context_length_exceeded":
        return True
    if error.get("type") == "exceed_context_size_error":
        return True
    return bool(_OVERFLOW_TEXT.search(str(error.get("message") or "")))


_STREAM_WORDS = re.compile(r"\bstream(?:ing|_options)?\b", re.IGNORECASE)


def refuses_streaming(exc: openai.APIStatusError) -> bool:
    """A 4xx that names `stream` / `stream_options`: the server does not stream (or not
    with usage)."""
    if exc.status_code not in (400, 404, 405, 422, 501):
        return False
    _, _, message = error_fields(exc)
    return bool(_STREAM_WORDS.search(message) or _STREAM_WORDS.search(str(exc.body)))


def dropped_connection(exc: BaseException) -> bool:
    """A refused or dropped connection that the aiohttp transport reported as a timeout."""
    import aiohttp

    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(
            cause, aiohttp.ServerTimeoutError | TimeoutError
        ):
            return True
        cause = cause.__cause__
    return False


def status_message(status: int) -> str:
    """What the user is told when the model service answered with HTTP `status`."""
    if status == 429:
        return "The model service is rate-limiting us right now. Please try again in a minute."
    if status in (401, 403):
        return "The model service refused our credentials. The operator needs to check the API key."
    if status == 404:
        return "The model service does not know the configured model. The operator needs to check BUB_MODEL."
    if status >= 500:
        return f"The model service is having trouble (HTTP {status}). Please try again in a moment."
    return f"The model service rejected the request (HTTP {status}). Please try again or rephrase."
