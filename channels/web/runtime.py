"""What the web channel's routes use of the runtime beyond the channel contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from bub_bot.tape import Tape
from channels.base import RuntimeLike


class WebRuntime(RuntimeLike, Protocol):
    """What the web channel uses beyond the contract: the tape store (history and viewer,
    read-only), where the runtime keeps a session (its tape and workspace: BUB_WORKSPACE_MAP
    may put each conversation elsewhere) and the agent (its tools, for "context now")."""

    store: Any
    agent: Any
    budgets: Any
    """Usage counters and the calendar they count in (the viewer's usage pages)."""

    async def session_tape(self, session_id: str) -> Tape: ...

    async def tape_workspace(self, tape: Tape) -> Path: ...
