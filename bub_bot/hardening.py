"""Process and file hardening done at start: other local users and processes the bot
starts (stdio MCP servers, commands) must not read its secrets or its tapes.

- `no_dump()`: `prctl(PR_SET_DUMPABLE, 0)`, so `/proc/<bot pid>/environ` (the tokens) and
  `/proc/<bot pid>/mem` become root's: a child running as the same user cannot read them.
- `private_dir(path)`: create a directory (BUB_HOME, the database's) `0700`.
- `private_files(paths)`: tighten existing files (the tape database, `-wal`, `-shm`,
  `-journal`) to `0600`; SQLite gives new journal files the database file's mode.
- `readable_by_others(path)`: the warning `doctor` shows for an existing readable home.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
DB_SUFFIXES = ("", "-wal", "-shm", "-journal")


def _prctl(option: int, arg: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return int(libc.prctl(option, arg, 0, 0, 0))


def no_dump() -> bool:
    """Make this process non-dumpable (Linux); True when it is. Never raises: a platform
    without prctl keeps working, with a log line."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _prctl(PR_SET_DUMPABLE, 0) != 0:
            log.warning(
                "hardening: prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno())
            )
            return False
        return _prctl(PR_GET_DUMPABLE, 0) == 0
    except (OSError, AttributeError) as exc:
        log.warning("hardening: cannot call prctl: %s", exc)
        return False


def private_dir(path: Path) -> None:
    """Create `path` (and missing parents) `0700`; an existing directory is left as the
    operator made it (`doctor` warns when others can read it)."""
    path = path.expanduser()
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; 0700 whatever it is


def database_files(database: Path) -> list[Path]:
    """The tape database and its journal files."""
    return [database.with_name(database.name + suffix) for suffix in DB_SUFFIXES]


def private_files(paths: Iterable[Path]) -> None:
    """Tighten the existing `paths` (regular files, not followed through symlinks) to 0600."""
    for path in paths:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
            try:
                os.chmod(path, 0o600)
            except OSError as exc:
                log.warning("hardening: cannot make %s private: %s", path, exc)


def create_private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 unless it exists (before SQLite opens it, so the
    database and the journals it makes never exist readable by others). Other failures
    are left for SQLite to report in its words."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    os.close(fd)


def readable_by_others(path: Path) -> str | None:
    """A warning when the existing directory `path` is group- or world-accessible."""
    try:
        mode = stat.S_IMODE(os.stat(path.expanduser()).st_mode)
    except OSError:
        return None
    if mode & 0o077:
        return (
            f"{path} is mode {mode:04o}: other local users can read the tapes and secrets"
            f" in it; run chmod 700 {path}"
        )
    return None


__all__ = [
    "create_private_file",
    "database_files",
    "no_dump",
    "private_dir",
    "private_files",
    "readable_by_others",
]
