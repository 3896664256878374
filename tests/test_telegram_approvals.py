"""Approvals in Telegram: real aiogram (long polling) against the fake Bot API. A request in
a group gets an inline keyboard; a `callback_query` press approves (the call runs once) and is
answered with answerCallbackQuery; a press by someone else, a second press and a forged
button are answered and change nothing; deny gives the model a denial."""

from __future__ import annotations

from bub_bot.approvals.requests import REQUEST
from tests.fakes.openai_server import FakeOpenAI, text, tool_calls
from tests.fakes.telegram_api import FakeTelegram
from tests.runtime_channel import events
from tests.test_telegram import BOT, GROUP, USER, Harness, start, tg, wait_until

__all__ = ["start", "tg"]  # the fixtures
OTHER = USER + 1


def counting(h: Harness) -> list[str]:
    runs: list[str] = []

    @h.bot.runtime.agent.tools.tool("bash")
    async def bash(ctx, command: str) -> str:
        """Run a command."""
        runs.append(command)
        return f"ran {command}"

    return runs


async def requested(h: Harness, tg: FakeTelegram, fake: FakeOpenAI) -> dict:
    fake.script(tool_calls([("bash", {"command": "make deploy"})]), text("deployed"))
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} deploy"))
    [posted] = await h.replies(GROUP, 1)
    await h.idle(f"telegram:{GROUP}")
    return tg.messages[(GROUP, posted["message_id"])]


def button(message: dict, label: str) -> str:
    rows = message["reply_markup"]["inline_keyboard"]
    return next(b["callback_data"] for row in rows for b in row if b["text"] == label)


async def test_callback_approves_once(start, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    h = await start()
    runs = counting(h)
    message = await requested(h, tg, fake_openai)
    assert "make deploy" in message["text"] and runs == []
    mid = message["message_id"]
    approve = button(message, "Approve")
    forged = approve[:-4] + "0000"
    tg.push_update(tg.callback_update(GROUP, USER, mid, forged))
    tg.push_update(tg.callback_update(GROUP, OTHER, mid, approve))
    await wait_until(lambda: len(tg.callback_answers) == 2)
    assert [a["text"] for a in tg.callback_answers] == [
        "Unknown request.",
        "You may not decide this request.",
    ]
    assert runs == []
    tg.push_update(tg.callback_update(GROUP, USER, mid, approve))
    await wait_until(lambda: len(tg.callback_answers) == 3)
    tg.push_update(tg.callback_update(GROUP, USER, mid, approve))
    await wait_until(lambda: len(tg.callback_answers) == 4)
    assert [a["text"] for a in tg.callback_answers[2:]] == ["Approved.", "Already decided."]
    replies = await h.replies(GROUP, 2)
    await h.idle(f"telegram:{GROUP}")
    assert replies[-1]["text"] == "deployed" and runs == ["make deploy"]
    edited = tg.messages[(GROUP, mid)]
    assert "Approved by Ann" in edited["text"] and "reply_markup" not in edited
    assert len(await events(h.tape(f"telegram:{GROUP}"), REQUEST)) == 1


async def test_callback_deny(start, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    h = await start()
    runs = counting(h)
    message = await requested(h, tg, fake_openai)
    tg.push_update(tg.callback_update(GROUP, USER, message["message_id"], button(message, "Deny")))
    replies = await h.replies(GROUP, 2)
    await h.idle(f"telegram:{GROUP}")
    assert replies[-1]["text"] == "deployed" and runs == []
    tool = [m for m in fake_openai.last_messages() if m["role"] == "tool"]
    assert tool[0]["content"].startswith("error: denied by Ann")


async def test_malformed_callbacks_by_webhook_are_acknowledged_and_change_nothing(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    import json

    import aiohttp

    from tests.test_telegram import SECRET

    hook = "/tg/hook"
    h = await start(
        telegram_webhook_url=f"https://bot.example.test{hook}", telegram_webhook_secret=SECRET
    )
    runs = counting(h)
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    url = h.server.url + hook
    fake_openai.script(tool_calls([("bash", {"command": "make deploy"})]), text("deployed"))
    async with aiohttp.ClientSession() as http:

        async def post(update: dict, n: int) -> int:
            body = json.dumps(update | {"update_id": n})
            async with http.post(url, data=body, headers=headers) as resp:
                return resp.status

        assert await post(tg.group_text(GROUP, USER, f"@{BOT} deploy"), 1) == 200
        [posted] = await h.replies(GROUP, 1)
        await h.idle(f"telegram:{GROUP}")
        message = tg.messages[(GROUP, posted["message_id"])]
        approve = button(message, "Approve")
        good = tg.callback_update(GROUP, USER, message["message_id"], approve)
        query = good["callback_query"]
        rid = approve.split(":")[1]
        bad = [
            {**query, "data": "x"},
            {**query, "data": None},
            {**query, "data": "a:" + "f" * 12 + ":" + "0" * 16},  # no such request
            {**query, "data": f"a:{rid}:" + "0" * 16},  # a digest that does not match
            {**query, "data": approve + "\ud800"},
            {k: v for k, v in query.items() if k != "message"},  # an inline message's press
            {**query, "message": {**query["message"], "chat": {"id": -99, "type": "group"}}},
            {k: v for k, v in query.items() if k != "from"},
            {**query, "from": "Ann"},
            "a press",
        ]
        for n, item in enumerate(bad, start=10):
            assert await post({"callback_query": item}, n) == 200, item
        await h.idle(f"telegram:{GROUP}")
        assert runs == []
        assert await events(h.tape(f"telegram:{GROUP}"), "approval.decision") == []
        tapes = await h.bot.store.list_tapes(include_all=True)
        assert [t.session_id for t in tapes] == [f"telegram:{GROUP}"]  # no tape for chat -99
        assert await post(good, 50) == 200  # the buttons still work
        replies = await h.replies(GROUP, 2)
    await h.idle(f"telegram:{GROUP}")
    assert replies[-1]["text"] == "deployed" and runs == ["make deploy"]
