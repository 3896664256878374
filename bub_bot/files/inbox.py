"""Writing a received file beneath `<workspace>/inbox/` without following a symlink out.

The name is ours, never the sender's verbatim: a date, a hash of (tape, entry, index) and a
cleaned stem, so it is unique, cannot traverse, never overwrites, and is the same on every
attempt (a restart mid-download finds the finished file instead of saving a second copy).
The bytes go to a hidden part file created with O_CREAT|O_EXCL|O_NOFOLLOW in the inbox
directory (opened beneath the workspace with no symlink followed, `bub_bot/beneath.py` as the
workspace-files module does), then are linked to the final name (which fails rather than
replace anything) — one atomic step. `WorkspaceFiles.save_new` is not used: it takes the whole
file in memory and picks another name when one is taken, where a resumed download must find
the file an earlier attempt finished (same name) instead of saving a second copy."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import unicodedata
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from ..beneath import make_dirs_beneath, open_beneath

INBOX = "inbox"
SNIFF_BYTES = 8192
"""How much of a file its type is sniffed from."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class InboxError(Exception):
    """The inbox cannot be written (a symlink or non-directory where it should be, …)."""


class TooLarge(Exception):
    """More bytes came than the cap allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Saved:
    """A file in the inbox: its path relative to the workspace and its size."""

    relpath: str
    size: int
    reused: bool = False
    """True: an earlier attempt had saved it already (nothing was downloaded again)."""


def safe_stem(name: str, limit: int = 60) -> str:
    """A sender's file name reduced to a harmless stem: ASCII letters, digits, `._-`, no
    leading dots, no directories, at most `limit` characters; "file" if nothing is left."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = unicodedata.normalize("NFKD", base).encode("ascii", "ignore").decode()
    stem = base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base
    stem = _UNSAFE.sub("-", stem).strip("-._")[:limit].strip("-._")
    return stem or "file"


def inbox_prefix(key: str, day: str, sender_name: str) -> str:
    """The name of one attachment without its extension: `<day>-<hash of key>-<stem>`."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{day}-{digest}-{safe_stem(sender_name)}"


def _open_inbox(workspace: Path) -> int:
    """The inbox directory (created if missing) as an fd, refusing symlinks on the way
    (`beneath.make_dirs_beneath`, the workspace-files module's own walk)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        root = os.open(workspace, flags)
    except OSError as exc:
        raise InboxError(f"workspace {workspace} cannot be opened: {exc.strerror}") from exc
    try:
        return make_dirs_beneath(root, (INBOX,), 0o750)
    except OSError as exc:
        raise InboxError(f"{INBOX}/ is not a directory of the workspace") from exc
    finally:
        os.close(root)


def _create_excl(dir_fd: int, name: str) -> int:
    """Create `name` in `dir_fd`; never follows a symlink, never reuses a file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, 0o640, dir_fd=dir_fd)


def existing(workspace: Path, prefix: str) -> Saved | None:
    """The finished file `<prefix>.*` in the inbox if an earlier attempt saved it."""
    try:
        fd = _open_inbox(workspace)
    except InboxError:
        return None
    try:
        for name in os.listdir(fd):
            if name == prefix or name.startswith(prefix + "."):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    return Saved(f"{INBOX}/{name}", st.st_size, reused=True)
        return None
    finally:
        os.close(fd)


async def save(
    workspace: Path,
    prefix: str,
    chunks: AsyncIterator[bytes],
    max_bytes: int,
    extension: Callable[[bytes], str],
) -> Saved:
    """Write `chunks` as `inbox/<prefix><extension(first bytes)>`; raises TooLarge past
    `max_bytes`, InboxError if the inbox is unsafe, and whatever the chunks raise — in each
    case nothing is kept. A file an earlier attempt finished is returned as it is."""
    found = existing(workspace, prefix)
    if found is not None:
        return found
    dir_fd = _open_inbox(workspace)
    part = f".part-{prefix}"
    try:
        try:
            os.unlink(part, dir_fd=dir_fd)  # left by an attempt that died mid-download
        except FileNotFoundError:
            pass
        fd = _create_excl(dir_fd, part)
        size = 0
        try:
            with os.fdopen(fd, "r+b", closefd=True) as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise TooLarge(max_bytes)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
                name = prefix + extension(os.pread(out.fileno(), SNIFF_BYTES, 0))
            # link(2) never replaces an existing name: the final file appears whole or not.
            os.link(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            try:
                os.unlink(part, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        os.fsync(dir_fd)
        return Saved(f"{INBOX}/{name}", size)
    finally:
        os.close(dir_fd)


def read_head(workspace: Path, relpath: str, limit: int) -> bytes:
    """Up to `limit` bytes of a file we saved (opened beneath the workspace, no symlink)."""
    name = relpath.split("/", 1)[1]
    with os.fdopen(_open_saved(workspace, name), "rb") as f:
        return f.read(limit)


def _open_saved(workspace: Path, name: str) -> int:
    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return open_beneath(root, (INBOX, name), os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(root)
