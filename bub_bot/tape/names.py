"""How tapes are named: per workspace and session, sidecars beside them, archives apart."""

from __future__ import annotations

import functools
import hashlib
from datetime import UTC, datetime
from pathlib import Path

SIDECAR_SEP = "__sidecar__"
ARCHIVE_SEP = "__archive__"
FORK_SEP = "__fork__"


def _md5_16(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()[:16]


def tape_name(session_id: str, workspace: str | Path) -> str:
    """The session tape's name: the same session id in another workspace is another tape."""
    return f"{_workspace_key(str(workspace))}__{_md5_16(session_id)}"


@functools.lru_cache(maxsize=1024)
def _workspace_key(workspace: str) -> str:
    # Resolving costs a system call per path component, on every message; a process has a
    # few workspaces, and a session's tape must keep its name while the process runs anyway.
    return _md5_16(str(Path(workspace).resolve()))


def sidecar_name(tape: str, name: str) -> str:
    """The sibling tape that holds `name` data (e.g. spilled tool output) for `tape`."""
    return f"{tape}{SIDECAR_SEP}{name}"


def archive_name(tape: str, when: datetime | None = None) -> str:
    """A fresh archive name for `tape`; its sidecars keep their suffix after it."""
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{tape}{ARCHIVE_SEP}{stamp}"


def fork_name(tape: str, tag: str) -> str:
    """The name of fork `tag` of `tape` (its sidecars follow it: `<fork>__sidecar__<name>`)."""
    return f"{tape}{FORK_SEP}{tag}"


def tape_role(name: str) -> str:
    """'archive', 'sidecar', 'fork' or 'live', read from the name alone."""
    if ARCHIVE_SEP in name:
        return "archive"
    if SIDECAR_SEP in name:
        return "sidecar"
    if FORK_SEP in name:
        return "fork"
    return "live"
