"""Whether a reply piece being sent may have reached the platform (re-exported by
`channels.base`).

The runtime wraps one piece's `send` / `deliver` / `ask` in `watch_send`; a channel calls
`request_leaving` the moment a request that may post the piece leaves (its pacer turn came,
the HTTP request is about to go) and `request_refused` when the platform provably posted
nothing. A send cancelled meanwhile (lease lost, shutdown) is then told apart: in flight, its
fate is unknown (never sent again); still waiting for its turn, it is safe to send again. An
in-process channel that cannot be cancelled between showing the piece and returning (the
terminal) needs no call; the web chat's piece is on the tape already (sending it again only
wakes the pages).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(slots=True)
class SendState:
    """Whether the piece being sent may have reached the platform (see `watch_send`)."""

    requests: int = 0
    """Requests that left for the platform, less those it provably refused (a 429, a 4xx
    answer, a connection never made)."""

    @property
    def left(self) -> bool:
        """A request that may have posted the piece left: a send cancelled now has an
        unknown fate (one cancelled while still waiting for its turn has none: resend it)."""
        return self.requests > 0


_SENDING: ContextVar[SendState | None] = ContextVar("bub_sending", default=None)


@contextlib.contextmanager
def watch_send() -> Iterator[SendState]:
    """The runtime, around one piece's `send` / `deliver` / `ask`: the channel reports each
    request the moment it leaves (`request_leaving`), so a send cancelled mid-request (lease
    lost, shutdown) is told from one cancelled while waiting in a pacer queue."""
    state = SendState()
    token = _SENDING.set(state)
    try:
        yield state
    finally:
        _SENDING.reset(token)


def request_leaving() -> None:
    """A channel calls this when a request that may post the piece leaves (its pacer turn
    came, the HTTP request is about to go); an in-process channel when it shows the piece.
    Outside `watch_send` (typing, a stream's own updates) it does nothing."""
    state = _SENDING.get()
    if state is not None:
        state.requests += 1


def request_refused() -> None:
    """The request last reported leaving provably posted nothing (a 429, a 4xx answer, a
    connection never made): a cancellation before the next one leaves is safe to resend."""
    state = _SENDING.get()
    if state is not None and state.requests > 0:
        state.requests -= 1
