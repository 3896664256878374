"""The runtime through an in-process test channel, real SQLite and the fake model server."""

from __future__ import annotations

import asyncio

import aiohttp

from bub_bot.server import Bot, BotServer
from bub_bot.tape import Tape, TapeEntry
from tests.fakes.openai_server import server_error, slow, text, tool_calls
from tests.runtime_channel import (
    DeliveryError,
    DeliveryUnknown,
    RuntimeChannel,
    done_coverage,
    events,
    final_replies,
    idle,
    inbound_users,
    make_runtime,
    old_date,
    tape_of,
    until,
    user_entry,
    user_texts,
)

__all__ = ["make_runtime"]  # the fixture


# -- ingress -------------------------------------------------------------------------------------


async def test_duplicate_delivery_is_stored_and_answered_once(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    first = await channel.say("hello", key="upd-1")
    again = await channel.say("hello", key="upd-1")
    assert first.new and first.entry_id is not None
    assert not again.new and again.duplicate
    await idle(runtime, "test:a")
    # a re-delivery after the turn is done changes nothing either
    assert not (await channel.say("hello", key="upd-1")).new
    # a second key for the same message (Slack app_mention + message) dedupes too
    other = await channel.say("hi there", key="ev-1", extra_keys=("C1:1700.1",))
    assert other.new
    assert not (await channel.say("hi there", key="ev-2", extra_keys=("C1:1700.1",))).new
    await idle(runtime, "test:a")

    tape = tape_of(runtime, "test:a")
    users = await inbound_users(tape)
    assert [e.payload["content"] for e in users] == ["hello", "hi there"]
    assert users[0].meta["delivery_key"] == "upd-1"
    assert users[0].meta["sender"] == {"id": "u1", "name": "U1"}
    assert channel.texts("a") == ["echo: hello", "echo: hi there"]
    assert len(fake_openai.completion_requests()) == 2
    # the same key on another channel is another message
    other_channel = RuntimeChannel("other")
    runtime.add_channel(other_channel)
    other_channel.runtime = runtime
    assert (await other_channel.say("hello", key="upd-1")).new
    await idle(runtime, "other:a")
    assert other_channel.texts("a") == ["echo: hello"]


async def test_many_sessions_concurrently(make_runtime, fake_openai) -> None:
    sessions, per_session = 100, 10
    runtime, channel = make_runtime()
    fake_openai.latency = 0.02  # so messages keep arriving while turns run

    async def talk(chat: str) -> None:
        for i in range(per_session):
            assert (await channel.say(f"{chat} m{i}", chat)).new

    chats = [f"c{n}" for n in range(sessions)]
    await asyncio.gather(*(talk(c) for c in chats))
    for chat in chats:
        await runtime.wait_idle(f"test:{chat}", 30)

    sent_replies = 0
    for chat in chats:
        tape = tape_of(runtime, f"test:{chat}")
        users = await inbound_users(tape)
        assert [e.payload["content"] for e in users] == [f"{chat} m{i}" for i in range(per_session)]
        coverage = await done_coverage(tape, [e.id for e in users])
        assert set(coverage.values()) == {1}, (chat, coverage)
        dones = await events(tape, "inbound.done")
        replies = await final_replies(tape)
        assert [d.payload["data"]["reply"] for d in dones] == [r.id for r in replies]
        # each reply (an echo) answers the newest message of the range it closed: the model
        # saw every message it is counted as answering
        by_id = {e.id: e.payload["content"] for e in users}
        for done, reply in zip(dones, replies, strict=True):
            last = by_id[max(i for i in by_id if i <= done.payload["data"]["through"])]
            assert reply.payload["content"] == f"echo: {last}"
        # every reply went out once and answered the newest message its turn saw
        sent = await events(tape, "reply.sent")
        assert sorted(e.payload["data"]["reply"] for e in sent) == [r.id for r in replies]
        assert channel.texts(chat) == [r.payload["content"] for r in replies]
        assert channel.texts(chat)[-1] == f"echo: {chat} m{per_session - 1}"
        sent_replies += len(replies)
    assert sent_replies == len(fake_openai.completion_requests())
    # per-session order in every request the model saw
    for request in fake_openai.completion_requests():
        texts = user_texts(request.body)
        chat = texts[0].split()[0]
        assert texts == [f"{chat} m{i}" for i in range(len(texts))]


async def test_message_during_slow_step_reaches_next_step(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(slow(tool_calls([("tape_info", {})]), 0.4), text("both seen"))
    await channel.say("first")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("second")
    await idle(runtime, "test:a")

    requests = fake_openai.completion_requests()
    assert len(requests) == 2
    assert user_texts(requests[0].body) == ["first"]
    assert user_texts(requests[1].body) == ["first", "second"]
    assert channel.texts("a") == ["both seen"]
    tape = tape_of(runtime, "test:a")
    users = await inbound_users(tape)
    assert set((await done_coverage(tape, [e.id for e in users])).values()) == {1}
    assert len(await final_replies(tape)) == 1


async def test_message_during_final_step_starts_next_turn(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("answer to first"), 0.4))
    await channel.say("first")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("second")
    await idle(runtime, "test:a")

    assert channel.texts("a") == ["answer to first", "echo: second"]
    requests = fake_openai.completion_requests()
    assert len(requests) == 2
    assert user_texts(requests[1].body) == ["first", "second"]
    tape = tape_of(runtime, "test:a")
    users = await inbound_users(tape)
    assert set((await done_coverage(tape, [e.id for e in users])).values()) == {1}


# -- ordering: commands behind a running turn ----------------------------------------------------


async def test_commands_queue_behind_running_turn_in_order(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(slow(tool_calls([("tape_info", {})]), 0.4), text("turn one done"))
    await channel.say("q1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("/help")
    await channel.say("q2")  # queued behind /help: the running turn must not see it
    await channel.say("/anchors")
    await idle(runtime, "test:a")

    texts = channel.texts("a")
    assert len(texts) == 4
    assert texts[0] == "turn one done"
    assert texts[1].startswith("Commands:")
    assert texts[2] == "echo: q2"
    assert texts[3].startswith("Anchors (oldest first):")
    requests = fake_openai.completion_requests()
    assert [user_texts(r.body) for r in requests] == [["q1"], ["q1"], ["q1", "q2"]]
    tape = tape_of(runtime, "test:a")
    commands = await events(tape, "command")
    assert [c.payload["data"]["name"] for c in commands] == ["help", "anchors"]
    # the model never sees commands
    assert all("/help" not in user_texts(r.body) for r in requests)


async def test_message_after_reset_during_turn_lands_on_fresh_tape(
    make_runtime, fake_openai
) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("old answer"), 0.4))
    await channel.say("old question")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("/reset")
    await channel.say("new question")
    await idle(runtime, "test:a")

    texts = channel.texts("a")
    assert texts[0] == "old answer"
    assert texts[1].startswith("Started a fresh conversation. The previous one is archived as ")
    assert texts[2] == "echo: new question"
    assert len(texts) == 3
    assert user_texts(fake_openai.completion_requests()[-1].body) == ["new question"]
    tape = tape_of(runtime, "test:a")
    users = await inbound_users(tape)
    assert [e.payload["content"] for e in users] == ["new question"]
    assert set((await done_coverage(tape, [e.id for e in users])).values()) == {1}


async def test_message_arriving_while_reset_waits_for_a_slot(
    make_runtime, fake_openai, workspace
) -> None:
    """With every turn slot busy, /reset waits; a message sent meanwhile must survive it."""
    runtime, channel = make_runtime(max_concurrent_turns=1)
    fake_openai.script(slow(text("busy elsewhere"), 0.4))
    await channel.say("hold the only slot", "b")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("/reset", "a")
    await asyncio.sleep(0.05)  # session a's worker is now waiting for the slot
    await channel.say("after reset", "a")
    await idle(runtime, "test:b", "test:a")

    texts = channel.texts("a")
    assert texts[0].startswith("Started a fresh conversation.")
    assert texts[1:] == ["echo: after reset"]
    users = await inbound_users(tape_of(runtime, "test:a"))
    assert [e.payload["content"] for e in users] == ["after reset"]


# -- crash recovery (the state a crash leaves, then a new Runtime) -------------------------------


async def crash_state(
    store, workspace, channel: RuntimeChannel, chat: str, *entries: TapeEntry
) -> Tape:
    """Write what the process had written before it died (the bootstrap anchor first)."""
    tape = Tape.for_session(store, f"{channel.name}:{chat}", workspace)
    await store.append_many(
        tape.name, list(entries), bootstrap=Tape.bootstrap_anchor(), session_id=tape.session_id
    )
    return tape


def answered(text_: str, turn: str = "t-crashed") -> list[TapeEntry]:
    """What the loop writes when the model answered: the final message and its records."""
    return [
        TapeEntry.event("loop.start", {"turn": turn}, context=False),
        TapeEntry.message({"role": "assistant", "content": text_}, turn=turn),
        TapeEntry.event("run", {"model": "fake-model", "usage": {}, "turn": turn}, context=False),
        TapeEntry.event("loop.step", {"step": 1, "status": "ok"}, context=False),
    ]


async def test_resume_delivers_a_computed_answer_without_the_model(
    make_runtime, fake_openai, store, workspace
) -> None:
    channel = RuntimeChannel()
    tape = await crash_state(
        store,
        workspace,
        channel,
        "a",
        user_entry(channel, "question", "a", "k1"),
        *answered("the answer"),
    )
    runtime, _ = make_runtime(channel)
    assert await runtime.resume() == 1
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["the answer"]
    assert fake_openai.completion_requests() == []
    [done] = await events(tape, "inbound.done")
    assert done.payload["data"]["through"] == 2
    assert done.payload["data"]["resumed"] is True
    # resuming again (another restart) sends nothing
    again, _ = make_runtime(channel)
    assert await again.resume() == 0
    assert channel.texts("a") == ["the answer"]


async def test_resume_continues_a_partial_delivery(
    make_runtime, fake_openai, store, workspace
) -> None:
    channel = RuntimeChannel(piece_size=5)
    tape = await crash_state(
        store,
        workspace,
        channel,
        "a",
        user_entry(channel, "question", "a", "k1"),
        *answered("aaaaabbbbbccccc"),
    )
    reply_id = (await final_replies(tape))[0].id
    await tape.append(
        TapeEntry.event(
            "reply.sent", {"reply": reply_id, "chunk": 0, "of": 3, "ids": ["p0"]}, context=False
        )
    )
    runtime, _ = make_runtime(channel)
    await runtime.resume()
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["bbbbb", "ccccc"]
    assert fake_openai.completion_requests() == []
    sent = await events(tape, "reply.sent")
    assert [e.payload["data"]["chunk"] for e in sent] == [0, 1, 2]


async def test_resume_answers_a_young_pending_message(
    make_runtime, fake_openai, store, workspace
) -> None:
    channel = RuntimeChannel()
    young = old_date(60)
    tape = await crash_state(
        store,
        workspace,
        channel,
        "a",
        user_entry(channel, "still there?", "a", "k1", date=young),
        TapeEntry.event("loop.start", {"turn": "t-crashed"}, context=False),
    )
    runtime, _ = make_runtime(channel)
    assert await runtime.resume() == 1
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["echo: still there?"]
    assert len(fake_openai.completion_requests()) == 1
    assert len(await final_replies(tape)) == 1


async def test_resume_expires_old_messages_with_one_note_per_session(
    make_runtime, fake_openai, store, workspace
) -> None:
    channel = RuntimeChannel()
    old = old_date(3600)
    tape_a = await crash_state(
        store,
        workspace,
        channel,
        "a",
        user_entry(channel, "one", "a", "k1", date=old),
        user_entry(channel, "two", "a", "k2", date=old),
    )
    tape_b = await crash_state(
        store, workspace, channel, "b", user_entry(channel, "three", "b", "k3", date=old)
    )
    runtime, _ = make_runtime(channel)  # BUB_RESUME_WINDOW_SECONDS default: 900
    assert await runtime.resume() == 2
    await idle(runtime, "test:a", "test:b")
    assert fake_openai.completion_requests() == []
    assert len(channel.texts("a")) == 1
    assert "expired" in channel.texts("a")[0] and "them" in channel.texts("a")[0]
    assert len(channel.texts("b")) == 1
    assert "send it again" in channel.texts("b")[0]
    [expired] = await events(tape_a, "inbound.expired")
    assert expired.payload["data"]["ids"] == [2, 3]
    assert len(await events(tape_b, "inbound.expired")) == 1
    # the session works as usual afterwards
    await channel.say("new message")
    await idle(runtime, "test:a")
    assert channel.texts("a")[-1] == "echo: new message"
    assert user_texts(fake_openai.completion_requests()[-1].body)[-1] == "new message"


async def test_expired_messages_and_commands_get_one_note(
    make_runtime, fake_openai, store, workspace
) -> None:
    channel = RuntimeChannel()
    old = old_date(3600)
    command = TapeEntry.event(
        "command",
        {"name": "status", "args": "", "error": None, "text": "/status"},
        **user_entry(channel, "", "a", "k2").meta,
    )
    command = TapeEntry(command.kind, command.payload, command.meta, old)
    await crash_state(
        store,
        workspace,
        channel,
        "a",
        user_entry(channel, "hi", "a", "k1", date=old),
        command,
        user_entry(channel, "hello?", "a", "k3", date=old),
    )
    runtime, _ = make_runtime(channel)
    await runtime.resume()
    await idle(runtime, "test:a")
    assert len(channel.texts("a")) == 1, channel.texts("a")
    assert fake_openai.completion_requests() == []


async def test_resume_skips_sessions_of_channels_not_running(
    make_runtime, store, workspace
) -> None:
    other = RuntimeChannel("elsewhere")
    await crash_state(store, workspace, other, "a", user_entry(other, "hi", "a", "k1"))
    runtime, channel = make_runtime()
    assert await runtime.resume() == 0
    assert channel.log == [] and other.log == []


async def test_shutdown_cancels_after_grace_and_next_start_answers_once(
    make_runtime, fake_openai, store
) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("never delivered"), 5))
    await channel.say("question")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await runtime.shutdown(grace=0.1)
    assert channel.log == []
    restarted, _ = make_runtime(channel)
    assert await restarted.resume() == 1
    await idle(restarted, "test:a")
    assert channel.texts("a") == ["echo: question"]
    tape = tape_of(restarted, "test:a")
    assert [r.payload["content"] for r in await final_replies(tape)] == ["echo: question"]
    users = await inbound_users(tape)
    assert set((await done_coverage(tape, [e.id for e in users])).values()) == {1}


