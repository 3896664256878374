"""The model client: chat completions through the official openai SDK, any compatible server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..config import DEFAULT_OPENAI_BASE_URL, Settings
from ..secrets import Scrubber
from .streaming import (
    Assembler,
    Progress,
    ProgressCallback,
    StreamBroken,
    StreamErrorEvent,
    events,
)

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

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


class _Unusable(Exception):
    """A 200 answer that is not a chat completion; the text says what it was instead."""


class _Fallback(Exception):
    """A streamed request did not give an answer: ask once more without streaming.
    `shown`: progress was reported, so the watcher must be told to reset."""

    def __init__(self, reason: str, *, shown: bool) -> None:
        super().__init__(reason)
        self.shown = shown


UNUSABLE_MESSAGE = (
    "The model service sent an answer I could not read. The operator needs to check"
    " OPENAI_BASE_URL (it should point at an OpenAI-compatible API, usually ending in /v1)."
)


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


def _is_overflow_error(error: Any) -> bool:
    """The same judgement for an error object that came as an event inside a stream."""
    if not isinstance(error, dict):
        return bool(_OVERFLOW_TEXT.search(str(error)))
    if error.get("code") == "context_length_exceeded":
        return True
    if error.get("type") == "exceed_context_size_error":
        return True
    return bool(_OVERFLOW_TEXT.search(str(error.get("message") or "")))


_STREAM_WORDS = re.compile(r"\bstream(?:ing|_options)?\b", re.IGNORECASE)


def _refuses_streaming(exc: openai.APIStatusError) -> bool:
    """A 4xx that names `stream` / `stream_options`: the server does not stream (or not
    with usage)."""
    if exc.status_code not in (400, 404, 405, 422, 501):
        return False
    _, _, message = _error_fields(exc)
    return bool(_STREAM_WORDS.search(message) or _STREAM_WORDS.search(str(exc.body)))


def _decoded(raw: bytes) -> Any:
    """A body read by hand: its JSON, else its text (for the same checks as a plain answer)."""
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


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


def _get(raw: Any, name: str) -> Any:
    """A field of an SDK object or of a plain JSON dict."""
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def _usage(raw: Any) -> dict[str, Any]:
    """Token counts of a usage block (SDK object or JSON dict); anything else counts nothing."""
    if raw is None or isinstance(raw, str | int | float | list):
        return {}
    usage = {
        "prompt_tokens": _get(raw, "prompt_tokens"),
        "completion_tokens": _get(raw, "completion_tokens"),
        "total_tokens": _get(raw, "total_tokens"),
    }
    details = _get(raw, "prompt_tokens_details")
    cached = _get(details, "cached_tokens") if details is not None else None
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


def _describe(data: Any) -> str:
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


def _content(message: dict[str, Any]) -> str:
    """The assistant text: a string, null, or a list of text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(p["text"] for p in content if isinstance(p.get("text"), str))
    raise _Unusable(f"a message whose content is a {type(content).__name__}")


def _tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls in our tape's shape; a missing id is made up, dict arguments dumped."""
    raw = message.get("tool_calls")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _Unusable(f"tool_calls that are a {type(raw).__name__}, not a list")
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise _Unusable("a tool call without a function name")
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


