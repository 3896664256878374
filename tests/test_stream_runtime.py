"""The runtime streaming a reply (bub_bot/runtime/streaming.py) through an in-process channel
that implements the optional `Streams` contract, the fake model streaming slowly, real
SQLite: throttling, causality, one final answer, takeover of partial messages after a crash,
and BUB_STREAM=off."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from bub_bot.runtime import Runtime
from bub_bot.runtime.streaming import CLOSED, SHOWN, leftover
from bub_bot.tape import TapeEntry
from channels.base import ReplyStream, Streams
from tests.fakes.openai_server import broken, slow, streamed, text, tool_calls
from tests.runtime_channel import (
    RuntimeChannel,
    SentPiece,
    events,
    idle,
    make_runtime,
    tape_of,
    until,
    user_entry,
)

__all__ = ["make_runtime"]  # the fixture


@dataclass
class Platform:
    """What the users see: messages by id (shared by the channels of two processes)."""

    messages: dict[str, str] = field(default_factory=dict)
    log: list[tuple[float, str, Any]] = field(default_factory=list)
    """(time, call, value) for every call a stream made."""
    ids: int = 0

    def new_id(self) -> str:
        self.ids += 1
        return f"s{self.ids}"

    def calls(self, name: str) -> list[tuple[float, Any]]:
        return [(t, v) for t, call, v in self.log if call == name]


class StreamingChannel(RuntimeChannel):
    """A RuntimeChannel that also streams: every slot of `piece_size` text is a message."""

    def __init__(self, platform: Platform | None = None, *, interval: float = 0.05, **kw: Any):
        super().__init__(**kw)
        self.platform = platform or Platform()
        self.interval = interval
        self.streams: list[FakeStream] = []

    def stream(self, target: dict[str, Any], shown: Any = ()) -> ReplyStream | None:
        made = FakeStream(self, target, list(shown))
        self.streams.append(made)
        return made


class FakeStream:
    def __init__(self, channel: StreamingChannel, target: dict[str, Any], shown: list) -> None:
        self.channel = channel
        self.platform = channel.platform
        self.target = target
        self.interval = channel.interval
        self.shown: list[str | None] = shown

    def _call(self, name: str, value: Any) -> None:
        self.platform.log.append((time.monotonic(), name, value))

    async def update(self, text_: str) -> bool:
        self._call("update", text_)
        for i, part in enumerate(self.channel.split(text_)):
            if i < len(self.shown) and self.shown[i]:
                self.platform.messages[self.shown[i]] = part  # type: ignore[index]
            else:
                new = self.platform.new_id()
                self.platform.messages[new] = part
                self.shown.append(new)
        return True

    async def status(self, text_: str) -> None:
        self._call("status", text_)

    async def reset(self) -> None:
        self._call("reset", None)

    async def deliver(self, index: int, piece: str) -> list[str] | None:
        if index >= len(self.shown) or not self.shown[index]:
            return None
        slot = self.shown[index]
        assert slot is not None
        self._call("deliver", piece)
        self.platform.messages[slot] = piece
        self.shown[index] = None
        chat = str(self.target.get("chat"))
        record = SentPiece(chat, piece, (slot,))
        self.channel.sent[chat].append(record)
        self.channel.log.append(record)
        await self.channel._notify()
        return [slot]

    async def end(self, pieces: int) -> list[str]:
        removed = [s for s in self.shown[pieces:] if s]
        for slot in removed:
            self.platform.messages.pop(slot, None)
        self._call("end", removed)
        return removed


def first_texts(runtime: Runtime) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    runtime.observers.append(lambda e, d: seen.append(d) if e == "first_text" else None)
    return seen


ANSWER = "Streaming makes the answer appear while the model is still writing it. " * 2


async def test_streamed_answer_updates_then_one_final(make_runtime, fake_openai) -> None:
    assert isinstance(StreamingChannel(), Streams)
    channel = StreamingChannel(interval=0.2)
    runtime, _ = make_runtime(channel)
    seen = first_texts(runtime)
    fake_openai.script(streamed(text(ANSWER), chunks=20, seconds=1.0))
    await channel.say("tell me")
    await idle(runtime, "test:a")
    platform = channel.platform
    updates = platform.calls("update")
    [log] = fake_openai.streams
    # The first update follows the first chunk and comes long before the last one.
    assert log.first < updates[0][0] < log.last
    assert log.texts[0].startswith(updates[0][1][:1])
    # Throttled: about one update per interval, far fewer than the 20 chunks.
    assert 2 <= len(updates) <= 1 + (log.last - log.first) / 0.2 + 1
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(updates)]
    assert min(gaps) >= 0.2 * 0.9
    # One final message: the streamed one became the answer.
    assert channel.texts("a") == [ANSWER] and list(platform.messages.values()) == [ANSWER]
    tape = tape_of(runtime, "test:a")
    [shown] = await events(tape, SHOWN)
    [sent] = await events(tape, "reply.sent")
    assert shown.payload["data"]["ids"] == sent.payload["data"]["ids"] == ["s1"]
    assert leftover(await tape.query()) == []
    [first] = seen
    assert first["streamed"] and first["channel"] == "test" and first["seconds"] > 0


async def test_interval_setting_and_the_platform_default(make_runtime, fake_openai) -> None:
    fast = StreamingChannel(interval=5.0)  # the platform's default would allow one update
    runtime, _ = make_runtime(fast, stream_interval_ms=0)
    fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=0.3))
    await fast.say("go")
    await idle(runtime, "test:a")
    assert len(fast.platform.calls("update")) >= 5  # every chunk, nearly
    slow_channel = StreamingChannel(interval=5.0, name="slow")
    runtime2, _ = make_runtime(slow_channel)
    fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=0.3))
    await slow_channel.say("go")
    await idle(runtime2, "slow:a")
    assert len(slow_channel.platform.calls("update")) == 1
    assert slow_channel.texts("a") == [ANSWER]


async def test_stream_off_is_todays_behaviour(make_runtime, fake_openai) -> None:
    channel = StreamingChannel()
    runtime, _ = make_runtime(channel, stream=False)
    seen = first_texts(runtime)
    await channel.say("hello")
    await idle(runtime, "test:a")
    assert channel.streams == [] and channel.texts("a") == ["echo: hello"]
    assert "stream" not in fake_openai.completion_requests()[-1].body
    assert seen[0]["streamed"] is False  # the metric still counts the first piece


async def test_tool_step_shows_status_then_the_answer(make_runtime, fake_openai) -> None:
    channel = StreamingChannel(interval=0.01)
    runtime, _ = make_runtime(channel)
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="Let me check."), seconds=0.2),
        streamed(text("All done here."), seconds=0.2),
    )
    await channel.say("check")
    await idle(runtime, "test:a")
    calls = [c for _, c, _ in channel.platform.log]
    assert "status" in calls and calls.index("status") < len(calls) - 1
    assert channel.platform.calls("status")[0][1] == "using tape.info…"
    assert channel.platform.calls("update")[-1][1] == "All done here."
    assert channel.texts("a") == ["All done here."]
    assert list(channel.platform.messages.values()) == ["All done here."]


async def test_broken_stream_resets_and_answers_once(make_runtime, fake_openai) -> None:
    channel = StreamingChannel(interval=0.01)
    runtime, _ = make_runtime(channel)
    fake_openai.script(
        broken(text("one two three four five six"), after=4), slow(text("Whole."), 0.3)
    )
    await channel.say("go")
    await idle(runtime, "test:a")
    assert channel.platform.calls("reset")
    assert channel.texts("a") == ["Whole."]
    assert list(channel.platform.messages.values()) == ["Whole."]


async def test_long_answer_fills_pieces_and_drops_what_it_does_not_need(
    make_runtime, fake_openai
) -> None:
    channel = StreamingChannel(interval=0.01, piece_size=40)
    runtime, _ = make_runtime(channel)
    answer = "x" * 100  # three pieces of 40, 40, 20
    fake_openai.script(streamed(text(answer), chunks=10, seconds=0.3))
    await channel.say("long")
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["x" * 40, "x" * 40, "x" * 20]
    assert sorted(channel.platform.messages.values()) == sorted(channel.texts("a"))
    # A step whose partial text needed more messages than the answer: the extra one goes.
    channel2 = StreamingChannel(interval=0.01, piece_size=40, name="two")
    runtime2, _ = make_runtime(channel2)
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="y" * 90), seconds=0.2),
        streamed(text("short answer"), seconds=0.2),
    )
    await channel2.say("go")
    await idle(runtime2, "two:a")
    assert channel2.texts("a") == ["short answer"]
    assert list(channel2.platform.messages.values()) == ["short answer"]
    tape = tape_of(runtime2, "two:a")
    [closed] = await events(tape, CLOSED)
    assert len(closed.payload["data"]["ids"]) == 2


async def test_crash_mid_stream_then_restart_edits_the_partial_message(
    store, agent, fake_openai
) -> None:
    platform = Platform()
    built = agent(stream_interval_ms=10)
    channel = StreamingChannel(platform)
    runtime = Runtime(built.settings, store, built, {channel.name: channel})
    channel.runtime = runtime
    fake_openai.script(streamed(text(ANSWER), chunks=20, seconds=3.0))
    await channel.say("tell me")
    tape = tape_of(runtime, "test:a")

    async def recorded() -> bool:
        return bool(await events(tape, SHOWN))

    async with asyncio.timeout(5):
        while not await recorded():  # noqa: ASYNC110 (polls the tape)
            await asyncio.sleep(0.02)
    await runtime.shutdown(grace=0)  # the process dies mid-stream
    [partial_id] = list(platform.messages)
    assert platform.messages[partial_id] != ANSWER and channel.texts("a") == []

    channel2 = StreamingChannel(platform)
    runtime2 = Runtime(built.settings, store, built, {channel2.name: channel2})
    channel2.runtime = runtime2
    fake_openai.script(streamed(text("The answer, after the restart."), seconds=0.1))
    assert await runtime2.resume() == 1
    await idle(runtime2, "test:a")
    # The partial message became the answer: one message, no second copy.
    assert platform.messages == {partial_id: "The answer, after the restart."}
    assert channel2.texts("a") == ["The answer, after the restart."]
    assert channel2.streams[0].shown[:1] in ([None], [])  # taken over and closed
    assert await runtime2.resume() == 0
    await runtime2.shutdown(grace=2)


async def test_a_note_after_a_crash_takes_over_the_partial_message(store, agent) -> None:
    """Delivery without a live stream (a resumed reply, a failure note) adopts leftovers."""
    platform = Platform()
    built = agent(stream=False)  # even with streaming turned off since
    channel = StreamingChannel(platform)
    runtime = Runtime(built.settings, store, built, {channel.name: channel})
    channel.runtime = runtime
    tape = tape_of(runtime, "test:a")
    platform.messages["s9"] = "half an ans"
    [user] = await tape.append_many([user_entry(channel, "q", "a", "k1")], bootstrap=True)
    await tape.append_many(
        [
            TapeEntry.event(SHOWN, {"turn": "t0", "ids": ["s9"]}, context=False),
            TapeEntry.message(
                {"role": "assistant", "content": "the full answer"},
                turn="t0",
                seen_through=user.id,
            ),
        ]
    )
    assert await runtime.resume() == 1
    await idle(runtime, "test:a")
    assert platform.messages == {"s9": "the full answer"}
    assert channel.texts("a") == ["the full answer"]
    await runtime.shutdown(grace=2)


async def test_messages_during_a_streamed_turn_reach_the_next_step(
    make_runtime, fake_openai
) -> None:
    channel = StreamingChannel(interval=0.01)
    runtime, _ = make_runtime(channel)
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="Looking."), chunks=5, seconds=0.5),
        text("Both seen."),
    )
    await channel.say("first")
    await until(lambda: bool(fake_openai.streams))
    await channel.say("second")
    await idle(runtime, "test:a")
    second_request = fake_openai.completion_requests()[1].body
    users = [m["content"] for m in second_request["messages"] if m["role"] == "user"]
    assert users == ["first", "second"]
    assert channel.texts("a") == ["Both seen."]
