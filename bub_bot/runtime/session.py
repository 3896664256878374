"""A conversation's in-memory bookkeeping while it has work; rebuilt from the tape."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from ..tape import Tape


@dataclass
class Session:
    """In-memory bookkeeping for one conversation while it has work; rebuilt from the tape."""

    id: str
    tape: Tape
    workspace: Path
    cursor: int | None = None
    """Newest inbound entry id that is handled (None: not read from the tape yet)."""
    dirty: bool = False
    running: bool = False
    barrier: int | None = None
    """Id of the first command waiting behind the running turn: later messages wait too."""
    task: asyncio.Task[None] | None = None
    leased: bool = False
    """This process holds the session's lease (several replicas on one database)."""
    needs_workspace: bool = False
    """Adopted by its lease alone: read the workspace its tape recorded before working."""
    adopted: str | None = None
    """Woken by its lease alone: "takeover" (it lapsed) or "handover" (it was handed over)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    claimed: asyncio.Event = field(default_factory=asyncio.Event)
    """Clear while a new worker tries to take the lease: `receive` waits for that attempt
    before the platform is acknowledged."""
    claim_error: Exception | None = None
    """Why that attempt failed (the database): `receive` fails too, so the platform retries."""

    def __post_init__(self) -> None:
        self.claimed.set()