def _completion(data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the completion, its first choice's message) or _Unusable."""
    if isinstance(data, str) and data.strip():
        try:  # a valid completion sent with a sloppy content type
            data = json.loads(data)
        except ValueError:
            pass
    if not isinstance(data, dict):
        raise _Unusable(_describe(data))
    choices = data.get("choices")
    if choices is None:
        raise _Unusable("JSON with no choices")
    if not isinstance(choices, list):
        raise _Unusable("choices that are not a list")
    if not choices:
        raise _Unusable("no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _Unusable("a choice without a message")
    return data, message


class ModelClient:
    """Calls chat completions; retries 429/5xx with the SDK's Retry-After-aware backoff."""

    def __init__(self, settings: Settings, client: openai.AsyncOpenAI | None = None) -> None:
        self.model = settings.model
        self.max_tokens = settings.max_tokens
        self.base_url = settings.openai_base_url or DEFAULT_OPENAI_BASE_URL
        self._settings = settings
        self._client = client
        self._scrub = Scrubber.for_settings(settings)
        """Provider texts and replies never carry a configured secret."""
        self._stream_refused = False
        """The server refused to stream (or ignored `stream`): not asked again."""
        self._stream_usage = True
        """Ask for usage in the last chunk (`stream_options`) until the server refuses it."""

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
        on_progress: ProgressCallback | None = None,
    ) -> ModelReply:
        """One chat completion. Raises ContextOverflow or ModelError (never SDK exceptions).

        With `on_progress` (and BUB_STREAM on) the answer is streamed and `on_progress` sees
        the text as it grows. A server that refuses to stream, or a stream that breaks, gets
        one non-streamed request instead (after `Progress("reset")` if anything was shown);
        a server that refused is not asked to stream again by this process.
        """
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        limit = max_tokens or self.max_tokens
        if limit:
            body["max_tokens"] = limit
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if on_progress is not None and self.streaming:
            try:
                return await self._streamed(body, options, on_progress)
            except _Fallback as exc:
                log.warning("model.stream_fallback base_url=%s: %s", public_url(self.base_url), exc)
                if exc.shown:
                    on_progress(Progress("reset"))
        return await self._plain(body, options)

    @property
    def streaming(self) -> bool:
        """Whether steps with a watcher are streamed (BUB_STREAM, and the server did not
        refuse)."""
        return self._settings.stream and not self._stream_refused

    async def _plain(self, body: dict[str, Any], options: dict[str, Any]) -> ModelReply:
        client = self.client
        started = time.perf_counter()
        try:
            # The SDK's documented raw `post` (same auth, retries, Retry-After and error
            # types as `chat.completions.create`) skips re-walking our already plain-JSON
            # messages through its TypedDict transform: ~10 ms less CPU per call here.
            # `cast_to=object` hands over the JSON as it came (or the text of a non-JSON
            # body), so every unusable answer is ours to check below.
            data = await client.post(
                "/chat/completions", cast_to=object, body=body, options=options
            )
        except Exception as exc:
            raise self._failed(exc) from exc
        return self._reply(data, started)

    async def _streamed(
        self, body: dict[str, Any], options: dict[str, Any], on_progress: ProgressCallback
    ) -> ModelReply:
        """One streamed completion; raises _Fallback when a plain request should answer."""
        client = self.client
        import openai

        streamed = {**body, "stream": True}
        if self._stream_usage:
            streamed["stream_options"] = {"include_usage": True}
        started = time.perf_counter()
        try:
            stream = await client.post(
                "/chat/completions",
                cast_to=object,
                body=streamed,
                options=options,
                stream=True,
                stream_cls=openai.AsyncStream[object],
            )
        except openai.APIStatusError as exc:
            if not is_context_overflow(exc) and _refuses_streaming(exc):
                message = _error_fields(exc)[2]
                if "stream_options" in message or "include_usage" in message:
                    self._stream_usage = False  # streams, but not with usage
                else:
                    self._stream_refused = True
                raise _Fallback(
                    self._scrub.text(f"HTTP {exc.status_code}: {message[:300]}"), shown=False
                ) from None
            raise self._failed(exc) from exc
        except Exception as exc:
            raise self._failed(exc) from exc
        response = stream.response
        try:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                # The server ignored `stream`: its answer is a whole completion (or is not
                # one, which the same checks as a plain answer report).
                self._stream_refused = True
                log.info("model.stream_ignored base_url=%s", public_url(self.base_url))
                return self._reply(_decoded(await response.aread()), started)
            assembler = Assembler(self._scrub, on_progress)
            try:
                async for event, data in events(response.aiter_bytes()):
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise StreamBroken("a chunk that is not JSON") from None
                    if event == "error":
                        raise StreamErrorEvent(
                            chunk.get("error", chunk) if isinstance(chunk, dict) else chunk
                        )
                    assembler.add(chunk)
                parts = assembler.result()
                calls = _tool_calls({"tool_calls": parts.tool_calls})
            except StreamErrorEvent as exc:
                if _is_overflow_error(exc.error):
                    if assembler.shown:
                        on_progress(Progress("reset"))  # the retry after a handoff follows
                    raise self._overflow(str(exc)) from None
                raise _Fallback(
                    self._scrub.text(f"an error event in the stream: {str(exc)[:300]}"),
                    shown=assembler.shown,
                ) from None
            except (StreamBroken, _Unusable) as exc:
                raise _Fallback(str(exc), shown=assembler.shown) from None
            except (ModelError, asyncio.CancelledError):
                raise
            except Exception as exc:
                if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
                    # No data for the whole timeout: asking again would only wait as long.
                    raise ModelError(
                        "model stream timed out",
                        "The model took too long to answer. Please try again.",
                    ) from exc
                # The connection broke mid-way.
                raise _Fallback(
                    f"the stream broke: {type(exc).__name__}", shown=assembler.shown
                ) from None
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        model = parts.model
        return ModelReply(
            content=parts.content,
            tool_calls=calls,
            usage=_usage(parts.usage),
            model=model if isinstance(model, str) and model else self.model,
            latency_ms=(time.perf_counter() - started) * 1000,
            finish_reason=parts.finish_reason,
            extra={"streamed": True},
        )

    def _reply(self, data: Any, started: float) -> ModelReply:
        """A ModelReply from a whole (non-streamed) answer, or the ModelError it deserves."""
        latency_ms = (time.perf_counter() - started) * 1000
        try:
            if isinstance(data, dict) and "choices" not in data and data.get("error"):
                raise self._provider_error(data["error"])
            completion, message = _completion(data)
            content = _content(message)
            calls = _tool_calls(message)
        except _Unusable as exc:
            raise self._unusable(str(exc)) from None
        model = completion.get("model")
        finish = completion["choices"][0].get("finish_reason")
        return ModelReply(
            content=self._scrub.text(content),
            tool_calls=calls,
            usage=_usage(completion.get("usage")),
            model=model if isinstance(model, str) and model else self.model,
            latency_ms=latency_ms,
            finish_reason=finish if isinstance(finish, str) else None,
        )

    def _overflow(self, message: str) -> ContextOverflow:
        return ContextOverflow(
            self._scrub.text(message),
            "This message alone is too long for the model's context window, even"
            " after starting a fresh phase. Please send something shorter.",
        )

    def _failed(self, exc: Exception) -> ModelError:
        """The ModelError for an exception of the SDK or its transport (never raw)."""
        import openai

        if isinstance(exc, openai.APIStatusError):
            if is_context_overflow(exc):
                return self._overflow(_error_fields(exc)[2])
            return ModelError(
                self._scrub.text(
                    f"model request failed: HTTP {exc.status_code}: {_error_fields(exc)[2]}"
                ),
                _status_message(exc.status_code),
            )
        if isinstance(exc, openai.APITimeoutError):
            if _dropped_connection(exc):
                return ModelError(
                    f"cannot reach the model endpoint: {exc.__cause__}",
                    "I could not reach the model service. Please try again in a moment.",
                )
            return ModelError(
                "model request timed out", "The model took too long to answer. Please try again."
            )
        if isinstance(exc, openai.APIConnectionError):
            return ModelError(
                f"cannot reach the model endpoint: {exc}",
                "I could not reach the model service. Please try again in a moment.",
            )
        if isinstance(
            exc, json.JSONDecodeError | UnicodeDecodeError | openai.APIResponseValidationError
        ):
            # A body that says it is JSON and is not (the SDK's json() raised).
            return self._unusable("a body that is not valid JSON")
        # Anything else from the SDK or its transport (e.g. aiohttp refuses user-info in the
        # URL next to our Authorization header).
        return ModelError(
            self._scrub.text(
                f"model request to {public_url(self.base_url)} failed: {type(exc).__name__}: {exc}"
            ),
            "The model request failed. The operator needs to check OPENAI_BASE_URL and the logs.",
        )

    def _unusable(self, what: str) -> ModelError:
        """The error for a 200 answer that is no chat completion: it names the endpoint
        (without credentials) so the operator sees which setting is wrong."""
        return ModelError(
            f"the model endpoint {public_url(self.base_url)} answered with {what}, not a chat"
            " completion: check OPENAI_BASE_URL (and BUB_MODEL)",
            UNUSABLE_MESSAGE,
        )

    def _provider_error(self, error: Any) -> ModelError:
        """An error object in a 200 answer (some gateways report upstream failures so)."""
        message = error.get("message") if isinstance(error, dict) else error
        if not isinstance(message, str):
            message = json.dumps(message)
        return ModelError(
            self._scrub.text(
                f"the model endpoint {public_url(self.base_url)} answered 200 with an error:"
                f" {message[:500]}"
            ),
            "The model service reported an error. Please try again in a moment.",
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
