"""Observation: whoever watches the runtime (metrics, the CLI) registers a callable; every
part of the runtime reports its events (inbound, lease, turn, reply, command, job, ...) here
directly, not through the `Runtime`, so the way of a message never returns to `core`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("bub_bot.runtime")

Observer = Callable[[str, dict[str, Any]], None]
"""Called with (event, data) for each event."""


class Observers(list[Observer]):
    """The registered observers (a list: `append` one); `emit` tells each of them."""

    def emit(self, event: str, **data: Any) -> None:
        """Tell every observer; one that raises is logged and the others still hear it."""
        for observer in self:
            try:
                observer(event, data)
            except Exception:
                log.exception("runtime observer failed on %s", event)
