"""Who is watching which web conversation, and whether a turn runs there (in memory).

The tape is the record; the hub only wakes the open event streams of a conversation when
something happened (a message stored, an answer delivered, a turn started or ended), so
they read the new entries. `push` carries events that are not on the tape (the streaming
delivery's partial text, later) straight to the streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Iterator
from typing import Any


class Subscription:
    """One open event stream of a conversation."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.changed = False
        """The tape may have new entries (read them); False: only pushed events or the
        working state to send, no database read needed."""
        self.pushed: deque[tuple[str, dict[str, Any]]] = deque(maxlen=256)

    def drain(self) -> list[tuple[str, dict[str, Any]]]:
        items = list(self.pushed)
        self.pushed.clear()
        return items


class Hub:
    """Wake-ups and working state per conversation id."""

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._busy: dict[str, int] = {}
        self.closed = False

    @contextlib.contextmanager
    def subscribe(self, conversation: str) -> Iterator[Subscription]:
        sub = Subscription()
        self._subs[conversation].add(sub)
        try:
            yield sub
        finally:
            subs = self._subs.get(conversation)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[conversation]

    def watchers(self, conversation: str) -> int:
        return len(self._subs.get(conversation, ()))

    def notify(self, conversation: str) -> None:
        """Something was written to this conversation's tape: let its streams read it."""
        for sub in self._subs.get(conversation, ()):
            sub.changed = True
            sub.wake.set()

    def _poke(self, conversation: str) -> None:
        for sub in self._subs.get(conversation, ()):
            sub.wake.set()

    def push(self, conversation: str, event: str, data: dict[str, Any]) -> None:
        """Send an event that is not on the tape to every open stream of the conversation."""
        for sub in self._subs.get(conversation, ()):
            sub.pushed.append((event, data))
            sub.wake.set()

    def busy(self, conversation: str) -> bool:
        return self._busy.get(conversation, 0) > 0

    @contextlib.asynccontextmanager
    async def working(self, conversation: str) -> AsyncIterator[None]:
        """The page's working indicator, on while the block runs."""
        self._busy[conversation] = self._busy.get(conversation, 0) + 1
        self._poke(conversation)
        try:
            yield
        finally:
            left = self._busy.get(conversation, 1) - 1
            if left > 0:
                self._busy[conversation] = left
            else:
                self._busy.pop(conversation, None)
            self._poke(conversation)

    def close(self) -> None:
        """End every open stream (the server is stopping)."""
        self.closed = True
        for subs in self._subs.values():
            for sub in subs:
                sub.wake.set()
