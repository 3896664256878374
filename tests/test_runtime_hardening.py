"""Runtime defects found in review of the first release, each reproduced here first:
a failing entry never blocks a conversation, /reset never carries answered messages, a
message that arrives during a too-long retry is not lost, the /reset reply survives a crash,
a resumed session keeps its own workspace, a platform backlog older than the window expires."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from bub_bot.runtime import FAILED_NOTE, Runtime
from tests.fakes.openai_server import html_page, overflow_openai, slow, text
from tests.runtime_channel import (
    RuntimeChannel,
    done_coverage,
    events,
    idle,
    inbound_users,
    make_runtime,
    tape_of,
    until,
    user_texts,
)

__all__ = ["make_runtime"]  # the fixture


class FussyChannel(RuntimeChannel):
    """A platform that cannot format some texts: `split` raises for them."""

    def __init__(self, refuse: str) -> None:
        super().__init__()
        self.refuse = refuse

    def split(self, text: str) -> list[str]:
        if self.refuse in text:
            raise ValueError(f"cannot format {self.refuse!r}")
        return super().split(text)


async def test_a_turn_that_breaks_in_delivery_is_closed_and_the_next_message_answered(
    make_runtime, fake_openai
) -> None:
    runtime, channel = make_runtime(FussyChannel("BOOM"))
    fake_openai.script(text("BOOM"), text("fine"))
    await channel.say("first")
    await idle(runtime, "test:a")
    assert channel.texts("a") == [FAILED_NOTE]
    await channel.say("second")
    await idle(runtime, "test:a")
    assert channel.texts("a") == [FAILED_NOTE, "fine"]
    # "first" was closed once and never re-run: two model calls, each message answered once
    assert [user_texts(r.body)[-1] for r in fake_openai.completion_requests()] == [
        "first",
        "second",
    ]
    tape = tape_of(runtime, "test:a")
    users = await inbound_users(tape)
    assert set((await done_coverage(tape, [e.id for e in users])).values()) == {1}
    assert any(e.kind == "error" for e in await tape.query(kinds=["error"]))


async def test_a_command_that_breaks_does_not_block_what_queues_behind_it(
    make_runtime, fake_openai
) -> None:
    runtime, channel = make_runtime(FussyChannel("Entries:"))
    await channel.say("/status")
    await channel.say("/help")
    await channel.say("hello")
    await idle(runtime, "test:a")
    texts = channel.texts("a")
    assert texts[0] == FAILED_NOTE
    assert texts[1].startswith("Commands:")
    assert texts[2] == "echo: hello"
    assert len(texts) == 3
    # a restart finds nothing left to run
    assert await runtime.resume() == 0


async def test_reset_does_not_carry_messages_that_were_already_answered(
    make_runtime, fake_openai
) -> None:
    """Messages queued behind a /handoff are copied after its anchor and answered; a /reset
    after that must not carry those copies into the fresh conversation (privacy)."""
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("first answer"), 0.5))
    await channel.say("first")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("/handoff moving on")
    await channel.say("my password is hunter2")
    await channel.say("/reset")
    await idle(runtime, "test:a")
    await channel.say("what do you know?")
    await idle(runtime, "test:a")

    requests = fake_openai.completion_requests()
    assert "my password is hunter2" in user_texts(requests[1].body)  # answered once
    assert user_texts(requests[-1].body) == ["what do you know?"]
    tape = tape_of(runtime, "test:a")
    assert not [e for e in await tape.query(kinds=["message"]) if "hunter2" in str(e.payload)], (
        "an answered message was carried into the fresh conversation"
    )


async def test_a_message_arriving_while_a_too_long_message_is_retried_is_answered(
    make_runtime, fake_openai
) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(overflow_openai(), slow(overflow_openai(), 0.5), text("got the late one"))
    await channel.say("x" * 50)
    await until(lambda: len(fake_openai.completion_requests()) == 2)
    await channel.say("late message")
    await idle(runtime, "test:a")

    requests = fake_openai.completion_requests()
    assert len(requests) == 3
    assert user_texts(requests[2].body) == ["late message"]
    assert channel.texts("a")[-1] == "got the late one"
    tape = tape_of(runtime, "test:a")
    users = await inbound_users(tape)
    assert set((await done_coverage(tape, [e.id for e in users])).values()) == {1}


async def test_reset_reply_is_delivered_after_a_crash_right_after_the_reset(
    store, agent, fake_openai
) -> None:
    built = agent()
    channel = RuntimeChannel()
    runtime = Runtime(built.settings, store, built, {channel.name: channel})
    channel.runtime = runtime
    await channel.say("hello")
    await idle(runtime, "test:a")
    gate = channel.hold()
    await channel.say("/reset")
    await channel.wait_waiting(1)
    await runtime.shutdown(grace=0)  # the process dies while the reply is being sent
    gate.set()
    assert len(channel.texts("a")) == 1

    channel2 = RuntimeChannel()
    runtime2 = Runtime(built.settings, store, built, {channel2.name: channel2})
    channel2.runtime = runtime2
    assert await runtime2.resume() == 1
    await idle(runtime2, "test:a")
    [reply] = channel2.texts("a")
    assert reply.startswith("Started a fresh conversation. The previous one is archived as ")
    assert await runtime2.resume() == 0  # once
    await runtime2.shutdown(grace=2)


async def test_resume_uses_the_workspace_the_session_started_in(
    store, agent, fake_openai, tmp_path
) -> None:
    own = tmp_path / "own-workspace"
    own.mkdir()
    (own / "AGENTS.md").write_text("WORKSPACE-MARKER-7f3a: answer in haiku.")
    built = agent()
    channel = RuntimeChannel()
    runtime = Runtime(built.settings, store, built, {channel.name: channel})
    channel.runtime = runtime
    fake_openai.script(slow(text("never delivered"), 5))
    await runtime.receive(dataclasses.replace(channel.inbound("hi"), workspace=own))
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await runtime.shutdown(grace=0)

    channel2 = RuntimeChannel()
    runtime2 = Runtime(built.settings, store, built, {channel2.name: channel2})
    channel2.runtime = runtime2
    fake_openai.script(text("resumed"))
    assert await runtime2.resume() == 1
    await idle(runtime2, "test:a")
    assert channel2.texts("a") == ["resumed"]
    system = fake_openai.completion_requests()[-1].body["messages"][0]["content"]
    assert "WORKSPACE-MARKER-7f3a" in system
    await runtime2.shutdown(grace=2)


async def test_a_platform_backlog_older_than_the_window_expires(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime(resume_window_seconds=60)
    old = channel.inbound("sent an hour ago while we were down")
    if "sent_at" not in {f.name for f in dataclasses.fields(old)}:
        raise AssertionError("Inbound carries no platform time (sent_at)")
    await runtime.receive(dataclasses.replace(old, sent_at=time.time() - 3600))
    await idle(runtime, "test:a")
    [note] = channel.texts("a")
    assert "expired" in note
    assert fake_openai.completion_requests() == []
    fresh: Any = dataclasses.replace(channel.inbound("just now"), sent_at=time.time() - 5)
    await runtime.receive(fresh)
    await idle(runtime, "test:a")
    assert channel.texts("a")[-1] == "echo: just now"
    assert len(await events(tape_of(runtime, "test:a"), "inbound.expired")) == 1
    await asyncio.sleep(0)


class StaleReads:
    """A store that delays handing back the result of cursor reads while `paused` is set:
    what the runtime read is then older than the tape (as on a busy database)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.paused: asyncio.Event | None = None
        self.held = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def query(self, tape: str, **filters: Any) -> Any:
        result = await self._inner.query(tape, **filters)
        if self.paused is not None and filters.get("names") == ["inbound.done"]:
            gate, self.paused = self.paused, None
            self.held.set()
            await gate.wait()
        return result


