"""SIGKILL while a reply is being streamed into a Telegram group (`bub-bot serve` as a real
process): after the restart the partial message is edited into the answer, so the chat shows
one answer, once."""

from __future__ import annotations

import asyncio
import signal

from channels.telegram_format import html_to_text, markdown_to_html
from tests.fakes.openai_server import FakeOpenAI, streamed, text
from tests.fakes.telegram_api import FakeTelegram
from tests.test_telegram_restart import serve, tg, wait_until

__all__ = ["serve", "tg"]  # fixtures

GROUP = -100777
USER = 42
LONG = "This answer is written slowly, word after word, and the process dies halfway. " * 3
AFTER = "The whole answer, written again after the restart."


async def test_sigkill_mid_stream_then_restart_gives_one_answer(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(streamed(text(LONG), chunks=20, seconds=4.0))
    first = serve()
    first.env.update(
        BUB_STREAM_INTERVAL_MS="150",
        BUB_TELEGRAM_RATE_CHAT="1/0.05s",
        BUB_TELEGRAM_RATE_GROUP="20/3s",
    )
    await first.start()
    tg.push_update(tg.group_text(GROUP, USER, "@bub_test_bot tell me slowly"))
    # The partial message is posted, then edited: by then its id is on the tape.
    await wait_until(lambda: len(tg.calls_of("editMessageText")) >= 1)
    first.kill()
    assert await first.wait() == -signal.SIGKILL
    [partial] = tg.visible(GROUP)
    assert partial and partial != html_to_text(markdown_to_html(LONG))
    assert not fake_openai.streams[0].completed

    fake_openai.script(streamed(text(AFTER), chunks=5, seconds=0.5))
    second = serve()
    await second.start()
    await wait_until(lambda: tg.visible(GROUP) == [AFTER])
    await asyncio.sleep(0.5)  # room for a duplicate to show up (there must be none)
    assert tg.visible(GROUP) == [AFTER]
    assert len(tg.sent_to(GROUP)) == 1  # the one message, edited into the answer
    assert second.proc is not None
    second.proc.send_signal(signal.SIGTERM)
    assert await second.wait() == 0
