"""The model client: chat completions through the official openai SDK, any compatible server.

Plain or streamed (when someone watches the step); what an answer must hold is checked in
`answers`, streamed answers are assembled in `streaming`, errors are read in `model_errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import DEFAULT_OPENAI_BASE_URL, Settings
from ..secrets import Scrubber
from .answers import (
    Unusable,
    completion_of,
    content_of,
    decoded,
    public_url,
    tool_calls_of,
    usage_of,
)
from .model_errors import (
    TIMED_OUT_MESSAGE,
    UNREACHABLE_MESSAGE,
    UNUSABLE_MESSAGE,
    ContextOverflow,
    ModelError,
    dropped_connection,
    error_fields,
    is_context_overflow,
    is_overflow_error,
    refuses_streaming,
    status_message,
)
from .streaming import (
    Assembler,
    ProgressCallback,
    StreamBroken,
    StreamErrorEvent,
    Watch,
    events,
)

if TYPE_CHECKING:
    import openai

__all__ = [
    "UNUSABLE_MESSAGE",
    "ContextOverflow",
    "ModelClient",
    "ModelError",
    "ModelReply",
    "is_context_overflow",
    "public_url",
]

log = logging.getLogger(__name__)

# The openai SDK takes about a second to import: it is not imported at start-up so `bub-bot
# serve` reports ready (and sends Telegram's first poll) sooner. `serve` then loads it in a
# worker thread (`ModelClient.preload`); imported on the loop at the first call instead, it
# would stall every conversation the event loop serves for that second.
SDK_MODULES = ("openai",)
# What the SDK's httpx transport still imports at its first request (see
# tests/sdk_preload_child.py, which prints what a first turn imports): loaded too when present.
TRANSPORT_MODULES = ("httpcore2", "httpcore", "h11", "anyio.streams.tls", "truststore")


class _Fallback(Exception):
    """A streamed request did not give an answer: ask once more without streaming."""


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
        self._preload: asyncio.Future[Any] | None = None
        """The SDK's import in a worker thread (`preload`), awaited by the first call."""

    def preload(self) -> asyncio.Future[Any] | None:
        """Import the SDK in a worker thread now, off the event loop, so the first model
        call finds it loaded (None when it already is). Calls made meanwhile wait for it."""
        if self._client is not None or self._preload is not None:
            return self._preload
        if all(name in sys.modules for name in SDK_MODULES):
            return None

        def load() -> None:
            for name in SDK_MODULES:
                importlib.import_module(name)
            for name in TRANSPORT_MODULES:
                with contextlib.suppress(ImportError):  # another SDK build, another transport
                    importlib.import_module(name)

        self._preload = asyncio.ensure_future(asyncio.to_thread(load))
        return self._preload

    async def _sdk_ready(self) -> None:
        """Wait for a preload still running (a failed one leaves the import to `client`)."""
        loading = self._preload
        if loading is not None and not loading.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(loading)

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
        if self._preload is not None and not self._preload.done():
            with contextlib.suppress(Exception):
                await self._preload  # a thread cannot be cancelled: let it finish
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
        model: str | None = None,
    ) -> ModelReply:
        """One chat completion (with `model`, or BUB_MODEL when None). Raises ContextOverflow or ModelError (never SDK exceptions).

        With `on_progress` (and BUB_STREAM on) the answer is streamed and `on_progress` sees
        the text as it grows. A server that refuses to stream, or a stream that breaks, gets
        one non-streamed request instead (after `Progress("reset")` if anything was shown);
        a server that refused is not asked to stream again by this process.

        The whole call ends within `timeout` (default BUB_MODEL_TIMEOUT_SECONDS), retries and
        a fallback request included; past it: ModelError, after `Progress("reset")` if
        anything was shown.
        """
        body: dict[str, Any] = {"model": model or self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        limit = max_tokens or self.max_tokens
        if limit:
            body["max_tokens"] = limit
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        # The SDK's timeout bounds each read, so a stream that keeps sending (or a body that
        # trickles in) would hold the turn, and the session's lease, for ever: the whole step
        # (the SDK's retries and their waits, a fallback request included) has a deadline.
        deadline = self._settings.model_timeout_seconds if timeout is None else timeout
        watch = Watch(on_progress) if on_progress is not None else None
        bound = asyncio.timeout(deadline)
        try:
            async with bound:
                await self._sdk_ready()
                if watch is not None and self.streaming:
                    try:
                        return await self._streamed(body, options, watch)
                    except _Fallback as exc:
                        log.warning(
                            "model.stream_fallback base_url=%s: %s", public_url(self.base_url), exc
                        )
                        watch.take_back()  # the plain request answers it again
                return await self._plain(body, options)
        except TimeoutError:
            if not bound.expired():
                raise
            if watch is not None:
                watch.take_back()  # the channel takes back what it showed; no fallback request
            raise ModelError(
                f"model request timed out: no whole answer within {deadline:g} s",
                TIMED_OUT_MESSAGE,
            ) from None

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
        self, body: dict[str, Any], options: dict[str, Any], watch: Watch
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
            if not is_context_overflow(exc) and refuses_streaming(exc):
                message = error_fields(exc)[2]
                if "stream_options" in message or "include_usage" in message:
                    self._stream_usage = False  # streams, but not with usage
                else:
                    self._stream_refused = True
                raise _Fallback(
                    self._scrub.text(f"HTTP {exc.status_code}: {message[:300]}")
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
                return self._reply(decoded(await response.aread()), started)
            assembler = Assembler(self._scrub, watch)
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
                calls = tool_calls_of({"tool_calls": parts.tool_calls})
            except StreamErrorEvent as exc:
                if is_overflow_error(exc.error):
                    watch.take_back()  # the retry after a handoff follows
                    raise self._overflow(str(exc)) from None
                raise _Fallback(
                    self._scrub.text(f"an error event in the stream: {str(exc)[:300]}")
                ) from None
            except (StreamBroken, Unusable) as exc:
                raise _Fallback(str(exc)) from None
            except (ModelError, asyncio.CancelledError):
                raise
            except Exception as exc:
                if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
                    # No data for the whole timeout: asking again would only wait as long.
                    raise ModelError(
                        "model stream timed out",
                        TIMED_OUT_MESSAGE,
                    ) from exc
                # The connection broke mid-way.
                raise _Fallback(f"the stream broke: {type(exc).__name__}") from None
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        model = parts.model
        return ModelReply(
            content=parts.content,
            tool_calls=calls,
            usage=usage_of(parts.usage),
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
            completion, message = completion_of(data)
            content = content_of(message)
            calls = tool_calls_of(message)
        except Unusable as exc:
            raise self._unusable(str(exc)) from None
        model = completion.get("model")
        finish = completion["choices"][0].get("finish_reason")
        return ModelReply(
            content=self._scrub.text(content),
            tool_calls=calls,
            usage=usage_of(completion.get("usage")),
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
                return self._overflow(error_fields(exc)[2])
            return ModelError(
                self._scrub.text(
                    f"model request failed: HTTP {exc.status_code}: {error_fields(exc)[2]}"
                ),
                status_message(exc.status_code),
            )
        if isinstance(exc, openai.APITimeoutError):
            if dropped_connection(exc):
                return ModelError(
                    f"cannot reach the model endpoint: {exc.__cause__}",
                    UNREACHABLE_MESSAGE,
                )
            return ModelError("model request timed out", TIMED_OUT_MESSAGE)
        if isinstance(exc, openai.APIConnectionError):
            return ModelError(
                f"cannot reach the model endpoint: {exc}",
                UNREACHABLE_MESSAGE,
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
