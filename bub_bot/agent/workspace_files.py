"""The one safe way to read, write and list files beneath a workspace; every file tool
(fs.read, fs.list, fs.write, fs.edit, skills, inbox attachments) goes through it.

API (all synchronous: run them in a thread from async code):

- `split_path(path)` – the model's relative path as components; absolute paths and `..`
  are `WorkspaceError`.
- `open_file(root, path, policy)` – an `Opened` (read-only descriptor + resolved parts) of
  a regular file beneath `root`, after the checks below. The caller closes it.
- `read_file(root, path, max_bytes, policy)` – its bytes (`WorkspaceError` past max_bytes).
- `write_file_atomic(root, path, data, policy)` – create or replace a file: parents made
  beneath `root`, an `O_EXCL` temp file beside it, fsync, rename over the name. A crash
  leaves the old file or the new one, never half of one. Never writes through a symlink.
- `list_dir(root, path, policy)` – sorted names, directories ending in `/`.
- `check_secret(parts)` – refuse secret-looking names (`bub_bot.secrets`).

Checks on every open: the path is resolved beneath `root` without following a link out
(`beneath.py`, safe against a directory swapped for a symlink meanwhile); the name asked
for and the name resolved to must not be secret files; the target must not be bub-bot's
own data (`FilePolicy.protected`: BUB_HOME, the tape database and its journals); a regular
file with more than one hard link is refused unless `FilePolicy.allow_hardlinks` (we cannot
cheaply find a hard link's other names, so `notes.txt` linked to `.env` would pass a name
check: refusing all of them is the safe choice; BUB_FS_ALLOW_HARDLINKS lifts it).
"""

from __future__ import annotations

import errno
import os
import secrets as token
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..secrets import secret_path_match
from .beneath import Opened, OutsideRoot, open_beneath, walk

LIST_LIMIT = 1000


class WorkspaceError(Exception):
    """A refused or failed file operation; the message is for the model (names the path)."""


@dataclass(frozen=True, slots=True)
class FilePolicy:
    """What an operator decides about file access beneath a workspace."""

    protected: tuple[Path, ...] = ()
    """Absolute paths never opened, nor anything beneath them (BUB_HOME, the database);
    one that holds the workspace itself only keeps its other parts out of reach."""
    allow_hardlinks: bool = False
    """Open regular files with more than one link (BUB_FS_ALLOW_HARDLINKS)."""


DEFAULT_POLICY = FilePolicy()


def split_path(path: str) -> tuple[str, ...]:
    """The components of a workspace-relative path ("" and "." are the workspace)."""
    if not path or path == ".":
        return ()
    raw = PurePosixPath(path)
    if raw.is_absolute():
        raise WorkspaceError(
            f"absolute paths are not allowed: {path!r} (use a path relative to the workspace)"
        )
    if ".." in raw.parts:
        raise WorkspaceError(f"'..' is not allowed in paths: {path!r}")
    if "\0" in path:
        raise WorkspaceError(f"bad path: {path!r}")
    return tuple(p for p in raw.parts if p != ".")


def check_secret(path: str, parts: tuple[str, ...]) -> None:
    """Refuse `parts` when a component looks like a secret file (`path` is named)."""
    pattern = secret_path_match(PurePosixPath(*parts)) if parts else None
    if pattern is not None:
        raise WorkspaceError(
            f"refused: {path!r} may hold secrets (it matches {pattern!r}); the file tools"
            " never open secret files"
        )


def _check_protected(root: Path, path: str, parts: tuple[str, ...], policy: FilePolicy) -> None:
    if not policy.protected:
        return
    base = Path(os.path.realpath(root))
    target = base.joinpath(*parts)
    for own in policy.protected:
        if own == base or own in base.parents:
            continue  # the workspace lies inside it (the default $BUB_HOME/workspace)
        if target == own or own in target.parents:
            raise WorkspaceError(
                f"refused: {path!r} is bub-bot's own data (the tapes of every conversation)"
            )


def _check_links(path: str, info: os.stat_result, policy: FilePolicy) -> None:
    if info.st_nlink > 1 and not policy.allow_hardlinks and stat.S_ISREG(info.st_mode):
        raise WorkspaceError(
            f"refused: {path!r} has {info.st_nlink} hard links (another name may be a secret"
            " file); the operator can allow hard-linked files with BUB_FS_ALLOW_HARDLINKS"
        )


