"""Who is watching which web conversation, and whether a turn runs there (in memory).

The tape is the record; the hub only wakes the open event streams of a conversation when
something happened (a message stored, an answer delivered, a turn started or ended), so
they read the new entries. `show` hands them the newest state of an answer still being
written (`partial.Partial`, never on the tape). With several replicas, what another replica
tells (`relay.py`) arrives here too: its turn's working state and partial answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator

from .partial import CLEARED, Partial

REMOTE_WORKING_SECONDS = 90.0
"""How long "another replica runs a turn here" holds unless that replica says it again (it
does every third of this while the turn runs): a replica that died mid-turn leaves no working
indicator behind for longer."""

PARTIAL_SHARE = 0.1
"""At most about this share of the server's time goes to partial answers (rendering and
encoding their events), across all conversations: under load they thin out (fewer, larger
steps) before finished answers wait. A reply's first text always goes."""
PARTIAL_BURST = 0.02
"""Seconds of that work the budget lets run ahead of its share (a burst of updates)."""


class Subscription:
    """One open event stream of a conversation."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.changed = False
        """The tape may have new entries (read them); False: only a partial answer or the
        working state to send, no database read needed."""
        self.partial: Partial | None = None
        """The newest state of the answer being written, not sent to this page yet (only the
        newest counts: a slow page skips the states it missed)."""


class Hub:
    """Wake-ups and working state per conversation id."""

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._busy: dict[str, int] = {}
        self._partials: dict[str, Partial] = {}
        self._remote: dict[str, tuple[str | None, float]] = {}
        """Conversations whose turn runs on another replica -> (that turn, until when)."""
        self.closed = False
        self._spent = 0.0
        """Seconds spent on partial answers not yet paid back by `PARTIAL_SHARE` (a leaky
        bucket that drains at that rate), as of `_spent_at` (monotonic)."""
        self._spent_at = 0.0

    @contextlib.contextmanager
    def subscribe(self, conversation: str) -> Iterator[Subscription]:
        sub = Subscription()
        sub.partial = self._partials.get(conversation)  # a page (re)connecting mid-answer
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

    def show(self, conversation: str, partial: Partial) -> None:
        """The answer being written in this conversation is now `partial` (CLEARED: none)."""
        if partial is CLEARED:
            if self._partials.pop(conversation, None) is None:
                return
        else:
            self._partials[conversation] = partial
        for sub in self._subs.get(conversation, ()):
            sub.partial = partial
            sub.wake.set()

    def charge(self, seconds: float) -> None:
        """`seconds` of this process's time went to a partial answer (see `PARTIAL_SHARE`)."""
        now = time.monotonic()
        self._spent = self._owed(now) + seconds
        self._spent_at = now

    def _owed(self, now: float) -> float:
        return max(0.0, self._spent - (now - self._spent_at) * PARTIAL_SHARE)

    def partials_welcome(self) -> bool:
        """Whether another partial answer fits the budget now (False: hold it back)."""
        return self._owed(time.monotonic()) <= PARTIAL_BURST

    def partial(self, conversation: str) -> Partial | None:
        """The answer being written in this conversation now, if any."""
        return self._partials.get(conversation)

    def busy(self, conversation: str) -> bool:
        """Whether a turn runs in this conversation, here or on another replica."""
        if self._busy.get(conversation, 0) > 0:
            return True
        remote = self._remote.get(conversation)
        if remote is None:
            return False
        if remote[1] > time.monotonic():
            return True
        self.remote_working(conversation, False)  # its replica stopped saying so (died)
        return False

    def remote_working(self, conversation: str, working: bool, turn: str | None = None) -> None:
        """Another replica started (or still runs) turn `turn` in this conversation, or ended
        it (which also takes its partial answer away). The end of another turn than the one
        running is late news (its replica lost the session) and changes nothing."""
        current = self._remote.get(conversation)
        if working:
            if len(self._remote) > 10_000:  # ends that were never heard
                now = time.monotonic()
                self._remote = {c: r for c, r in self._remote.items() if r[1] > now}
            self._remote[conversation] = (turn, time.monotonic() + REMOTE_WORKING_SECONDS)
        else:
            if current is not None and turn is not None and current[0] not in (None, turn):
                return
            self._remote.pop(conversation, None)
            if not self._busy.get(conversation):
                self.show(conversation, CLEARED)
        self._poke(conversation)

    @contextlib.asynccontextmanager
    async def working(self, conversation: str) -> AsyncIterator[None]:
        """The page's working indicator, on while the block runs. A turn here means no other
        replica runs one (one turn per conversation across replicas): a remote turn whose end
        was never heard (its replica died) is over."""
        self._remote.pop(conversation, None)
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
                self._remote.pop(conversation, None)
                # A turn that ended without a final delivery leaves no partial answer behind.
                self.show(conversation, CLEARED)
            self._poke(conversation)

    def close(self) -> None:
        """End every open stream (the server is stopping)."""
        self.closed = True
        for subs in self._subs.values():
            for sub in subs:
                sub.wake.set()
