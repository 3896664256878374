"""The model client streaming (the real openai SDK against the fake server's SSE): text and
tool-call deltas assembled into the same ModelReply, progress as the text grows, secrets
scrubbed before anything is reported, and every way a server can refuse or break a stream."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from bub_bot.agent import AUTO_HANDOFF_ANCHOR, ContextOverflow, ModelClient, ModelError, Progress
from bub_bot.agent.streaming import ScrubbedText
from bub_bot.secrets import REDACTED, Scrubber
from tests.fakes.openai_server import (
    FakeOpenAI,
    broken,
    html_page,
    overflow_llamacpp,
    overflow_openai,
    raw,
    server_error,
    stream_error,
    streamed,
    text,
    tool_calls,
)

USER = [{"role": "user", "content": "hello"}]
KEY = "sk-proj-SECRETkeyNEVERshown42"


class Watcher:
    """Records progress with the time it was reported."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Progress]] = []

    def __call__(self, progress: Progress) -> None:
        self.seen.append((time.monotonic(), progress))

    def kinds(self) -> list[str]:
        return [p.kind for _, p in self.seen]

    def texts(self) -> list[str]:
        return [p.text for _, p in self.seen if p.kind == "text"]


def sse(*chunks: Any, done: bool = True) -> bytes:
    """A raw event-stream body from chunk objects (a str goes out as it is)."""
    out = []
    for chunk in chunks:
        if isinstance(chunk, str) and chunk.startswith(":"):
            out.append(f"{chunk}\n\n")  # a comment line
            continue
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        out.append(f"data: {data}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "model": "fake-model",
        "choices": [{"index": 0, "delta": fields, "finish_reason": finish}],
    }


@pytest.fixture
async def client(settings):
    made: list[ModelClient] = []

    def make(**overrides: Any) -> ModelClient:
        built = ModelClient(settings(**overrides))
        made.append(built)
        return built

    yield make
    for built in made:
        await built.close()


async def test_streamed_text_grows_and_ends_as_the_same_reply(fake_openai: FakeOpenAI, client):
    answer = "The quick brown fox jumps over the lazy dog, twice."
    fake_openai.script(streamed(text(answer), chunks=10, seconds=0.3))
    watch = Watcher()
    reply = await client().complete(USER, on_progress=watch)
    body = fake_openai.completion_requests()[-1].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert reply.content == answer and reply.tool_calls == [] and reply.finish_reason == "stop"
    assert reply.usage["completion_tokens"] > 0 and reply.extra == {"streamed": True}
    [log] = fake_openai.streams
    assert watch.texts() == log.texts and len(log.texts) > 5  # every chunk, as it came
    assert log.texts[-1] == answer
    # Causality: the first text was reported before the server sent its last chunk.
    assert watch.seen[0][0] < log.last


async def test_plain_request_without_a_watcher(fake_openai: FakeOpenAI, client):
    reply = await client().complete(USER)
    assert reply.content == "echo: hello"
    assert "stream" not in fake_openai.completion_requests()[-1].body
    off = client(stream=False)
    await off.complete(USER, on_progress=Watcher())
    assert "stream" not in fake_openai.completion_requests()[-1].body


async def test_tool_calls_assembled_from_deltas(fake_openai: FakeOpenAI, client):
    fake_openai.script(
        streamed(tool_calls([("fs.read", {"path": "a.txt"}), ("fs.list", {})], content="Looking"))
    )
    watch = Watcher()
    reply = await client().complete(USER, on_progress=watch)
    assert reply.content == "Looking" and reply.finish_reason == "tool_calls"
    assert [c["function"] for c in reply.tool_calls] == [
        {"name": "fs.read", "arguments": '{"path": "a.txt"}'},
        {"name": "fs.list", "arguments": "{}"},
    ]
    assert [c["id"] for c in reply.tool_calls] == ["call_1", "call_2"]
    tools = [p.tools for _, p in watch.seen if p.kind == "tools"]
    assert tools == [("fs.read",), ("fs.read", "fs.list")]


