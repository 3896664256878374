"""The viewer's usage pages and the usage metrics, through the real server and web chat."""

from __future__ import annotations

from urllib.parse import quote

from tests.fakes.openai_server import text
from tests.test_web import TOKEN, web

__all__ = ["web"]  # the fixture

USED = {"prompt_tokens": 80, "completion_tokens": 30, "total_tokens": 110}
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


async def test_usage_pages_per_session_and_user_and_metrics(web, fake_openai) -> None:
    w = await web(model_prices="fake-model=1000/2000", limit_conversation="1/day")
    conversation = await w.chat.new_conversation()
    fake_openai.script(text("counted", usage=USED))
    for message in ("hello", "over the limit"):
        await w.chat.post(conversation, message)
        await w.idle(conversation)
    session = f"web:{conversation}"
    async with w.http.get(f"{w.url}/usage?format=json", headers=HEADERS) as resp:
        assert resp.status == 200
        overview = await resp.json()

    assert overview["today"]["tokens"] == 110 and overview["today"]["cost_usd"] == 0.14
    assert overview["today"]["messages"] == 2  # the refused one is counted, not answered
    assert [s["key"] for s in overview["sessions"]] == [session]
    assert [m["key"] for m in overview["models"]] == ["fake-model"]
    [user] = overview["users"]
    async with w.http.get(
        f"{w.url}/usage/users/{quote(user['key'], safe='')}?format=json", headers=HEADERS
    ) as resp:
        assert (await resp.json())["month"]["tokens"] == 110
    async with w.http.get(
        f"{w.url}/usage/sessions/{quote(session, safe='')}", headers=HEADERS
    ) as resp:
        page = await resp.text()
    assert resp.status == 200 and f"Conversation {session}" in page and "$0.14" in page
    async with w.http.get(f"{w.url}/usage") as resp:
        assert resp.status in (401, 403)  # the viewer's token guards it
    tape = await w.bot.store.list_tapes()
    async with w.http.get(f"{w.url}/tapes/{tape[0].name}", headers=HEADERS) as resp:
        assert f"/usage/sessions/{quote(session, safe='')}" in await resp.text()
    async with w.http.get(f"{w.url}/metrics") as resp:
        metrics = await resp.text()
    assert 'bub_usage_tokens_total{channel="web",direction="in",model="fake-model"} 80.0' in metrics
    assert 'bub_usage_cost_dollars_total{channel="web",model="fake-model"} 0.14' in metrics
    assert 'bub_refusals_total{reason="rate_conversation"} 1.0' in metrics
    assert "u:" not in metrics and user["key"] not in metrics  # no user ids as labels
