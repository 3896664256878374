"""Prometheus metrics (filled in by the deploy/operate work); a no-op hook for now."""

from __future__ import annotations

from typing import Any


def install(bot: Any) -> None:
    """Attach metrics to a bot (observers and the /metrics route)."""
    return None