def _failure(path: str, exc: OSError, *, directory: bool = False) -> WorkspaceError:
    if isinstance(exc, OutsideRoot):
        return WorkspaceError(f"{path!r} leads outside the workspace (through a symlink)")
    if isinstance(exc, FileNotFoundError):
        return WorkspaceError(f"no such {'directory' if directory else 'file'}: {path!r}")
    if exc.errno in (errno.ENOTDIR, errno.EINVAL, errno.EISDIR):
        return WorkspaceError(f"not a {'directory' if directory else 'regular file'}: {path!r}")
    if exc.errno == errno.ELOOP:
        return WorkspaceError(f"{path!r}: too many symlinks")
    return WorkspaceError(f"cannot open {path!r}: {exc.strerror or exc}")


def open_file(root: Path, path: str, policy: FilePolicy = DEFAULT_POLICY) -> Opened:
    """A checked, read-only descriptor of the regular file `path` beneath `root`."""
    parts = split_path(path)
    check_secret(path, parts)
    if not parts:
        raise WorkspaceError(f"not a regular file: {path!r}")
    try:
        opened = open_beneath(root, parts)
    except OSError as exc:
        raise _failure(path, exc) from None
    try:
        check_secret(path, opened.parts)  # a symlink to .env is .env
        _check_protected(root, path, opened.parts, policy)
        _check_links(path, os.fstat(opened.fd), policy)
    except BaseException:
        os.close(opened.fd)
        raise
    return opened


def read_file(root: Path, path: str, max_bytes: int, policy: FilePolicy = DEFAULT_POLICY) -> bytes:
    """The bytes of the regular file `path` beneath `root`; WorkspaceError past
    `max_bytes` (nothing more than max_bytes + 1 is read)."""
    opened = open_file(root, path, policy)
    try:
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(opened.fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(opened.fd)
    if left <= 0:
        raise WorkspaceError(f"{path!r} is larger than {max_bytes} bytes")
    return b"".join(chunks)


def list_dir(root: Path, path: str = ".", policy: FilePolicy = DEFAULT_POLICY) -> list[str]:
    """The names in directory `path` beneath `root`, sorted, directories ending in `/`
    (at most LIST_LIMIT). A missing workspace root lists as empty."""
    parts = split_path(path)
    check_secret(path, parts)
    if not parts and not os.path.isdir(root):
        return []
    try:
        opened = open_beneath(root, parts, directory=True)
    except OSError as exc:
        raise _failure(path, exc, directory=True) from None
    try:
        check_secret(path, opened.parts)
        _check_protected(root, path, opened.parts, policy)
        with os.scandir(opened.fd) as entries:
            names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    finally:
        os.close(opened.fd)
    return sorted(names)[:LIST_LIMIT]


def write_file_atomic(
    root: Path, path: str, data: bytes, policy: FilePolicy = DEFAULT_POLICY
) -> int:
    """Create or replace the file `path` beneath `root` with `data`; returns its size.

    Missing parent directories are made beneath `root` (the root too). The last component
    must not be a symlink (also one planted by a command in the workspace), a directory or
    a hard-linked file; a replaced file keeps its permission bits.
    """
    parts = split_path(path)
    if not parts:
        raise WorkspaceError(f"not a file name: {path!r}")
    check_secret(path, parts)
    _check_protected(root, path, parts, policy)
    os.makedirs(root, exist_ok=True)
    try:
        dir_fd, names, name = walk(
            root, parts, stop_before_last=True, create_dirs=True, follow_last=False
        )
    except OSError as exc:
        raise _failure(path, exc) from None
    try:
        assert name is not None
        resolved = (*names, name)
        check_secret(path, resolved)
        _check_protected(root, path, resolved, policy)
        try:
            info: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None:
            if stat.S_ISLNK(info.st_mode):
                raise WorkspaceError(
                    f"refused: {path!r} is a symlink; the file tools do not write through"
                    " symlinks (remove it first)"
                )
            if not stat.S_ISREG(info.st_mode):
                raise WorkspaceError(f"not a regular file: {path!r}")
            _check_links(path, info, policy)
        _replace(dir_fd, name, data, info)
    finally:
        os.close(dir_fd)
    return len(data)


def _replace(dir_fd: int, name: str, data: bytes, old: os.stat_result | None) -> None:
    """Write `data` to an O_EXCL temp file in `dir_fd` and rename it over `name`."""
    temp = f".{name[:200]}.{token.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
    try:
        try:
            if old is not None:
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)  # the rename itself survives a crash


__all__ = [
    "DEFAULT_POLICY",
    "LIST_LIMIT",
    "FilePolicy",
    "Opened",
    "WorkspaceError",
    "check_secret",
    "list_dir",
    "open_file",
    "read_file",
    "split_path",
    "write_file_atomic",
]
