"""One state of a web reply being written (`Partial`): what the hub keeps per conversation,
the relay carries between replicas, and the stream (`stream.py`) produces. Never on the tape."""

from __future__ import annotations

import time
from typing import Any

from .render import markdown


class Partial:
    """One state of a reply being written: its text so far, or a status ("using fs.read…"),
    or neither (cleared: the page takes the partial reply away)."""

    __slots__ = ("_payload", "cost", "status", "text")

    def __init__(self, text: str = "", status: str = "") -> None:
        self.text = text
        self.status = status
        self.cost = 0.0
        """Seconds its rendering took (0: not rendered, no page watched)."""
        self._payload: dict[str, Any] | None = None

    def payload(self) -> dict[str, Any]:
        """The `partial` event's data, rendered on first use (once for every page)."""
        if self._payload is None:
            started = time.perf_counter()
            html = markdown(self.text) if self.text.strip() else ""
            self._payload = {"html": html, "status": self.status}
            self.cost = time.perf_counter() - started
        return self._payload


CLEARED = Partial()
