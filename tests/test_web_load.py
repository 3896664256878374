"""The web chat under load: partial answers share a budget of the server's time across all
conversations (`hub.PARTIAL_SHARE`), so with many answers being written at once they thin out
(a reply's first text, then the final) before finished answers wait."""

from __future__ import annotations

from channels.web.hub import PARTIAL_BURST, Hub
from channels.web.stream import WebStream
from tests.fakes.openai_server import FakeOpenAI, streamed, text
from tests.test_web import web  # noqa: F401 (the fixture)
from tests.web_client import has_item, partials

ANSWER = " ".join(f"word{i}" for i in range(60))


async def test_a_spent_budget_lets_a_replys_first_text_through_and_holds_the_rest() -> None:
    hub = Hub()
    stream = WebStream(hub, "conversation-1")
    with hub.subscribe("conversation-1") as page:
        hub.charge(3600.0)  # other conversations' partials used the share for a long while
        assert not hub.partials_welcome()
        shown = [await stream.update("word " * n) for n in range(1, 21)]
        assert shown == [True] + [False] * 19  # 20 updates, 1 shown: the first
        assert page.partial is not None and page.partial.text == "word "
        await stream.status("using fs.read…")  # a status is cheap: never held back
        assert page.partial.status == "using fs.read…"

    quiet = Hub()
    quiet.charge(PARTIAL_BURST)  # within the burst: a quiet server shows every update
    assert quiet.partials_welcome()


async def test_a_busy_server_sends_a_streamed_answer_as_first_text_then_final(
    web,  # noqa: F811
    fake_openai: FakeOpenAI,
) -> None:
    w = await web()
    conversation = await w.chat.new_conversation()
    fake_openai.script(streamed(text(ANSWER), chunks=30, seconds=0.9))
    stream = await w.chat.events(conversation)
    try:
        await stream.until(lambda e: e.event == "working")
        w.channel.hub.charge(3600.0)  # as if many answers were being written at once
        await w.chat.post(conversation, "stream it")
        final = await stream.until(has_item("bot"), timeout=15)
        await stream.until(lambda e: e.event == "working" and not e.data["working"])
    finally:
        await stream.close()
    await w.idle(conversation)
    seen = stream.seen
    before = [e.data for e in partials(seen[: seen.index(final)]) if e.data["html"]]
    # 30 chunks over 0.9 s (about 9 updates at the default interval): one partial text.
    assert len(before) == 1 and before[0]["html"].startswith("<p>word0")
    assert [e.data for e in partials(seen[seen.index(final) :])] == [{"html": "", "status": ""}]
