"""Where a conversation's tape lives: its workspace (BUB_WORKSPACE_MAP, decided once when the
session starts and recorded on its `session/start` anchor) and whether its session id was moved
to continue another session's tape (a Telegram group that became a supergroup).

A move is forever, so "moved" is cached for good; "not moved" is not: with several replicas
another one may record the move at any time. Each replica re-reads a "not moved" older than
`MOVE_RECHECK_SECONDS` (the guarantee) and drops it at once when another replica broadcasts
the move (`MOVED_TOPIC`, best effort: makes it immediate). With one process (SQLite) every
move goes through this object, so "not moved" is kept."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..config import Settings
from ..tape import BOOTSTRAP_ANCHOR, Tape, TapeEntry, TapeStore
from ..workspaces import load_workspace_map

log = logging.getLogger("bub_bot.runtime")

MOVED_ANCHOR = "session/moved"
MOVED_TOPIC = "session.moved"
"""Broadcast by the replica that records a move: `{"from": new, "to": old}`."""
MOVE_RECHECK_SECONDS = 2.0
"""How long a replica trusts "not moved" for a session when other replicas may move it."""


class Placement:
    """Decides and remembers, per session id, the workspace and the tape it continues."""

    def __init__(
        self,
        settings: Settings,
        store: TapeStore,
        *,
        shared: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`shared`: other replicas may record moves, so "not moved" is re-checked."""
        self.settings = settings
        self.store = store
        self.shared = shared
        self.announce: Callable[[str, str], Awaitable[None]] | None = None
        """Tells the other replicas `(topic, data)` (`Replicas.broadcast`): a move recorded
        here (`MOVED_TOPIC`); whoever wires the runtime sets it, with `heard_move` as the
        subscriber."""
        self._clock = clock
        self.workspaces = load_workspace_map(settings.workspace_map, settings.workspace)
        self._workspaces: dict[str, Path] = {}
        """Workspaces decided for sessions seen by this process (BUB_WORKSPACE_MAP)."""
        self._moved: dict[str, tuple[str | None, float]] = {}
        """Session id -> (the session whose tape it continues, or None: not moved; when that
        was read, monotonic)."""

    async def locate(
        self, session_id: str, given: Path | None = None, *, assign: bool = True
    ) -> tuple[str, Path]:
        """Where messages for `session_id` go: the session whose tape it continues (itself, or
        the one it was moved to) and that session's workspace (`workspace_for`)."""
        workspace = await self.workspace_for(session_id, given, assign=assign)
        moved = await self.moved_to(session_id, workspace)
        if moved is None:
            return session_id, workspace
        return moved, await self.workspace_for(moved, given, assign=assign)

    async def session_tape(self, session_id: str, workspace: Path | None = None) -> Tape:
        """The tape `receive` stores this session's messages on. Only looks: a session not
        seen yet gets no workspace decided or directory created."""
        session_id, workspace = await self.locate(session_id, workspace, assign=False)
        return Tape.for_session(self.store, session_id, workspace)

    async def workspace_for(
        self, session_id: str, given: Path | None, *, assign: bool = True
    ) -> Path:
        """The session's workspace: the channel's choice, else the one it started in (a
        changed BUB_WORKSPACE_MAP applies to new sessions only), else the map's rule.
        `assign=False`: a new session's would-be workspace, neither created nor remembered."""
        if given is not None:
            return given
        if not self.workspaces.rules:
            return self.settings.workspace
        known = self._workspaces.get(session_id)
        if known is not None:
            return known
        rule = self.workspaces.rule_for(session_id)
        planned = rule.directory(session_id) if rule is not None else self.settings.workspace
        found: Path | None = None
        names = await self.store.session_tapes(session_id)
        if names:
            if Tape.for_session(self.store, session_id, planned).name in names:
                found = planned
            else:  # started before the map changed: it stays where it started
                found = await self.recorded_workspace(Tape(self.store, names[-1], session_id))
        if found is None:
            if not assign:
                return planned
            found = self.workspaces.resolve(session_id)
            log.info("workspace.assigned session=%s workspace=%s", session_id, found)
        if len(self._workspaces) < 100_000:
            self._workspaces[session_id] = found
        return found

    async def move(self, old: str, new: str, workspace: Path | None = None) -> None:
        """From now on, messages for session `new` continue the tape of `old` (a Telegram
        group that became a supergroup has a new chat id but is the same conversation).

        Recorded on the tapes (an anchor on `new`'s tape, read by every process and after a
        restart; an event on `old`'s for the record), so it survives restarts. Idempotent."""
        old = await self.moved_to(old, workspace) or old
        if old == new or await self.moved_to(new, workspace) == old:
            return
        ws = workspace or self.settings.workspace
        await Tape.for_session(self.store, new, ws).append(
            TapeEntry.anchor(MOVED_ANCHOR, {"to": old})
        )
        await Tape.for_session(self.store, old, ws).append(
            TapeEntry.event("session.moved", {"from": new}, context=False)
        )
        self._moved[new] = (old, self._clock())
        log.info("session.moved session=%s from=%s", old, new)
        if self.announce is not None:
            await self.announce(MOVED_TOPIC, json.dumps({"from": new, "to": old}))

    def heard_move(self, data: str) -> None:
        """Another replica recorded a move (a `MOVED_TOPIC` broadcast): forget what this one
        cached about the session that moved, so its next message reads the move."""
        try:
            moved = json.loads(data)
            self._moved.pop(str(moved["from"]), None)
        except (ValueError, KeyError, TypeError):
            log.warning("session.moved notice unreadable (%d bytes)", len(data))

    async def moved_to(self, session_id: str, workspace: Path | None) -> str | None:
        """The session whose tape `session_id` continues, if it was moved (cached; "not
        moved" only for `MOVE_RECHECK_SECONDS` when other replicas may move it)."""
        cached = self._moved.get(session_id)
        if cached is not None:
            target, read_at = cached
            if target is not None or not self.shared:
                return target
            if self._clock() - read_at < MOVE_RECHECK_SECONDS:
                return None
        tape = Tape.for_session(self.store, session_id, workspace or self.settings.workspace)
        found = await tape.query(kinds=["anchor"], names=[MOVED_ANCHOR], limit=1)
        target = found[0].payload.get("state", {}).get("to") if found else None
        moved = target if isinstance(target, str) and target else None
        if moved is not None or session_id in self._moved or len(self._moved) < 100_000:
            self._moved[session_id] = (moved, self._clock())
        return moved

    async def recorded_workspace(self, tape: Tape) -> Path:
        """The workspace the session's `session/start` anchor recorded (else BUB_WORKSPACE)."""
        anchors = await tape.query(kinds=["anchor"], names=[BOOTSTRAP_ANCHOR], limit=1)
        recorded = anchors[0].payload.get("state", {}).get("workspace") if anchors else None
        return Path(recorded) if isinstance(recorded, str) and recorded else self.settings.workspace