async def test_lenient_stream_shapes(fake_openai: FakeOpenAI, client):
    """No index on tool-call deltas, a name repeated in every delta, content parts, a comment
    line, and a surrogate pair split across two JSON strings."""
    body = sse(
        ": keep-alive",
        delta(role="assistant", content=[{"type": "text", "text": "smile "}]),
        '{"id":"c","choices":[{"index":0,"delta":{"content":"\\ud83d"},"finish_reason":null}]}',
        '{"id":"c","choices":[{"index":0,"delta":{"content":"\\ude00"},"finish_reason":null}]}',
        delta(tool_calls=[{"id": "t1", "function": {"name": "lookup", "arguments": '{"q"'}}]),
        delta(tool_calls=[{"function": {"name": "lookup", "arguments": ': "x"}'}}]),
        delta("tool_calls"),
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )
    fake_openai.script(raw(body, "text/event-stream"))
    watch = Watcher()
    reply = await client().complete(USER, on_progress=watch)
    assert reply.content == "smile 😀"
    assert all("\ud83d" not in t for t in watch.texts())  # a lone half is never shown
    assert reply.tool_calls == [
        {"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    ]
    assert reply.usage == {"prompt_tokens": 3, "completion_tokens": 2}


async def test_reasoning_keeps_working_without_showing_it(fake_openai: FakeOpenAI, client):
    fake_openai.script(streamed(text("Answer."), reasoning="let me think about this"))
    watch = Watcher()
    reply = await client().complete(USER, on_progress=watch)
    assert reply.content == "Answer."
    assert watch.kinds()[0] == "thinking" and watch.kinds().count("thinking") == 1
    assert all("think" not in t for t in watch.texts())


async def test_a_secret_split_across_deltas_is_never_shown(fake_openai: FakeOpenAI, client):
    answer = f"Here it is: {KEY} and again {KEY}."
    fake_openai.script(streamed(text(answer), chunks=len(answer)))  # one character a chunk
    watch = Watcher()
    reply = await client(openai_api_key=KEY).complete(USER, on_progress=watch)
    assert reply.content == f"Here it is: {REDACTED} and again {REDACTED}."
    for shown in watch.texts():
        assert KEY[:8] not in shown, shown
    assert watch.texts()[-1] in (reply.content, reply.content[:-1])
    assert reply.content.startswith(watch.texts()[-1])


async def test_broken_stream_falls_back_to_one_plain_request(fake_openai: FakeOpenAI, client):
    fake_openai.script(broken(text("partial answer that breaks"), after=3), text("whole answer"))
    watch = Watcher()
    model = client()
    reply = await model.complete(USER, on_progress=watch)
    assert reply.content == "whole answer"
    first, second = fake_openai.completion_requests()
    assert first.body.get("stream") is True and "stream" not in second.body
    assert watch.kinds()[-1] == "reset" and "text" in watch.kinds()
    assert model.streaming  # a break is not a refusal: the next step streams again
    await model.complete(USER, on_progress=watch)
    assert fake_openai.completion_requests()[-1].body.get("stream") is True


async def test_stream_without_a_finish_falls_back(fake_openai: FakeOpenAI, client):
    fake_openai.script(raw(sse(delta(content="cut sho"), done=False), "text/event-stream"))
    reply = await client().complete(USER, on_progress=Watcher())
    assert reply.content == "echo: hello"  # the plain request's answer
    assert len(fake_openai.completion_requests()) == 2


@pytest.mark.parametrize("mode", ["400", "json"])
async def test_a_server_that_refuses_streaming_is_not_asked_again(
    fake_openai: FakeOpenAI, client, mode
):
    fake_openai.refuse_stream = mode
    model = client()
    watch = Watcher()
    first = await model.complete(USER, on_progress=watch)
    second = await model.complete(USER, on_progress=watch)
    assert first.content == second.content == "echo: hello"
    streamed_requests = [r for r in fake_openai.completion_requests() if r.body.get("stream")]
    assert len(streamed_requests) == 1 and not model.streaming
    assert len(fake_openai.completion_requests()) == (3 if mode == "400" else 2)
    assert "reset" not in watch.kinds()  # nothing was shown, nothing to take back


async def test_stream_options_refused_streams_without_usage(fake_openai: FakeOpenAI, client):
    fake_openai.refuse_stream = "stream_options"
    model = client()
    await model.complete(USER, on_progress=Watcher())
    reply = await model.complete(USER, on_progress=Watcher())
    bodies = [r.body for r in fake_openai.completion_requests()]
    assert [b.get("stream") for b in bodies] == [True, None, True]
    assert "stream_options" in bodies[0] and "stream_options" not in bodies[2]
    assert reply.content == "echo: hello" and model.streaming


async def test_an_html_page_to_a_streamed_request_is_an_unusable_answer(
    fake_openai: FakeOpenAI, client
):
    fake_openai.script(html_page())
    with pytest.raises(ModelError) as caught:
        await client().complete(USER, on_progress=Watcher())
    assert "an HTML page" in str(caught.value) and type(caught.value) is ModelError


async def test_http_errors_before_the_stream_are_the_usual_errors(fake_openai: FakeOpenAI, client):
    fake_openai.script(overflow_llamacpp(), server_error(503))
    model = client()
    with pytest.raises(ContextOverflow):
        await model.complete(USER, on_progress=Watcher())
    with pytest.raises(ModelError) as caught:
        await model.complete(USER, on_progress=Watcher())
    assert "503" in str(caught.value) and model.streaming


async def test_overflow_as_an_error_event_inside_the_stream(fake_openai: FakeOpenAI, client):
    fake_openai.script(stream_error(overflow_openai().body, after=2))
    with pytest.raises(ContextOverflow) as caught:
        await client().complete(USER, on_progress=Watcher())
    assert "maximum context length" in str(caught.value)
    assert len(fake_openai.completion_requests()) == 1


async def test_other_error_event_falls_back(fake_openai: FakeOpenAI, client):
    error = {"error": {"message": "upstream overloaded", "type": "server_error"}}
    fake_openai.script(stream_error(error, after=3, reply=text("half of it")), text("all of it"))
    watch = Watcher()
    reply = await client().complete(USER, on_progress=watch)
    assert reply.content == "all of it" and watch.kinds()[-1] == "reset"


# -- the turn loop --------------------------------------------------------------------------
async def test_turn_reports_tools_then_streams_the_answer(fake_openai, agent, tape):
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="Let me look.")),
        streamed(text("There are entries."), chunks=4),
    )
    watch = Watcher()
    result = await agent().run_turn(tape, [{"role": "user", "content": "hi"}], progress=watch)
    assert result.status == "ok" and result.reply == "There are entries."
    kinds = watch.kinds()
    assert kinds.index("tools") < len(kinds) - 1 and kinds[-1] == "text"
    assert watch.texts()[-1] == "There are entries."
    assert [p.tools for _, p in watch.seen if p.kind == "tools"][-1] == ("tape.info",)


