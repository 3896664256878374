"""The tape viewer's links between a session and its subagents and forks: a tape's children
(temp and named subagent tapes, live forks and archived ones) and its parent."""

from __future__ import annotations

from typing import Any

from bub_bot.tape.names import ARCHIVE_SEP, FORK_SEP, SIDECAR_SEP

CHILD_MARKS = ("/temp/", "/agents/")
"""How a subagent's session id continues its parent's (bub_bot/agent/subagent.py)."""


def _kind(name: str, session_id: str | None, parent_session: str | None) -> str:
    if FORK_SEP in name:
        return "fork (archived)" if ARCHIVE_SEP in name else "fork"
    rest = (session_id or "")[len(parent_session or "") :]
    kind = "temp subagent" if rest.startswith("/temp/") else "named subagent"
    return kind + (" (archived)" if ARCHIVE_SEP in name else "")


async def children(store: Any, name: str, session_id: str | None) -> list[dict[str, Any]]:
    """The subagent tapes and forks under tape `name` (of session `session_id`)."""
    if SIDECAR_SEP in name or ARCHIVE_SEP in name:
        return []
    fork_prefix = name + FORK_SEP
    found = []
    for row in await store.list_tapes(include_all=True):
        if SIDECAR_SEP in row.name:
            continue
        child_session = row.session_id or ""
        is_fork = row.name.startswith(fork_prefix)
        is_child = bool(session_id) and any(
            child_session.startswith(session_id + mark) for mark in CHILD_MARKS
        )
        # Only direct children (a grandchild lists under its own parent).
        if is_child and any(m in child_session[len(session_id or "") + 1 :] for m in CHILD_MARKS):
            is_child = False
        if is_fork or is_child:
            found.append(
                {
                    "name": row.name,
                    "session_id": row.session_id,
                    "kind": _kind(row.name, row.session_id, session_id),
                    "entries": row.entries,
                    "updated": row.updated,
                }
            )
    return sorted(found, key=lambda c: c["updated"], reverse=True)


async def parent(store: Any, name: str, session_id: str | None) -> dict[str, Any] | None:
    """The tape a fork or a subagent's tape belongs under (None: a conversation's own)."""
    if FORK_SEP in name:
        return {"name": name.split(FORK_SEP, 1)[0], "kind": "forked from"}
    for mark in CHILD_MARKS:
        if session_id and mark in session_id:
            parent_session = session_id.rsplit(mark, 1)[0]
            tapes = await store.session_tapes(parent_session)
            if tapes:
                return {"name": tapes[0], "session_id": parent_session, "kind": "subagent of"}
    return None
