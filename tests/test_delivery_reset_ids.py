"""A reply id reused after a /reset is not taken for this replica's own (regression, review 17).

`Records.began_here` once told "this process sent this reply" by the tape's name and the
reply's id, but a /reset starts the tape again under the same name with ids from 1: the first
answer after a /reset had the id of an answer this replica delivered before the reset. Replica
B answers in a conversation; /reset; replica A answers the next question and loses the
database right after the platform took it. B takes over; it must not believe the reply its own
(it is keyed by the delivery key, which includes the reply's date): it waits for A's record,
and the chat shows the answer once. (The same conversation without the earlier answer on B:
tests/test_delivery_takeover.py.)"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.runtime_channel import RuntimeChannel, until
from tests.tcp_proxy import TcpProxy
from tests.test_delivery_cancelled_send import replica

__all__ = ["replica"]  # fixtures


class CutAfterPost(RuntimeChannel):
    """The platform takes the piece; then this replica's database connection breaks."""

    def __init__(self, cut: TcpProxy) -> None:
        super().__init__()
        self.cut = cut
        self.armed = False

    async def send(self, target: dict[str, Any], piece: str) -> list[str]:
        ids = await super().send(target, piece)
        if self.armed:
            self.armed = False
            self.cut.cut(reset=True)
        return ids


async def test_a_reply_id_reused_after_reset_is_not_taken_for_ones_own(
    replica, pg_proxy: TcpProxy, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bub_bot.runtime")
    ch1, ch2 = CutAfterPost(pg_proxy), RuntimeChannel()
    a = await replica("one", ch1, proxied=True)
    b = await replica("two", ch2)
    await ch2.say("/reset", key="r1")
    await ch2.say("before", key="k1")
    await ch2.wait_sent("a", 2, timeout=15)
    await ch2.say("/reset", key="r2")
    await ch2.wait_sent("a", 3, timeout=15)
    await until(lambda: not b.sessions, timeout=10)  # B gave the lease back
    ch1.armed = True
    await ch1.say("question", key="k2")
    await ch1.wait_sent("a", 1, timeout=15)
    await until(lambda: "lease.takeover" in caplog.text, timeout=10)  # B took it over
    pg_proxy.restore()  # A is back in time to record what it sent
    await until(lambda: not a.delivery.records.waiting, timeout=10)
    await until(lambda: not b.sessions, timeout=10)
    await asyncio.sleep(0.5)
    answers = [t for t in ch1.texts("a") + ch2.texts("a") if t == "echo: question"]
    assert answers == ["echo: question"], caplog.text[-3000:]
