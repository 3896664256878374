"""Approvals across `bub-bot serve` processes on one PostgreSQL database (Telegram webhook,
the fake Bot API and model): a request posted by replica A waits while A is SIGKILLed; the
press reaches replica B, which stores it, takes the session over and runs the call once;
a second press (to either replica) is answered "already decided" and runs nothing."""

from __future__ import annotations

import signal
from pathlib import Path

from bub_bot.tape import Tape, open_store
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.telegram_api import FakeTelegram
from tests.test_replicas import (
    _update_ids,
    answered_on_the_tape,
    message,
    replicas,
    tg,
    wait_until,
    webhook,
)

__all__ = ["replicas", "tg"]  # the fixtures
USER = 201


async def test_request_by_a_killed_replica_approved_through_another(
    replicas, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    env = webhook(BUB_APPROVE="schedule.add=ask")
    a, b = replicas(**env), replicas(**env)
    await a.start()
    await b.start()
    call = ("schedule_add", {"prompt": "check the build", "in_seconds": 3600})
    fake_openai.script(tool_calls([call]), text("Scheduled it."))
    assert await a.post_update(message(tg, USER, "check the build in an hour")) == 200
    await wait_until(lambda: len(tg.sent_to(USER)) == 1)
    [request] = tg.sent_to(USER)
    approve = request["reply_markup"]["inline_keyboard"][0][0]["callback_data"]

    await answered_on_the_tape(a, f"telegram:{USER}")  # its delivery is recorded
    a.signal(signal.SIGKILL)  # while the request waits
    assert await a.wait() == -signal.SIGKILL

    press = tg.callback_update(USER, USER, request["message_id"], approve)
    assert await b.post_update(press | {"update_id": next(_update_ids)}) == 200
    await wait_until(lambda: [m["text"] for m in tg.sent_to(USER)][-1:] == ["Scheduled it."])
    again = tg.callback_update(USER, USER, request["message_id"], approve)
    assert await b.post_update(again | {"update_id": next(_update_ids)}) == 200
    await wait_until(lambda: len(tg.callback_answers) == 2)
    assert [x["text"] for x in tg.callback_answers] == ["Approved.", "Already decided."]
    assert "Approved by" in tg.messages[(USER, request["message_id"])]["text"]

    async with open_store(b.env["BUB_DATABASE_URL"]) as store:
        jobs = await store.jobs(kinds=["prompt"])
        assert [j.data.get("prompt") for j in jobs] == ["check the build"]  # ran once
        tape = Tape.for_session(store, f"telegram:{USER}", Path(b.env["BUB_WORKSPACE"]))
        closed = await tape.query(kinds=["event"], names=["approval.closed"])
        assert [c.payload["data"]["decision"] for c in closed] == ["approve"]
    assert len(tg.sent_to(USER)) == 2