async def test_stop_between_answer_and_delivery(make_runtime, fake_openai) -> None:
    """Killed after the model answered, before delivery: delivered once, model not re-asked."""
    runtime, channel = make_runtime()
    gate = channel.hold()
    await channel.say("q1")
    await channel.wait_waiting(1)
    await runtime.shutdown(grace=0)  # the send is cancelled at the gate, nothing recorded
    gate.set()
    assert channel.log == []
    restarted, _ = make_runtime(channel)
    assert await restarted.resume() == 1
    await idle(restarted, "test:a")
    assert channel.texts("a") == ["echo: q1"]
    assert len(fake_openai.completion_requests()) == 1


async def test_stop_between_answer_and_delivery_keeps_message_sent_meanwhile(
    make_runtime, fake_openai
) -> None:
    runtime, channel = make_runtime()
    fake_openai.script(slow(text("answer one"), 0.4))
    gate = channel.hold()
    await channel.say("q1")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("q2")  # the model is already answering q1
    await channel.wait_waiting(1)
    await runtime.shutdown(grace=0)
    gate.set()
    restarted, _ = make_runtime(channel)
    await restarted.resume()
    await idle(restarted, "test:a")
    assert channel.texts("a") == ["answer one", "echo: q2"]


# -- failures --------------------------------------------------------------------------------------


