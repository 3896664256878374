"""Streaming on Telegram: the real aiogram Bot against FakeTelegram, the fake model streaming
slowly (scaled down from 20 chunks over 4 s), real SQLite. Private chats get drafts and one
final message; groups get a message edited in place; throttling, long answers, fallbacks."""

from __future__ import annotations

import itertools

from channels.telegram_format import html_to_text, markdown_to_html, split_markdown
from tests.fakes.openai_server import FakeOpenAI, broken, streamed, text, tool_calls
from tests.fakes.telegram_api import ApiError, FakeTelegram
from tests.test_telegram import BOT, GROUP, USER, start, tg, wait_until

__all__ = ["start", "tg"]  # fixtures

ANSWER = (
    "Here is **the answer**, written slowly: streaming shows each part as soon as the model"
    " has written it, so nobody stares at *typing…* for a minute."
)
SHOWN = html_to_text(markdown_to_html(ANSWER))


def rendered(markdown: str) -> list[str]:
    """The texts Telegram shows for the final pieces of `markdown`."""
    return [html_to_text(p.html).strip() for p in split_markdown(markdown)]


async def test_private_chat_drafts_then_one_final_message(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    limits = tg.enforce_limits(time_scale=20)  # Telegram's limits, 20 times faster
    h = await start(stream_interval_ms=200)
    fake_openai.script(
        streamed(tool_calls([("tape.info", {})], content="Let me look."), seconds=0.3),
        streamed(text(ANSWER), chunks=20, seconds=2.0),
    )
    tg.push_update(tg.private_text(USER, "explain streaming"))
    [final] = await h.replies(USER, 1)
    await h.idle(f"telegram:{USER}")
    assert final["text"] == SHOWN
    drafts = tg.drafts
    assert len({d["draft_id"] for d in drafts}) == 1  # one draft id per reply
    assert any(d["text"] == "using tape.info…" for d in drafts)
    answer_drafts = [d for d in drafts if d["text"] and SHOWN.startswith(d["text"])]
    log = fake_openai.streams[-1]
    # The first draft of the answer follows its first chunk, well before the last one.
    assert log.first <= answer_drafts[0]["time"] < log.last
    # Throttled per conversation: one update per 200 ms at most (the tool step's too).
    times = [d["time"] for d in drafts]
    assert all(b - a >= 0.2 * 0.9 for a, b in itertools.pairwise(times))
    assert len(answer_drafts) <= (log.last - log.first) / 0.2 + 2
    # Exactly one message, after every draft, and no edits.
    [(sent_at, _, _)] = tg.timed("sendMessage")
    assert sent_at > times[-1] and tg.calls_of("editMessageText") == []
    assert limits.rejected == 0 and limits.ignored_retry_after == 0
    labels = {"channel": "telegram", "streamed": "yes"}
    registry = h.bot.metrics.registry
    assert registry.get_sample_value("bub_first_text_seconds_count", labels) == 1


async def test_group_message_edited_in_place(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    limits = tg.enforce_limits(time_scale=20)
    h = await start(stream_interval_ms=300)
    fake_openai.script(streamed(text(ANSWER), chunks=20, seconds=2.0))
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} explain streaming"))
    await h.idle(f"telegram:{GROUP}")
    log = fake_openai.streams[-1]
    [(posted, _, post)] = tg.timed("sendMessage")
    edits = tg.timed("editMessageText")
    assert log.first < posted < log.last and SHOWN.startswith(html_to_text(post["text"]))
    assert len(edits) >= 2
    # Partial updates at most one per 300 ms (the final edit follows the answer at once).
    partial = [posted, *(t for t, _, _ in edits[:-1])]
    assert all(b - a >= 0.3 * 0.9 for a, b in itertools.pairwise(partial))
    # The final edit carries the formatted text; the chat shows one message: the answer.
    assert edits[-1][2]["parse_mode"] == "HTML" and "<b>the answer</b>" in edits[-1][2]["text"]
    assert tg.visible(GROUP) == [SHOWN]
    assert tg.drafts == [] and limits.rejected == 0


async def test_group_answer_longer_than_a_message_continues(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(stream_interval_ms=100)
    paragraph = "A line of the long answer that keeps going and going. " * 6
    long = "\n\n".join(f"{n}. {paragraph}" for n in range(25))  # ~8 000 characters
    fake_openai.script(streamed(text(long), chunks=20, seconds=1.0))
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} long one"))
    await h.idle(f"telegram:{GROUP}")
    assert tg.visible(GROUP) == rendered(long) and len(rendered(long)) >= 2
    assert len(tg.sent_to(GROUP)) == len(rendered(long))  # one message per piece
    assert tg.deleted == []


async def test_short_quick_answer_in_a_group_is_just_sent(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start()
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} hi"))
    await h.idle(f"telegram:{GROUP}")
    assert tg.visible(GROUP) == [f"echo: @{BOT} hi"]
    assert tg.calls_of("editMessageText") == []


async def test_without_drafts_a_private_chat_gets_edits(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    async def not_found(params: dict) -> None:
        raise ApiError(404, "Not Found")  # a Bot API from before drafts

    tg.methods["sendMessageDraft"] = not_found
    h = await start(stream_interval_ms=200)
    fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=1.5))
    tg.push_update(tg.private_text(USER, "q"))
    await h.idle(f"telegram:{USER}")
    assert tg.visible(USER) == [SHOWN]
    assert len(tg.calls_of("sendMessageDraft")) == 1  # asked once, then never again
    assert tg.calls_of("editMessageText") and len(tg.sent_to(USER)) == 1