async def test_auto_handoff_on_an_overflow_event(fake_openai, agent, tape):
    fake_openai.script(stream_error(overflow_openai().body), streamed(text("fresh answer")))
    result = await agent().run_turn(tape, [{"role": "user", "content": "hi"}], progress=Watcher())
    assert result.status == "ok" and result.auto_handoff and result.reply == "fresh answer"
    anchors = await tape.query(kinds=["anchor"], names=[AUTO_HANDOFF_ANCHOR])
    assert len(anchors) == 1


def test_scrubbed_text_holds_back_what_could_start_a_secret() -> None:
    scrub = Scrubber(["sk-secretvalue1", "sk-secretother2"])
    text_ = ScrubbedText(scrub)
    shown = []
    for ch in "ok sk-secretvalue1 sk-secre and sk-secretother2!":
        text_.add(ch)
        shown.append(text_.text)
    assert all("sk-secretv" not in s and "sk-secreto" not in s for s in shown)
    assert "sk-secre and" in shown[-1]  # a prefix that turned out not to be one is shown
    assert text_.finish() == f"ok {REDACTED} sk-secre and {REDACTED}!"


async def test_sse_with_crlf_and_no_space_after_the_colon(fake_openai: FakeOpenAI, client):
    body = (
        'data:{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\r\n\r\n'
        'event: message\r\ndata: {"id":"c","choices":[{"index":0,"delta":{"content":"b"},'
        '"finish_reason":"stop"}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    )
    fake_openai.script(raw(body, "text/event-stream"))
    reply = await client().complete(USER, on_progress=Watcher())
    assert reply.content == "ab" and len(fake_openai.completion_requests()) == 1
