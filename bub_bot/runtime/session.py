"""A conversation's in-memory bookkeeping while it has work, and the sessions of this process;
both rebuilt from the tape."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..tape import Tape, TapeStore


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


class Sessions:
    """The sessions this process has work for, by id. A session is kept while its worker runs
    (or is about to) and dropped when its queue is empty: the tape is the record."""

    def __init__(self, store: TapeStore, workspace: Path) -> None:
        self.store = store
        self.workspace = workspace
        """BUB_WORKSPACE: where a session works when nothing else says."""
        self._by_id: dict[str, Session] = {}
        self.closing = False
        """The process is shutting down: no worker starts, sessions are handed over."""

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def open(self, session_id: str, workspace: Path | None) -> Session:
        """The session, made (idle, its tape in `workspace`) if this process has none."""
        session = self._by_id.get(session_id)
        if session is None:
            ws = workspace or self.workspace
            session = self.add(
                Session(session_id, Tape.for_session(self.store, session_id, ws), ws)
            )
        return session

    def add(self, session: Session) -> Session:
        """Keep a new (idle) session."""
        session.idle.set()
        self._by_id[session.id] = session
        return session

    def drop(self, session_id: str) -> None:
        """Forget a session whose worker is done."""
        self._by_id.pop(session_id, None)

    def forget(self, session: Session) -> None:
        """Forget a session whose worker ends before it began (its lease was not taken):
        whoever waits for it stops waiting."""
        session.running = False
        session.dirty = False
        session.adopted = None
        session.idle.set()
        session.claimed.set()
        if self._by_id.get(session.id) is session:
            del self._by_id[session.id]

    @property
    def running(self) -> int:
        """How many sessions have a worker running."""
        return sum(1 for s in self._by_id.values() if s.running)