async def test_edit_errors_keep_todays_behaviour(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """A 429 on a partial edit skips it; HTML Telegram cannot parse goes as Markdown."""
    h = await start(stream_interval_ms=150)
    fake_openai.script(streamed(text(ANSWER), chunks=12, seconds=1.5))
    tg.fail_next("editMessageText", retry_after=1)
    tg.fail_next("editMessageText", description="Bad Request: can't parse entities: oops")
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} q"))
    await h.idle(f"telegram:{GROUP}")
    [shown] = tg.visible(GROUP)
    assert shown in (SHOWN, ANSWER)  # formatted, or its Markdown after a parse failure
    assert len(tg.sent_to(GROUP)) == 1


async def test_broken_stream_in_a_private_chat_answers_once(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(stream_interval_ms=50)
    fake_openai.script(
        broken(text("first words then the connection drops"), after=4), text("The answer.")
    )
    tg.push_update(tg.private_text(USER, "q"))
    await h.idle(f"telegram:{USER}")
    assert [m["text"] for m in tg.sent_to(USER)] == ["The answer."]


async def test_a_model_server_that_refuses_to_stream(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    fake_openai.refuse_stream = "400"
    h = await start()
    for n in range(2):
        tg.push_update(tg.private_text(USER, f"q{n}"))
        await h.replies(USER, n + 1)
        await h.idle(f"telegram:{USER}")
    assert [m["text"] for m in tg.sent_to(USER)] == ["echo: q0", "echo: q1"]
    asked = [bool(r.body.get("stream")) for r in fake_openai.completion_requests()]
    assert asked == [True, False, False]  # refused once, then not asked again
    assert tg.drafts == []


async def test_stream_off_is_todays_behaviour(
    start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    h = await start(stream=False)
    fake_openai.script(streamed(text(ANSWER), chunks=10, seconds=0.3))
    tg.push_update(tg.private_text(USER, "q"))
    tg.push_update(tg.group_text(GROUP, USER, f"@{BOT} q"))
    await h.idle(f"telegram:{USER}")
    await h.idle(f"telegram:{GROUP}")
    await wait_until(lambda: len(tg.sent) == 2)
    assert tg.drafts == [] and tg.calls_of("editMessageText") == []
    assert all("stream" not in r.body for r in fake_openai.completion_requests())
