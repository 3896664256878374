"""A model step has a deadline (BUB_MODEL_TIMEOUT_SECONDS, or the `timeout` of the call): a
model that streams for ever, one that only sends keep-alive comments, a plain answer that
trickles in, and the SDK's retries all end in the same ModelError, with no fallback request,
and what a stream showed is taken back.

The fake model ends these answers after `limit` seconds: without the deadline the calls
below return that answer instead of raising."""

from __future__ import annotations

import asyncio
from typing import Any

import openai  # noqa: F401  (imported up front: see `client`)
import pytest

from bub_bot.agent import ContextOverflow, ModelClient, ModelError, Progress
from tests.fakes.openai_server import (
    FakeOpenAI,
    broken,
    endless,
    overflow_openai,
    rate_limited,
    stream_error,
    streamed,
    text,
)
from tests.runtime_channel import idle, make_runtime
from tests.test_stream_runtime import StreamingChannel

__all__ = ["make_runtime"]  # the fixture

USER = [{"role": "user", "content": "hello"}]
TOO_LONG = "The model took too long to answer. Please try again."


@pytest.fixture
async def client(settings):
    """Model clients with a 0.5 s deadline. The SDK is imported when this module is (the
    client imports it on its first call, inside the deadline: on a busy machine the import
    alone could take the 0.5 s, and a stream would be cut before it showed anything)."""
    made: list[ModelClient] = []

    def make(**overrides: Any) -> ModelClient:
        built = ModelClient(settings(model_timeout_seconds=0.5, **overrides))
        made.append(built)
        return built

    yield make
    for built in made:
        await built.close()


async def _hung_up(reply: Any) -> None:
    """Wait until the fake model saw the client hang up."""
    for _ in range(200):
        if reply.cut:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the client never hung up")


async def test_a_stream_that_never_ends_is_cut_and_taken_back(fake_openai: FakeOpenAI, client):
    forever = endless()
    fake_openai.script(forever)
    seen: list[Progress] = []
    with pytest.raises(ModelError) as caught:
        await client().complete(USER, on_progress=seen.append)
    assert caught.value.user_message == TOO_LONG and "0.5 s" in str(caught.value)
    kinds = [p.kind for p in seen]
    assert "text" in kinds and kinds[-1] == "reset"
    assert len(fake_openai.completion_requests()) == 1  # no plain request after the deadline
    await _hung_up(forever)


async def test_keep_alive_comments_do_not_count_as_an_answer(fake_openai: FakeOpenAI, client):
    forever = endless(comments=True)
    fake_openai.script(forever)
    seen: list[Progress] = []
    with pytest.raises(ModelError) as caught:
        await client().complete(USER, on_progress=seen.append)
    assert caught.value.user_message == TOO_LONG
    assert seen == [] and len(fake_openai.completion_requests()) == 1  # nothing to take back
    await _hung_up(forever)
    assert forever.chunks > 1  # the comments kept the connection busy


@pytest.mark.parametrize("stream", [True, False])
async def test_a_plain_answer_that_trickles_in_is_cut(fake_openai: FakeOpenAI, client, stream):
    """Without a watcher, and with a server that ignores `stream`."""
    if stream:
        fake_openai.refuse_stream = "json"
    trickle = endless()
    fake_openai.script(trickle)
    with pytest.raises(ModelError) as caught:
        await client().complete(USER, on_progress=(lambda p: None) if stream else None)
    assert caught.value.user_message == TOO_LONG
    assert ("stream" in fake_openai.completion_requests()[0].body) is stream
    await _hung_up(trickle)


async def test_the_deadline_covers_the_retries(fake_openai: FakeOpenAI, client):
    """A 429 asks to wait 30 s before the retry: the step ends at its deadline instead."""
    fake_openai.script(rate_limited(retry_after=30))
    with pytest.raises(ModelError) as caught:
        await client(model_retries=2).complete(USER)
    assert caught.value.user_message == TOO_LONG
    assert len(fake_openai.completion_requests()) == 1


