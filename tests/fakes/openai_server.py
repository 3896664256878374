"""A fake OpenAI-compatible chat-completions server for tests (loopback only).

Usage::

    async with FakeOpenAI() as fake:
        fake.script(text("hi"), tool_calls([("lookup", {"q": "x"})]), overflow_vllm())
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        ...
        assert fake.last_messages()[-1]["role"] == "user"

Scripted replies are consumed FIFO; when the queue is empty ``fake.default(body)`` answers
(built-in: ``echo: <last user message>``).

Streaming: a request with ``stream: true`` gets server-sent events (word by word, usage in
the last chunk when ``stream_options.include_usage`` asks). ``streamed(reply, chunks=20,
seconds=4)`` paces a reply's text over time; ``broken(reply, after=3)`` drops the connection
mid-stream; ``stream_error(body, after=2)`` ends the stream with an error event;
``fake.refuse_stream = "400" | "stream_options" | "json"`` makes the server refuse streaming
(a 400 naming ``stream``, a 400 naming ``stream_options``, or a plain JSON answer). Every
streamed response is logged in ``fake.streams`` with the times its chunks went out.
``endless()`` is a model that never finishes (a stream that goes on, a plain answer that
trickles in).
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import itertools
import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
_BODY = web.RequestKey("body", dict)


@dataclass
class Recorded:
    """One request as the server saw it (header names lower-cased)."""

    body: dict[str, Any]
    headers: dict[str, str]
    path: str = COMPLETIONS_PATH


@dataclass
class TextReply:
    """An assistant text answer."""

    content: str
    usage: dict[str, Any] | None = None


@dataclass
class ToolCallsReply:
    """An assistant answer with tool calls; ``arguments`` may be a dict or a raw string."""

    calls: list[tuple[str, dict[str, Any] | str]]
    content: str | None = None
    usage: dict[str, Any] | None = None


@dataclass
class ErrorReply:
    """An HTTP error with a JSON body."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RawReply:
    """Any status with a body sent as it is (HTML, broken JSON, JSON of the wrong shape)."""

    body: bytes
    content_type: str
    status: int = 200


@dataclass
class SlowReply:
    """Wait ``seconds`` before answering with ``reply``."""

    reply: Reply
    seconds: float


@dataclass
class DropReply:
    """Close the connection without sending any response."""


@dataclass
class EndlessReply:
    """A model that never finishes: a streamed request gets a chunk of text (or, with
    ``comments``, only a keep-alive comment) every ``every`` seconds; a plain request gets its
    headers and then a byte of JSON whitespace every ``every`` seconds. After ``limit``
    seconds (a safety net) it finishes with ``text`` after all. ``cut``: the client hung up
    first; ``chunks``: how many pieces went out."""

    every: float = 0.05
    comments: bool = False
    limit: float = 10.0
    text: str = "finished after all"
    cut: bool = False
    chunks: int = 0


@dataclass
class StreamPlan:
    """How a streamed answer goes out (a plain request gets ``reply`` as usual).

    ``chunks``: the text in this many pieces (None: word by word); ``seconds``: spread over
    this long; ``reasoning``: ``reasoning_content`` deltas first; ``break_after``: drop the
    connection after this many chunks; ``error``: after ``break_after`` chunks (or all of
    them) send this error object as an event instead of finishing."""

    reply: TextReply | ToolCallsReply
    chunks: int | None = None
    seconds: float = 0.0
    reasoning: str | None = None
    break_after: int | None = None
    error: dict[str, Any] | None = None


@dataclass
class StreamLog:
    """One streamed response: when each chunk with text or a tool call went out
    (``time.monotonic()``), and the text so far after each."""

    times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    completed: bool = False
    ended: float = 0.0
    """When the last chunk (the finish, before `[DONE]`) went out."""
    user: str = ""
    """The last user message of the request (to tell concurrent streams apart)."""

    @property
    def first(self) -> float:
        return self.times[0]

    @property
    def last(self) -> float:
        return self.times[-1]


Reply = (
    TextReply
    | ToolCallsReply
    | ErrorReply
    | RawReply
    | SlowReply
    | DropReply
    | StreamPlan
    | EndlessReply
)


def text(content: str, usage: dict[str, Any] | None = None) -> TextReply:
    """Plain assistant text; ``usage`` overrides the estimated usage block."""
    return TextReply(content, usage)


