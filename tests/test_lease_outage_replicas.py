"""Two `bub-bot serve` replicas on the real PostgreSQL of the tests; replica A reaches the
database through a `TcpProxy` that the test cuts (black-holed, like a network outage) while
A streams an answer into a Telegram group, and restores later. A stops its turn before its
lease lapses (logged `lease.lost`), B takes the session over and edits the partial message
into its answer: the group shows one complete answer, once. A also led the Telegram poller:
it stops polling before that lease lapses, and B polls from then on, never both at once."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from channels.telegram_format import html_to_text, markdown_to_html
from tests.fakes.openai_server import FakeOpenAI, streamed, text
from tests.fakes.telegram_api import FakeTelegram
from tests.tcp_proxy import TcpProxy
from tests.test_replicas import replicas, tg, wait_until

__all__ = ["replicas", "tg"]  # fixtures

GROUP = -100555
USER = 77
LONG = "This answer streams slowly, word after word, while the database goes away. " * 4
AFTER = "The answer, written by the replica that took over."
POLLER = 'bub_leading{job="telegram:poller:123456"}'


async def test_a_replica_cut_from_the_database_mid_stream_stops_and_one_answer_shows(
    replicas, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    streaming = {
        "BUB_STREAM": "on",
        "BUB_STREAM_INTERVAL_MS": "150",
        "BUB_TELEGRAM_RATE_CHAT": "1/0.05s",
        "BUB_TELEGRAM_RATE_GROUP": "20/3s",
    }
    b = replicas(**streaming)
    database = b.env["BUB_DATABASE_URL"]
    parts = urlsplit(database)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        # Long polling: A starts first and leads the poller, so A also runs the turn.
        a = await replicas(**streaming, BUB_DATABASE_URL=proxy.route(database)).start()
        await wait_until(lambda: bool(tg.calls_of("getUpdates")))
        await b.start()
        assert await a.metric(POLLER) == 1 and await b.metric(POLLER) == 0
        fake_openai.script(
            streamed(text(LONG), chunks=40, seconds=8.0),
            streamed(text(AFTER), chunks=5, seconds=0.5),
        )
        tg.push_update(tg.group_text(GROUP, USER, "@bub_replica_bot tell me slowly"))
        # The partial message is posted, then edited: by then its id is on the tape.
        await wait_until(lambda: len(tg.calls_of("editMessageText")) >= 1)
        proxy.cut()
        cut_at = time.monotonic()
        # B takes over when A's leases lapse (the poller's and the conversation's) and edits
        # the partial into its answer.
        await wait_until(lambda: tg.visible(GROUP) == [AFTER], timeout=30)
        await asyncio.sleep(max(0.0, cut_at + 7.5 - time.monotonic()))
        proxy.restore()
        # A's stream would have ended 8 s after it began: room for its edits (none come).
        await asyncio.sleep(3.0)
        assert tg.visible(GROUP) == [AFTER]
        assert len(tg.sent_to(GROUP)) == 1  # the one message, edited into the answer
        assert html_to_text(markdown_to_html(LONG)) not in tg.visible(GROUP)
        assert not fake_openai.streams[0].completed
        assert len(fake_openai.completion_requests()) == 2
        # B polls now, and A stopped polling before B began: never two pollers at once
        # (Telegram would have answered one of them 409 Conflict).
        tg.push_update(tg.private_text(USER, "still there?"))
        await wait_until(lambda: len(tg.sent_to(USER)) == 1)
        assert await b.metric(POLLER) == 1 and await a.metric(POLLER) == 0
        log = a.log.read_text()
        assert f"lease.lost session=telegram:{GROUP} reason=not_renewed_in_time" in log
        assert "lease.lost job=telegram:poller:123456 reason=not_renewed_in_time" in log
        for replica in (a, b):
            assert "telegram.poll conflict" not in replica.log.read_text()