async def test_failing_turn_tells_the_user_and_the_session_goes_on(
    make_runtime, fake_openai
) -> None:
    runtime, channel = make_runtime()  # model_retries=0
    fake_openai.script(server_error(500))
    await channel.say("q1")
    await idle(runtime, "test:a")
    [note] = channel.texts("a")
    assert "HTTP 500" in note and "try again" in note
    assert "\n" not in note and len(note) < 200
    tape = tape_of(runtime, "test:a")
    errors = await tape.query(kinds=["error"])
    assert len(errors) == 1 and "500" in errors[0].payload["message"]
    await channel.say("q2")
    await idle(runtime, "test:a")
    assert channel.texts("a")[-1] == "echo: q2"
    # the failed question stays on the tape for the model to see
    assert user_texts(fake_openai.completion_requests()[-1].body) == ["q1", "q2"]


async def test_delivery_unknown_is_recorded_and_not_resent(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime(RuntimeChannel(piece_size=4))
    channel.fail_next(DeliveryUnknown("connection lost after posting"))
    fake_openai.script(text("aaaabbbb"))
    await channel.say("q")
    await idle(runtime, "test:a")
    assert channel.attempts == 2
    assert channel.texts("a") == ["bbbb"]
    tape = tape_of(runtime, "test:a")
    [unknown] = await events(tape, "reply.unknown")
    assert unknown.payload["data"]["chunk"] == 0
    assert [e.payload["data"]["chunk"] for e in await events(tape, "reply.sent")] == [1]
    assert len(await events(tape, "inbound.done")) == 1
    # nothing is re-sent on the next start
    restarted, _ = make_runtime(channel)
    assert await restarted.resume() == 0
    assert channel.attempts == 2


async def test_delivery_error_is_recorded_as_failed(make_runtime, fake_openai) -> None:
    runtime, channel = make_runtime(RuntimeChannel(piece_size=4))
    channel.fail_next(None, DeliveryError("chat not found"))
    fake_openai.script(text("aaaabbbbcccc"))
    await channel.say("q")
    await idle(runtime, "test:a")
    assert channel.texts("a") == ["aaaa"]
    assert channel.attempts == 2  # the rest of the reply is not tried after a failure
    tape = tape_of(runtime, "test:a")
    [failed] = await events(tape, "reply.failed")
    assert failed.payload["data"]["chunk"] == 1
    assert "chat not found" in failed.payload["data"]["error"]
    assert len(await events(tape, "inbound.done")) == 1
    await channel.say("again")
    await idle(runtime, "test:a")
    assert "".join(channel.texts("a")[1:]) == "echo: again"


# -- the server: health, readiness, graceful stop -----------------------------------------------


async def test_bot_server_health_readiness_and_graceful_stop(settings, fake_openai) -> None:
    channel = RuntimeChannel()
    channel.start_gate = asyncio.Event()
    bot = await Bot.open(settings(shutdown_grace_seconds=5), [channel])
    server = BotServer(bot, host="127.0.0.1", port=0)
    async with aiohttp.ClientSession() as http:
        starting = asyncio.create_task(server.start())
        await asyncio.wait_for(channel.starting.wait(), 5)
        async with http.get(f"{server.url}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{server.url}/readyz") as resp:
            assert resp.status == 503
            body = await resp.json()
            assert body["channels"]["test"]["started"] is False
        channel.start_gate.set()
        await asyncio.wait_for(starting, 5)
        async with http.get(f"{server.url}/readyz") as resp:
            assert resp.status == 200
            body = await resp.json()
            assert body["ok"] is True and body["database"] == "ok"
            assert body["channels"] == {"test": {"started": True, "last_inbound_age_seconds": None}}
        fake_openai.script(slow(text("finished in time"), 0.5))
        await channel.say("slow one")
        await until(lambda: len(fake_openai.completion_requests()) == 1)
        async with http.get(f"{server.url}/readyz") as resp:
            age = (await resp.json())["channels"]["test"]["last_inbound_age_seconds"]
            assert isinstance(age, float) and 0 <= age < 5
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.1)
        async with http.get(f"{server.url}/readyz") as resp:
            assert resp.status == 503
        await asyncio.wait_for(stopping, 10)
    # the running turn was allowed to finish and deliver
    assert channel.texts("a") == ["finished in time"]
    assert channel.stopped


