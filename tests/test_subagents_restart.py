"""`bub-bot serve` as a real process: SIGKILL while a background subagent runs, then a
restart: the run starts again and its result reaches the Telegram chat exactly once."""

from __future__ import annotations

import asyncio
import signal

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram
from tests.subagent_harness import Router
from tests.test_telegram_restart import USER, serve, tg, wait_until

__all__ = ["serve", "tg"]  # fixtures, used by name


async def test_sigkill_during_background_subagent_then_one_result(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    router = Router(child_delays=(60.0,))
    fake_openai.default = router
    first = serve()
    await first.start()
    tg.push_update(tg.private_text(USER, "look into it in the background"))
    await wait_until(lambda: [m["text"] for m in tg.sent_to(USER)] == ["started it"])
    await wait_until(lambda: router.child_calls == 1)
    # Let the parent's reply be recorded as delivered (a kill between the send and its
    # record re-sends it after the restart: the channels' at-least-once edge, not this).
    await asyncio.sleep(1.0)
    first.kill()  # SIGKILL while the subagent's model call is in flight
    assert await first.wait() == -signal.SIGKILL

    second = serve()
    await second.start()
    await wait_until(lambda: len(tg.sent_to(USER)) >= 2)
    await asyncio.sleep(0.5)  # room for a duplicate to show up (there must be none)
    assert [m["text"] for m in tg.sent_to(USER)] == ["started it", "relay: child found 42"]
    assert router.child_calls == 2
    assert "restarted after the bot was interrupted" in router.relayed[0]
    assert len(router.relayed) == 1
    assert second.proc is not None
    second.proc.send_signal(signal.SIGTERM)
    assert await second.wait() == 0