def tool_calls(
    calls: Iterable[tuple[str, dict[str, Any] | str]],
    content: str | None = None,
    usage: dict[str, Any] | None = None,
) -> ToolCallsReply:
    """Tool calls as ``[(name, args), ...]``; a ``str`` args is sent verbatim (bad JSON)."""
    return ToolCallsReply(list(calls), content, usage)


def error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> ErrorReply:
    """Any HTTP error status with the given JSON body."""
    return ErrorReply(status, body, dict(headers or {}))


def _err(message: str, type_: str | None, code: Any, param: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def rate_limited(retry_after: float | None = 1, retry_after_ms: int | None = None) -> ErrorReply:
    """429 ``rate_limit_exceeded`` with ``Retry-After`` and/or ``retry-after-ms`` headers."""
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    msg = (
        "Rate limit reached for gpt-4o-mini in organization org-fake on requests per min (RPM): "
        f"Limit 3, Used 3, Requested 1. Please try again in {retry_after or 1}s."
    )
    return ErrorReply(429, _err(msg, "requests", "rate_limit_exceeded"), headers)


def server_error(status: int = 500) -> ErrorReply:
    """A 5xx as OpenAI sends it."""
    msg = "The server had an error while processing your request. Sorry about that!"
    return ErrorReply(status, _err(msg, "server_error", None))


def raw(
    body: str | bytes | Any, content_type: str = "application/json", status: int = 200
) -> RawReply:
    """A reply with this exact body: a str/bytes goes out as is, anything else as JSON."""
    if isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode("utf-8")
    return RawReply(data, content_type, status)


HTML_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Welcome | Example Corp</title></head>
<body><h1>Welcome to Example Corp</h1><p>This is not the API you are looking for.</p></body>
</html>
"""


def html_page(status: int = 200) -> RawReply:
    """What a mis-set OPENAI_BASE_URL gives: a web site's HTML page, answered with 200.
    For every request: ``fake.default = lambda body: html_page()``."""
    return raw(HTML_PAGE, "text/html; charset=utf-8", status)


def slow(reply: Reply, seconds: float) -> SlowReply:
    """Delay ``seconds`` before answering with ``reply``."""
    return SlowReply(reply, seconds)


def endless(every: float = 0.05, comments: bool = False, limit: float = 10.0) -> EndlessReply:
    """A model that keeps streaming (or trickles a plain answer) for ``limit`` seconds; keep
    the object to look at ``cut`` and ``chunks``."""
    return EndlessReply(every, comments, limit)


def drop() -> DropReply:
    """Close the connection without a response (client sees a connection error)."""
    return DropReply()


def streamed(
    reply: TextReply | ToolCallsReply,
    chunks: int | None = None,
    seconds: float = 0.0,
    reasoning: str | None = None,
) -> StreamPlan:
    """Stream ``reply`` in ``chunks`` pieces spread over ``seconds`` (to a plain request:
    ``reply`` as usual)."""
    return StreamPlan(reply, chunks, seconds, reasoning)


def broken(
    reply: TextReply | ToolCallsReply, after: int = 3, chunks: int | None = None
) -> StreamPlan:
    """A stream that drops the connection after ``after`` chunks."""
    return StreamPlan(reply, chunks, break_after=after)


def stream_error(
    body: dict[str, Any], after: int = 0, reply: TextReply | ToolCallsReply | None = None
) -> StreamPlan:
    """A stream that sends ``after`` chunks of ``reply`` and then the error event ``body``
    (an ``{"error": {...}}`` object, e.g. ``overflow_openai().body``)."""
    error = body.get("error", body)
    return StreamPlan(reply or text(""), None, break_after=after, error=error)


def overflow_openai() -> ErrorReply:
    """OpenAI's classic context-length error."""
    msg = (
        "This model's maximum context length is 4097 tokens. However, your messages resulted in "
        "4294 tokens. Please reduce the length of the messages."
    )
    return ErrorReply(
        400, _err(msg, "invalid_request_error", "context_length_exceeded", "messages")
    )


def overflow_vllm() -> ErrorReply:
    """vLLM's context-length error (numeric ``code``)."""
    msg = (
        "This model's maximum context length is 32768 tokens. However, your request has 40000 "
        "input tokens. Please reduce the length of the input messages."
    )
    return ErrorReply(400, _err(msg, "BadRequestError", 400))


def overflow_llamacpp() -> ErrorReply:
    """llama.cpp server's ``exceed_context_size_error``."""
    msg = "request (36017 tokens) exceeds the available context size (32768 tokens), try increasing it"
    body = {"code": 400, "message": msg, "type": "exceed_context_size_error"}
    return ErrorReply(400, {"error": {**body, "n_prompt_tokens": 36017, "n_ctx": 32768}})


def overflow_anthropic() -> ErrorReply:
    """Anthropic's (OpenAI-compat) ``prompt is too long``."""
    msg = "prompt is too long: 208310 tokens > 200000 maximum"
    return ErrorReply(400, {"error": {"type": "invalid_request_error", "message": msg}})


def overflow_openrouter() -> ErrorReply:
    """OpenRouter's context-length error."""
    msg = (
        "This endpoint's maximum context length is 32768 tokens. However, you requested about "
        "42832 tokens (42832 of text input). Please reduce the length of either one, or use the "
        '"middle-out" transform to compress your prompt automatically.'
    )
    return ErrorReply(400, {"error": {"message": msg, "code": 400}, "user_id": "user_fake"})


def overflow_new_openai() -> ErrorReply:
    """Newer OpenAI models' ``Input tokens exceed the configured limit`` wording."""
    msg = (
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in "
        "3148588 tokens. Please reduce the length of the messages."
    )
    return ErrorReply(
        400, _err(msg, "invalid_request_error", "context_length_exceeded", "messages")
    )


def overflow_413() -> ErrorReply:
    """A proxy's 413 with a bare body."""
    return ErrorReply(413, {"error": {"message": "Request Entity Too Large"}})


def bad_tool_schema() -> ErrorReply:
    """A 400 that is *not* an overflow: invalid tool schema."""
    msg = (
        "Invalid schema for function 'x': In context=(), 'required' is required to be supplied "
        "and to be an array including every key in properties. Missing 'y'."
    )
    return ErrorReply(
        400,
        _err(msg, "invalid_request_error", "invalid_function_parameters", "tools[0].function"),
    )


def _content_text(content: Any) -> str:
    """String content as-is; list content -> joined text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def echo_default(body: dict[str, Any]) -> Reply:
    """Built-in default: ``echo: <content of last user message>``."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return text("echo: " + (_content_text(users[-1].get("content")) if users else ""))


def _prompt_tokens(messages: list[dict[str, Any]]) -> int:
    chars = 0
    for m in messages:
        chars += len(_content_text(m.get("content")))
        for tc in m.get("tool_calls") or []:
            chars += len(str(tc.get("function", {}).get("arguments", "")))
    return chars // 4


class FakeOpenAI:
    """The fake server. ``async with FakeOpenAI() as fake`` or ``await start()/stop()``."""

    def __init__(
        self,
        models: Iterable[str] = ("gpt-4o-mini", "fake-model"),
        *,
        auth_key: str | None = None,
        latency: float = 0.0,
    ) -> None:
        self.models: set[str] = set(models)
        self.auth_key = auth_key
        self.latency = latency
        self.requests: list[Recorded] = []
        self.streams: list[StreamLog] = []
        self.refuse_stream: str | None = None
        """None, "400", "stream_options" (a 400 when it is present) or "json" (ignore)."""
        self.default: Callable[[dict[str, Any]], Reply] = echo_default
        self.base_url = ""
        self._queue: deque[Reply] = deque()
        self._ids = itertools.count(1)
        self._call_ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.transcripts: dict[bytes, str] = {}
        """Audio bytes -> the transcript `/v1/audio/transcriptions` answers (else a default
        naming the size)."""
        self.transcriptions: list[tuple[str, str, bytes]] = []
        """(model, file name, bytes) of every transcription request."""
        self.transcribe_failures = 0
        """Answer the next N transcription requests with a 500."""
        self.transcribe_missing = False
        """Answer transcription requests with a 404 (a provider without the endpoint)."""

    def script(self, *replies: Reply) -> None:
        """Append replies to the FIFO queue."""
        self._queue.extend(replies)

    def completion_requests(self) -> list[Recorded]:
        """Recorded chat-completion requests only."""
        return [r for r in self.requests if r.path == COMPLETIONS_PATH]

    def last_messages(self) -> list[dict[str, Any]]:
        """``messages`` of the last chat-completion request."""
        return self.completion_requests()[-1].body.get("messages", [])

    async def start(self) -> None:
        """Bind 127.0.0.1 on a free port and serve."""
        app = web.Application(middlewares=[self._record_and_auth])
        app.router.add_post(COMPLETIONS_PATH, self._completions)
        app.router.add_get(MODELS_PATH, self._list_models)
        app.router.add_post(TRANSCRIPTIONS_PATH, self._transcriptions)
        self._runner = web.AppRunner(
            app, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @web.middleware
    async def _record_and_auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(Recorded(body, headers, request.path))
        request[_BODY] = body
        if self.auth_key is not None and headers.get("authorization") != f"Bearer {self.auth_key}":
            msg = "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
            return web.json_response(
                _err(msg, "invalid_request_error", "invalid_api_key"), status=401
            )
        return await handler(request)

    async def _transcriptions(self, request: web.Request) -> web.Response:
        """OpenAI's multipart transcription request: fields `model` and `file`."""
        if self.transcribe_missing:
            return web.json_response(_err("Not found", "invalid_request_error", None), status=404)
        if self.transcribe_failures > 0:
            self.transcribe_failures -= 1
            return web.json_response(_err("overloaded", "server_error", None), status=500)
        raw = await request.read()
        head = f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode()
        parsed = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
        fields: dict[str, tuple[str, bytes]] = {}
        for part in parsed.iter_parts():
            name = part.get_param("name", header="content-disposition") or ""
            fields[str(name)] = (part.get_filename() or "", part.get_payload(decode=True) or b"")
        model = fields.get("model", ("", b""))[1].decode()
        filename, data = fields.get("file", ("", b""))
        if not data or not model:
            return web.json_response(
                _err("file and model required", "invalid_request_error", None), status=400
            )
        self.transcriptions.append((model, filename, data))
        return web.json_response(
            {"text": self.transcripts.get(data, f"words of {len(data)} bytes")}
        )

    async def _list_models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
            for m in sorted(self.models)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = request[_BODY]
        model = body.get("model")
        if model not in self.models:
            msg = f"The model `{model}` does not exist or you do not have access to it."
            return web.json_response(
                _err(msg, "invalid_request_error", "model_not_found"), status=404
            )
        if self.latency:
            await asyncio.sleep(self.latency)
        wants_stream = bool(body.get("stream"))
        if wants_stream and self.refuse_stream in ("400", "stream_options"):
            if self.refuse_stream == "400":
                msg = "stream is not supported by this server"
                return web.json_response(
                    _err(msg, "invalid_request_error", None, "stream"), status=400
                )
            if "stream_options" in body:
                msg = "Unrecognized request argument supplied: stream_options"
                return web.json_response(_err(msg, "invalid_request_error", None), status=400)
        if self.refuse_stream == "json":
            wants_stream = False
        reply = self._queue.popleft() if self._queue else self.default(body)
        while isinstance(reply, SlowReply):
            await asyncio.sleep(reply.seconds)
            reply = reply.reply
        plan = reply if isinstance(reply, StreamPlan) else None
        if plan is not None:
            reply = plan.reply
        if isinstance(reply, EndlessReply):
            return await _endless(request, reply, wants_stream, model)
        if isinstance(reply, DropReply):
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError  # aiohttp drops the request quietly
        if isinstance(reply, ErrorReply):
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        if isinstance(reply, RawReply):
            return web.Response(
                body=reply.body, status=reply.status, headers={"Content-Type": reply.content_type}
            )
        message, finish = self._message(reply)
        completion_chars = len(message.get("content") or "") + sum(
            len(tc["function"]["arguments"]) for tc in message.get("tool_calls", [])
        )
        completion = max(1, completion_chars // 4)
        prompt = _prompt_tokens(body.get("messages", []))
        usage = reply.usage or {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        head = {
            "id": f"chatcmpl-fake{next(self._ids)}",
            "created": int(time.time()),
            "model": model,
        }
        if wants_stream:
            return await self._stream(request, head, message, finish, usage, plan)
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return web.json_response(
            {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        )

    def _message(self, reply: TextReply | ToolCallsReply) -> tuple[dict[str, Any], str]:
        if isinstance(reply, TextReply):
            return {"role": "assistant", "content": reply.content, "refusal": None}, "stop"
        calls = [
            {
                "id": f"call_{next(self._call_ids)}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for name, args in reply.calls
        ]
        msg = {"role": "assistant", "content": reply.content, "refusal": None, "tool_calls": calls}
        return msg, "tool_calls"

    async def _stream(
        self,
        request: web.Request,
        head: dict[str, Any],
        message: dict[str, Any],
        finish: str,
        usage: dict[str, Any],
        plan: StreamPlan | None = None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with_usage = bool((request[_BODY].get("stream_options") or {}).get("include_usage"))
        extra = {"usage": None} if with_usage else {}
        deltas = list(_deltas(message, finish, plan.chunks if plan else None))
        if plan is not None and plan.reasoning:
            thoughts = [{"reasoning_content": w} for w in re.findall(r"\S+\s*", plan.reasoning)]
            deltas[1:1] = [(d, None) for d in thoughts]
        users = [m for m in request[_BODY].get("messages", []) if m.get("role") == "user"]
        log = StreamLog(user=_content_text(users[-1].get("content")) if users else "")
        self.streams.append(log)
        pause = plan.seconds / max(1, len(deltas) - 1) if plan and plan.seconds else 0.0
        sent_text = ""
        for n, (delta, fin) in enumerate(deltas):
            if plan is not None and plan.break_after is not None and n >= plan.break_after:
                if plan.error is not None:
                    await resp.write(f"data: {json.dumps({'error': plan.error})}\n\n".encode())
                    await resp.write_eof()
                    return resp
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError  # the client sees the connection drop
            if pause and n:
                await asyncio.sleep(pause)
            choice = {"index": 0, "delta": delta, "finish_reason": fin, "logprobs": None}
            chunk = {**head, "object": "chat.completion.chunk", "choices": [choice], **extra}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if delta.get("content") or delta.get("tool_calls"):
                sent_text += delta.get("content") or ""
                log.times.append(time.monotonic())
                log.texts.append(sent_text)
            if fin is not None:
                log.ended = time.monotonic()
        if plan is not None and plan.error is not None:
            await resp.write(f"data: {json.dumps({'error': plan.error})}\n\n".encode())
            await resp.write_eof()
            return resp
        if with_usage:
            chunk = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        log.completed = True
        return resp


async def _endless(
    request: web.Request, reply: EndlessReply, stream: bool, model: Any
) -> web.StreamResponse:
    kind = "text/event-stream" if stream else "application/json"
    resp = web.StreamResponse(headers={"Content-Type": kind})
    await resp.prepare(request)
    head = {"id": "chatcmpl-endless", "created": int(time.time()), "model": model}
    until = time.monotonic() + reply.limit
    try:
        while time.monotonic() < until:
            if not stream:
                piece = b" "
            elif reply.comments:
                piece = b": keep-alive\n\n"
            else:
                choice = {"index": 0, "delta": {"content": "la "}, "finish_reason": None}
                piece = f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode()
            await resp.write(piece)
            reply.chunks += 1
            await asyncio.sleep(reply.every)
    except (asyncio.CancelledError, ConnectionError):
        reply.cut = True
        raise
    message = {"role": "assistant", "content": reply.text}
    if stream:
        choice = {"index": 0, "delta": message, "finish_reason": "stop"}
        await resp.write(f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
    else:
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        completion = {**head, "object": "chat.completion", "choices": [choice]}
        await resp.write(json.dumps(completion).encode())
    await resp.write_eof()
    return resp


def _deltas(
    message: dict[str, Any], finish: str, chunks: int | None = None
) -> Iterator[tuple[dict[str, Any], str | None]]:
    """Split a full assistant message into streaming deltas, as OpenAI does (the text word by
    word, or in ``chunks`` pieces of about equal length)."""
    content = message.get("content")
    calls = message.get("tool_calls", [])
    yield {"role": "assistant", "content": "" if content is not None or not calls else None}, None
    if chunks and content:
        size = -(-len(content) // chunks)
        pieces = [content[i : i + size] for i in range(0, len(content), size)]
    else:
        pieces = re.findall(r"\S+\s*|\s+", content or "")
    for piece in pieces:
        yield {"content": piece}, None
    for i, tc in enumerate(calls):
        fn = tc["function"]
        first = {"name": fn["name"], "arguments": ""}
        yield (
            {"tool_calls": [{"index": i, "id": tc["id"], "type": "function", "function": first}]},
            None,
        )
        args, half = fn["arguments"], len(fn["arguments"]) // 2
        for part in (args[:half], args[half:]):
            if part:
                yield {"tool_calls": [{"index": i, "function": {"arguments": part}}]}, None
    yield {}, finish
