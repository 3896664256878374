"""Reading a workspace file the bot sends (`send_file`) without following a symlink anywhere
on its path: each directory is opened with O_NOFOLLOW|O_DIRECTORY beneath the last, the file
with O_NOFOLLOW, and only a regular file within the size cap is read."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath


class NotSendable(Exception):
    """The path names nothing the bot may send; the message says why."""


def read_workspace_file(workspace: Path, relpath: str, max_bytes: int) -> tuple[str, bytes]:
    """(file name, bytes) of `relpath` beneath `workspace`."""
    path = PurePosixPath(relpath.strip())
    if not relpath.strip() or path.is_absolute() or ".." in path.parts:
        raise NotSendable("give a path relative to the workspace, without '..'")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        raise NotSendable("give a file, not the workspace itself")
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(workspace, dir_flags)
    except OSError as exc:
        raise NotSendable(f"the workspace cannot be opened: {exc.strerror}") from exc
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, dir_flags, dir_fd=fd)
            except OSError as exc:
                raise NotSendable(f"{relpath}: no such directory (or a symlink)") from exc
            os.close(fd)
            fd = nxt
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            file_fd = os.open(parts[-1], flags, dir_fd=fd)
        except OSError as exc:
            raise NotSendable(f"{relpath}: no such file (or a symlink)") from exc
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise NotSendable(f"{relpath} is not a regular file")
        if st.st_size > max_bytes:
            raise NotSendable(f"{relpath} is {st.st_size} bytes; at most {max_bytes} can be sent")
        if st.st_size == 0:
            raise NotSendable(f"{relpath} is empty")
        return parts[-1], f.read(max_bytes + 1)[:max_bytes]