async def test_resume_never_rewinds_a_session_that_finished_meanwhile(
    store, agent, fake_openai
) -> None:
    """In `serve` the channels start before `resume()` runs: a session may finish its turn
    while resume is between reading its cursor and waking it. It must not be answered twice."""
    built = agent()
    stale = StaleReads(store)
    channel = RuntimeChannel()
    runtime = Runtime(built.settings, stale, built, {channel.name: channel})
    channel.runtime = runtime
    fake_openai.script(slow(text("the answer"), 0.3))
    await channel.say("question")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    gate = asyncio.Event()
    stale.paused = gate
    resuming = asyncio.create_task(runtime.resume())
    await stale.held.wait()  # resume has read the cursor: 0, the turn is still running
    await idle(runtime, "test:a")  # the turn finishes and the session is forgotten
    gate.set()
    await resuming
    await idle(runtime, "test:a")
    await asyncio.sleep(0.2)
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["the answer"]
    assert len(fake_openai.completion_requests()) == 1
    await runtime.shutdown(grace=2)


class SlowChat(RuntimeChannel):
    """A platform that holds every send to one chat (as a paced, busy group would)."""

    def __init__(self, slow_chat: str) -> None:
        super().__init__()
        self.slow_chat = slow_chat
        self.release = asyncio.Event()

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        if target.get("chat") == self.slow_chat:
            await self.release.wait()
        return await super().send(target, piece)


async def test_a_slow_delivery_does_not_hold_a_turn_slot(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime(SlowChat("busy-group"), max_concurrent_turns=1)
    await channel.say("hello", "busy-group")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("hi", "private")
    await channel.wait_sent("private", 1)  # answered while the group's send still waits
    assert channel.texts("busy-group") == []
    channel.release.set()
    await idle(runtime, "test:busy-group", "test:private")
    assert channel.texts("busy-group") == ["echo: hello"]


async def test_handoff_against_an_html_endpoint_does_not_wedge_the_conversation(
    make_runtime, fake_openai
) -> None:
    """A mis-set OPENAI_BASE_URL answers 200 with a web page: /handoff hands off without a
    summary, and everything after it is still answered (also after a restart)."""
    runtime, channel = make_runtime()
    fake_openai.default = lambda body: html_page()
    await channel.say("/handoff")
    await channel.say("/status")
    await channel.say("hello")
    await idle(runtime, "test:a")
    handoff, status, answer = channel.texts("a")
    assert handoff.startswith("Handed off (handoff).") and "could not write a summary" in handoff
    assert status.startswith("Entries:")
    assert "OPENAI_BASE_URL" in answer  # the turn's note names the setting to check
    assert await runtime.resume() == 0
