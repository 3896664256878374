"""A `bub-bot serve` process SIGKILLed in the middle of downloading a file: after a restart the
download starts over, the file is saved once, the model gets it once, and the user one answer."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests import test_telegram_restart
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram

USER = test_telegram_restart.USER
serve = test_telegram_restart.serve  # the serve-process fixtures
tg = test_telegram_restart.tg
wait_until = test_telegram_restart.wait_until


async def test_sigkill_during_a_download_resumes_and_never_doubles(
    serve, tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    data = ("line of a long log file\n" * 20_000).encode()  # 480 KB
    tg.file_stall = 64 * 1024
    first = serve()
    await first.start()
    tg.push_update(tg.file_message(USER, "document", "L1", data, caption="any errors?",
                                   file_name="app.log"))  # fmt: skip
    inbox = tmp_path / "inbox"
    await wait_until(
        lambda: inbox.exists() and any(p.name.startswith(".part-") for p in inbox.iterdir())
    )
    first.kill()  # SIGKILL with the part file half written
    assert await first.wait() == -signal.SIGKILL
    assert fake_openai.completion_requests() == []

    tg.file_stall = None
    tg.file_release.set()
    second = serve()
    await second.start()
    await wait_until(lambda: len(tg.sent_to(USER)) >= 1)
    await asyncio.sleep(0.5)  # room for a duplicate to show up (there must be none)
    assert len(tg.sent_to(USER)) == 1
    [saved] = list(inbox.iterdir())  # no part file left, one copy
    assert saved.name.endswith("-app.log") and saved.read_bytes() == data
    [request] = fake_openai.completion_requests()
    files = [m for m in request.body["messages"] if "saved as inbox/" in str(m.get("content"))]
    assert len(files) == 1
    assert tg.file_downloads == ["documents/L1", "documents/L1"]
    assert second.proc is not None
    second.proc.send_signal(signal.SIGTERM)
    assert await second.wait() == 0
