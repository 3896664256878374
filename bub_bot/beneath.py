"""Open a path beneath a directory without following any symlink on the way.

A path is checked first (`workspace_files.WorkspaceFiles.locate` resolves it and refuses
escapes); what is opened afterwards must be what was checked, even when something that can
write in the directory (an MCP server, a sandboxed command) swaps a component for a symlink
in between. So the checked, canonical path — which has no symlink in it — is opened with
symlinks forbidden: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
where the kernel has it (Linux 5.6+), else a walk that opens one component at a time with
`O_NOFOLLOW` from the directory before it. A swap then fails the open (ELOOP, ENOTDIR,
EXDEV) instead of leading elsewhere.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08

_libc = ctypes.CDLL(None, use_errno=True)
_openat2_works: bool | None = None if _SYS_OPENAT2 else False


def _check_parts(parts: Sequence[str]) -> None:
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise OSError(errno.EINVAL, f"bad path component {part!r}")


def _openat2(dir_fd: int, path: str, flags: int) -> int:
    how = struct.pack(
        "QQQ", flags, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
    )
    buf = ctypes.create_string_buffer(how, len(how))
    fd = _libc.syscall(
        _SYS_OPENAT2,
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        buf,
        ctypes.c_size_t(len(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _walk(dir_fd: int, parts: Sequence[str], flags: int) -> int:
    fd = os.dup(dir_fd)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            child = os.open(
                part,
                (flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=fd,
            )
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(dir_fd: int, parts: Sequence[str], flags: int = os.O_RDONLY) -> int:
    """A descriptor of `parts` (components, none `..`) beneath the directory `dir_fd`,
    following no symlink; OSError when a component is a symlink, missing or of the wrong
    type. The caller closes it. Empty `parts` opens `dir_fd`'s directory again."""
    global _openat2_works
    _check_parts(parts)
    if not parts:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    if _openat2_works is not False:
        try:
            fd = _openat2(dir_fd, "/".join(parts), flags | os.O_CLOEXEC)
        except OSError as exc:
            # ENOSYS: an old kernel; EPERM: a seccomp filter (some container runtimes).
            if exc.errno not in (errno.ENOSYS, errno.EPERM) or _openat2_works:
                raise
            _openat2_works = False
        else:
            _openat2_works = True
            return fd
    return _walk(dir_fd, parts, flags)


def make_dirs_beneath(
    dir_fd: int, parts: Sequence[str], mode: int = 0o755, owner: int | None = None
) -> int:
    """A descriptor of the directory `parts` beneath `dir_fd`, creating missing ones, each
    opened with O_NOFOLLOW (a symlink on the way is an error, never followed). `owner`: the
    uid (and gid) given the directories created here (through their fd)."""
    _check_parts(parts)
    fd = os.dup(dir_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, mode, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            child = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = child
            if made and owner is not None:
                os.fchown(fd, owner, owner)
        return fd
    except BaseException:
        os.close(fd)
        raise


__all__ = ["make_dirs_beneath", "open_beneath"]
