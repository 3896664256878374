"""The web chat's streaming delivery (the `ReplyStream` contract): the answer on the page
while the model writes it.

Nothing partial is stored: the stream hands the newest state of the reply (`Partial`: the
text so far, or what the bot is doing) to the `Hub`, which keeps one per conversation and
wakes its open event streams; each sends only the newest state it has not sent yet, so a slow
page skips stale states instead of queueing them. The text is rendered once per state, by
the same server-side Markdown renderer as the final answer (raw HTML off), and only when a
page watches. The final answer reaches the page from the tape as before (`WebChannel.send`)
and replaces the partial one.

A page holds nothing that outlives the process, so `shown` stays empty: after a crash the
resumed turn simply streams again to the pages that reconnect. Pages connected to other
replicas get the states through the `Relay` (`relay.py`), the text at most every 0.3 s and
while it is short enough for a database notice.
"""

from __future__ import annotations

import asyncio
import re
import time

from .hub import Hub
from .partial import CLEARED, Partial
from .relay import Relay

INTERVAL = 0.1
"""Seconds between two partial updates of one conversation by default: an update is one small
SSE event on a connection that is open anyway, so the limit is the server's rendering work
(`BUB_STREAM_INTERVAL_MS` overrides it); with many answers written at once the hub's budget
(`hub.PARTIAL_SHARE`) spaces them further."""
RENDER_SHARE = 0.05
"""At most this share of the server's time renders one conversation's growing answer: the
whole text is rendered again for each update (about 0.7 ms per KB), so a long answer is
updated less often (a 20 KB one about every 0.3 s) instead of using up a core."""

RELAY_INTERVAL = 0.3
"""Seconds between two partial texts of one reply relayed to the other replicas (statuses and
the end always go): each is a database notice every replica hears."""


_FENCE_START = re.compile(r"(?:^|\n)[ ]{0,3}(?:`{1,2}|~{1,2})$")


def tidy(text: str) -> str:
    """The text as the page shows it while it grows: a last line that is the start of a code
    fence (one or two backticks) waits for the rest, instead of flashing up as text."""
    match = _FENCE_START.search(text)
    return text[: match.start()] if match else text


class WebStream:
    """One reply to a web conversation, shown while it is written (see the module)."""

    interval = INTERVAL

    def __init__(self, hub: Hub, conversation: str, relay: Relay | None = None) -> None:
        self.hub = hub
        self.conversation = conversation
        self.relay = relay
        self._told = 0.0
        """When a partial text was last relayed to the other replicas (monotonic)."""
        self.shown: list[str | None] = []  # nothing on a page survives a restart
        self._last: tuple[str, str] = ("", "")
        self._partial = CLEARED
        self._at = 0.0
        self._texts = 0
        """Texts of this reply shown so far (its first goes whatever the hub's budget)."""
        self._trailing: asyncio.Task[None] | None = None
        """Relays the newest text once the interval is over (a throttled text is late, never
        lost)."""

    async def _show(self, text: str = "", status: str = "") -> None:
        if (text, status) == self._last:
            return  # the same state again (e.g. a step's tools reported twice)
        self._last = (text, status)
        self._partial = Partial(text, status) if text or status else CLEARED
        self._at = time.monotonic()
        self.hub.show(self.conversation, self._partial)
        await self._relay(throttle=bool(text))

    async def _relay(self, throttle: bool = False) -> None:
        """Hand the state to the pages on other replicas (a text at most every
        `RELAY_INTERVAL`: the final answer follows anyway)."""
        if self.relay is None:
            return
        if throttle and self._at - self._told < RELAY_INTERVAL:
            if self._trailing is None or self._trailing.done():
                wait = RELAY_INTERVAL - (self._at - self._told)
                self._trailing = asyncio.get_running_loop().create_task(self._relay_later(wait))
            return
        if await self.relay.partial(self.conversation, self._partial) and throttle:
            self._told = self._at

    async def _relay_later(self, wait: float) -> None:
        await asyncio.sleep(wait)
        if self.relay is None or not self.hub.busy(self.conversation):
            return  # the turn is over here: its end was relayed, a late text would linger
        if await self.relay.partial(self.conversation, self._partial):
            self._told = time.monotonic()

    async def update(self, text: str) -> bool:
        if time.monotonic() - self._at < self._partial.cost / RENDER_SHARE:
            return False  # rendering the last one took long: the runtime offers it again
        if self._texts and not self.hub.partials_welcome():
            # The server is busy with many answers: this one's first text went, the next
            # waits (a later, longer one replaces it) and the final answer comes anyway.
            return False
        await self._show(text=tidy(text))
        self._texts += 1
        return True

    async def status(self, text: str) -> None:
        await self._show(status=text)

    async def reset(self) -> None:
        await self._show()

    async def deliver(self, index: int, piece: str) -> list[str] | None:
        return None  # the answer is on the tape: `WebChannel.send` wakes the pages

    async def end(self, pieces: int) -> list[str]:
        if self._trailing is not None:
            self._trailing.cancel()
        self._last = ("", "")
        self._partial = CLEARED
        self.hub.show(self.conversation, CLEARED)
        await self._relay()
        return []
