"""Wrong access tokens per client address, in a sliding window (in memory, per process):
what slows down guessing the web chat's token (see `auth.py`)."""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger("channels.web")

MAX_FAILURES = 10
"""Wrong tokens one client address may present within `WINDOW` seconds."""
WINDOW = 60.0
MAX_CLIENTS = 10_000
"""Addresses tracked at most (the oldest are forgotten first): a flood of addresses cannot
grow the server's memory."""


def client_key(request: web.Request) -> str:
    """Who is guessing: the peer address; for IPv6 its /64 (one host usually has a whole
    /64). Behind a reverse proxy every client shares the proxy's address."""
    remote = request.remote or ""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailedAttempts:
    """Wrong tokens per client within a sliding window (in memory, per process)."""

    def __init__(
        self,
        limit: int = MAX_FAILURES,
        window: float = WINDOW,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str) -> deque[float] | None:
        failures = self._failures.get(key)
        if failures is None:
            return None
        horizon = self.clock() - self.window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[key]
            return None
        return failures

    def retry_after(self, key: str) -> int:
        """Seconds until `key` may present a token again; 0: now."""
        failures = self._recent(key)
        if failures is None or len(failures) < self.limit:
            return 0
        # Free again when the oldest failure that keeps it at the limit leaves the window.
        oldest = failures[len(failures) - self.limit]
        return max(1, math.ceil(oldest + self.window - self.clock()))

    def fail(self, key: str) -> None:
        """Count a wrong token from `key`."""
        failures = self._recent(key)
        if failures is None:
            failures = self._failures[key] = deque(maxlen=self.limit)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)
        failures.append(self.clock())
        self._failures.move_to_end(key)
        if len(failures) == self.limit:
            log.warning(
                "web.login_limited client=%s failures=%d window_s=%.0f",
                key,
                self.limit,
                self.window,
            )

    def succeed(self, key: str) -> None:
        """A right token: earlier mistakes of `key` are forgiven."""
        self._failures.pop(key, None)