async def test_the_calls_own_timeout_is_its_deadline(fake_openai: FakeOpenAI, settings):
    """`/handoff` asks for its summary with BUB_HANDOFF_SUMMARY_TIMEOUT_SECONDS."""
    fake_openai.script(endless())
    model = ModelClient(settings())  # BUB_MODEL_TIMEOUT_SECONDS at its default
    try:
        with pytest.raises(ModelError) as caught:
            await model.complete(USER, timeout=0.5)
        assert caught.value.user_message == TOO_LONG
        fake_openai.script(streamed(text("in time")))
        reply = await model.complete(USER, on_progress=lambda p: None)
        assert reply.content == "in time"
    finally:
        await model.close()


async def test_the_session_is_free_again_after_a_cut(make_runtime, fake_openai) -> None:
    """Through the runtime: the partial answer is taken back, the user reads why, and the
    next message of the session is answered."""
    channel = StreamingChannel(interval=0.01)
    runtime, _ = make_runtime(channel, model_timeout_seconds=0.5)
    fake_openai.script(endless())
    await channel.say("go on for ever")
    await idle(runtime, "test:a")
    assert channel.platform.calls("update")
    # Taken back: by a `reset`, or (when the turn ends before the stream's next update
    # would go out, which drops the pending reset) by the notice replacing the partial.
    assert TOO_LONG in channel.texts("a")[-1]
    assert all("la la" not in m for m in channel.platform.messages.values())
    await channel.say("now briefly")
    await idle(runtime, "test:a")
    assert channel.texts("a")[-1] == "echo: now briefly"


# -- the three take-backs (fallback, overflow, deadline) -------------------------------------
class FailingWatcher:
    """Records progress and fails on `reset`, as a channel whose take-back breaks does."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def __call__(self, progress: Progress) -> None:
        self.kinds.append(progress.kind)
        if progress.kind == "reset":
            raise RuntimeError("the channel could not take it back")


async def test_a_failing_take_back_never_hides_the_answer_or_the_error(
    fake_openai: FakeOpenAI, client
):
    """Each way a streamed step ends early takes back what it showed once; a watcher that
    fails then is logged, and the step still answers (fallback) or raises its own error."""
    # A broken stream: the plain request's answer.
    fake_openai.script(broken(text("partial answer that breaks"), after=3), text("whole answer"))
    watch = FailingWatcher()
    assert (await client().complete(USER, on_progress=watch)).content == "whole answer"
    assert "text" in watch.kinds and watch.kinds.count("reset") == 1
    # An overflow inside the stream: ContextOverflow, not the watcher's error.
    fake_openai.script(stream_error(overflow_openai().body, after=3, reply=text("half of it")))
    watch = FailingWatcher()
    with pytest.raises(ContextOverflow):
        await client().complete(USER, on_progress=watch)
    assert "text" in watch.kinds and watch.kinds.count("reset") == 1
    # The deadline: the timeout, not the watcher's error.
    fake_openai.script(endless())
    watch = FailingWatcher()
    with pytest.raises(ModelError) as caught:
        await client().complete(USER, on_progress=watch)
    assert caught.value.user_message == TOO_LONG and watch.kinds.count("reset") == 1


async def test_a_fallback_cut_by_the_deadline_is_taken_back_once(fake_openai: FakeOpenAI, client):
    """The fallback took the partial back; its plain request then runs into the deadline:
    nothing is shown any more, so the deadline path takes nothing back a second time."""
    fake_openai.script(broken(text("partial answer that breaks"), after=3), endless())
    seen: list[Progress] = []
    with pytest.raises(ModelError) as caught:
        await client().complete(USER, on_progress=seen.append)
    assert caught.value.user_message == TOO_LONG
    kinds = [p.kind for p in seen]
    assert "text" in kinds and kinds.count("reset") == 1 and kinds[-1] == "reset"
    assert len(fake_openai.completion_requests()) == 2