async def test_command_sent_while_turn_waits_for_a_slot_is_not_overtaken(
    make_runtime, fake_openai
) -> None:
    """/status arrives while m1's turn waits for a slot; m2, sent during that turn, must wait
    behind /status (not reach the turn's next step)."""
    runtime, channel = make_runtime(max_concurrent_turns=1)
    fake_openai.script(
        slow(text("b done"), 0.4),  # session b holds the only slot
        slow(tool_calls([("tape_info", {})]), 0.3),  # m1's first step
        text("a done"),  # m1's second step
    )
    await channel.say("hold the slot", "b")
    await until(lambda: len(fake_openai.completion_requests()) == 1)
    await channel.say("m1", "a")
    await asyncio.sleep(0.05)  # a's worker has read [m1] and waits for the slot
    await channel.say("/status", "a")
    await until(lambda: len(fake_openai.completion_requests()) == 2)
    await channel.say("m2", "a")
    await idle(runtime, "test:b", "test:a")

    requests = [user_texts(r.body) for r in fake_openai.completion_requests()]
    assert requests[1:] == [["m1"], ["m1"], ["m1", "m2"]]
    texts = channel.texts("a")
    assert texts[0] == "a done"
    assert texts[1].startswith("Entries: ")
    assert texts[2] == "echo: m2"
