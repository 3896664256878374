"""The model client: chat completions through the official openai SDK, any compatible server."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import DEFAULT_OPENAI_BASE_URL, Settings

if TYPE_CHECKING:
    import openai

# The openai SDK takes about a second to import; it is imported on the first model call so
# `bub-bot serve` reports ready (and answers health checks) sooner.

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


def _error_fields(exc: openai.APIStatusError) -> tuple[str, str, str]:
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
    code, type_, message = _error_fields(exc)
    if code == "context_length_exceeded" or type_ == "exceed_context_size_error":
        return True
    return bool(_OVERFLOW_TEXT.search(message) or _OVERFLOW_TEXT.search(str(exc.body)))


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One completion: the assistant message, its tool calls, usage and timing."""

    content: str
    tool_calls: list[dict[str, Any]]
    usage: dict[str, Any]
    model: str
    latency_ms: float
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _usage(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    usage = {
        "prompt_tokens": getattr(raw, "prompt_tokens", None),
        "completion_tokens": getattr(raw, "completion_tokens", None),
        "total_tokens": getattr(raw, "total_tokens", None),
    }
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    if cached is not None:
        usage["cached_tokens"] = cached
    return {k: v for k, v in usage.items() if v is not None}


class ModelClient:
    """Calls chat completions; retries 429/5xx with the SDK's Retry-After-aware backoff."""

    def __init__(self, settings: Settings, client: openai.AsyncOpenAI | None = None) -> None:
        self.model = settings.model
        self.max_tokens = settings.max_tokens
        self.base_url = settings.openai_base_url or DEFAULT_OPENAI_BASE_URL
        self._settings = settings
        self._client = client

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client, created (and the SDK imported) on first use."""
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(
                # Local servers (llama.cpp, Ollama, vLLM) often need no key; the SDK wants one.
                api_key=self._settings.openai_api_key or "not-needed",
                base_url=self.base_url,
                timeout=self._settings.model_timeout_seconds,
                max_retries=self._settings.model_retries,
                http_client=_http_client(self._settings),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
    ) -> ModelReply:
        """One chat completion. Raises ContextOverflow or ModelError (never SDK exceptions)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        limit = max_tokens or self.max_tokens
        if limit:
            body["max_tokens"] = limit
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        client = self.client
        import openai
        from openai.types.chat import ChatCompletion

        started = time.perf_counter()
        try:
            # The SDK's documented raw `post` (same auth, retries, Retry-After and error
            # types as `chat.completions.create`) skips re-walking our already plain-JSON
            # messages through its TypedDict transform: ~10 ms less CPU per call here.
            response = await client.post(
                "/chat/completions", cast_to=ChatCompletion, body=body, options=options
            )
        except openai.APIStatusError as exc:
            if is_context_overflow(exc):
                _, _, message = _error_fields(exc)
                raise ContextOverflow(
                    message,
                    "This message alone is too long for the model's context window, even"
                    " after starting a fresh phase. Please send something shorter.",
                ) from exc
            raise ModelError(
                f"model request failed: HTTP {exc.status_code}: {_error_fields(exc)[2]}",
                _status_message(exc.status_code),
            ) from exc
        except openai.APITimeoutError as exc:
            if _dropped_connection(exc):
                raise ModelError(
                    f"cannot reach the model endpoint: {exc.__cause__}",
                    "I could not reach the model service. Please try again in a moment.",
                ) from exc
            raise ModelError(
                "model request timed out", "The model took too long to answer. Please try again."
            ) from exc
        except openai.APIConnectionError as exc:
            raise ModelError(
                f"cannot reach the model endpoint: {exc}",
                "I could not reach the model service. Please try again in a moment.",
            ) from exc
        latency_ms = (time.perf_counter() - started) * 1000
        if not response.choices:
            raise ModelError(
                "model returned no choices", "The model returned an empty answer. Please try again."
            )
        choice = response.choices[0]
        message = choice.message
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": call.function.arguments or "",
                },
            }
            for call in (message.tool_calls or [])
            if getattr(call, "function", None) is not None
        ]
        return ModelReply(
            content=message.content or "",
            tool_calls=calls,
            usage=_usage(response.usage),
            model=response.model or self.model,
            latency_ms=latency_ms,
            finish_reason=choice.finish_reason,
        )


def _dropped_connection(exc: BaseException) -> bool:
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


def _http_client(settings: Settings) -> Any:
    """The SDK's aiohttp transport when it has one: with hundreds of concurrent turns the
    default httpx pool spends more CPU scanning its idle connections than on the requests."""
    import openai

    factory = getattr(openai, "DefaultAioHttpClient", None)
    if factory is None:
        return None
    try:
        return factory(timeout=settings.model_timeout_seconds)
    except Exception:  # the optional transport is missing in this SDK build
        return None


def _status_message(status: int) -> str:
    if status == 429:
        return "The model service is rate-limiting us right now. Please try again in a minute."
    if status in (401, 403):
        return "The model service refused our credentials. The operator needs to check the API key."
    if status == 404:
        return "The model service does not know the configured model. The operator needs to check BUB_MODEL."
    if status >= 500:
        return f"The model service is having trouble (HTTP {status}). Please try again in a moment."
    return f"The model service rejected the request (HTTP {status}). Please try again or rephrase."
