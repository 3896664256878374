"""Opening paths beneath a directory without ever letting the kernel follow a link out.

Every component is opened relative to the directory descriptor before it with
`O_NOFOLLOW`, so a directory swapped for a symlink between two calls cannot lead elsewhere:
the swap is seen as a symlink and resolved here, by these rules, from the descriptors
already held:

- a relative symlink is spliced into the rest of the path; `..` goes back one directory
  and never above the root (that is `OutsideRoot`);
- an absolute symlink is followed only when it points at the root or beneath it (written
  with the root's real or given path); anything else is `OutsideRoot`;
- at most `MAX_LINKS` symlinks per lookup (ELOOP).

This is a user-space `openat2(RESOLVE_BENEATH)` that also knows the resolved name (the
secret-file check needs it: a symlink to `.env` is `.env`) and accepts in-workspace absolute
links; one code path for every kernel. The final file is opened `O_NONBLOCK` (a FIFO cannot
hang the bot) and must be a regular file or a directory as asked.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY | os.O_NOFOLLOW


class OutsideRoot(PermissionError):
    """The path (through `..` or a symlink) leads outside the root."""


@dataclass(frozen=True, slots=True)
class Opened:
    """A descriptor opened beneath a root, and the path it was found at (relative to the
    root, symlinks resolved). The caller closes `fd`."""

    fd: int
    parts: tuple[str, ...]


@dataclass(slots=True)
class _Walk:
    """The directories held from the root down to where the lookup stands."""

    fds: list[int]
    names: list[str]

    def close(self, keep: int | None = None) -> None:
        for fd in self.fds:
            if fd != keep:
                os.close(fd)
        self.fds.clear()


def _check(part: str) -> None:
    if "\0" in part:
        raise OSError(errno.EINVAL, f"bad path component {part!r}")


def _link_parts(target: str, roots: Sequence[str]) -> list[str] | None:
    """The components of an absolute link target relative to the root, or None when it
    points outside."""
    for root in roots:
        if target == root:
            return []
        if target.startswith(root.rstrip("/") + "/"):
            return target[len(root.rstrip("/")) + 1 :].split("/")
    return None


def _open_root(root: Path) -> tuple[int, list[str]]:
    """The root's descriptor (the operator's path: it may contain symlinks) and the
    spellings an absolute link may use for it."""
    spellings = _root_spellings(root)
    return os.open(spellings[0], os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY), spellings


def walk(
    root: Path,
    parts: Sequence[str],
    *,
    stop_before_last: bool = False,
    create_dirs: bool = False,
    symlinks: bool = True,
    follow_last: bool = True,
) -> tuple[int, tuple[str, ...], str | None]:
    """Resolve `parts` beneath `root` down to the directory holding the last component.

    Returns (descriptor of that directory, its resolved parts, last component name), or
    with `stop_before_last=False` the descriptor of the last component itself when it is a
    directory (and name None). `create_dirs` makes missing directories (0o777 & ~umask)
    on the way. `symlinks=False` refuses any symlink (ELOOP); `follow_last=False` (with
    `stop_before_last`) returns a last component that is a symlink unresolved (a writer
    refuses it). The caller closes the fd.
    """
    root_fd, roots = _open_root(root)
    state = _Walk([root_fd], [])
    todo: deque[str] = deque(parts)
    links = 0
    try:
        while todo:
            part = todo.popleft()
            _check(part)
            if part in ("", "."):
                continue
            if part == "..":
                if not state.names:
                    raise OutsideRoot(errno.EXDEV, "the path leads outside the root")
                os.close(state.fds.pop())
                state.names.pop()
                continue
            last = not any(p not in ("", ".") for p in todo)
            here = state.fds[-1]
            try:
                info = os.stat(part, dir_fd=here, follow_symlinks=False)
            except FileNotFoundError:
                if last and stop_before_last:
                    return _done(state, part)
                if not create_dirs:
                    raise
                try:
                    os.mkdir(part, dir_fd=here)
                except FileExistsError:
                    pass  # made by someone else meanwhile: look again
                todo.appendleft(part)
                continue
            if stat.S_ISLNK(info.st_mode):
                if last and stop_before_last and not follow_last:
                    return _done(state, part)
                if not symlinks:
                    raise OSError(errno.ELOOP, f"{part!r} is a symlink")
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symlinks")
                target = os.readlink(part, dir_fd=here)
                if target.startswith("/"):
                    inside = _link_parts(target, roots)
                    if inside is None:
                        raise OutsideRoot(errno.EXDEV, "a symlink leads outside the root")
                    while len(state.fds) > 1:  # back to the root
                        os.close(state.fds.pop())
                    state.names.clear()
                    todo.extendleft(reversed(inside))
                else:
                    todo.extendleft(reversed(target.split("/")))
                continue
            if last and stop_before_last:
                return _done(state, part)
            try:
                fd = os.open(part, _DIR_FLAGS, dir_fd=here)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # became a symlink since the stat: look again
                    links += 1
                    if links > MAX_LINKS:
                        raise
                    todo.appendleft(part)
                    continue
                raise
            state.fds.append(fd)
            state.names.append(part)
        if stop_before_last:
            raise IsADirectoryError(errno.EISDIR, "the path names a directory")
        return _done(state, None)
    except BaseException:
        state.close()
        raise


def _done(state: _Walk, name: str | None) -> tuple[int, tuple[str, ...], str | None]:
    fd = state.fds[-1]
    names = tuple(state.names)
    state.close(keep=fd)
    return fd, names, name


def open_beneath(
    root: Path, parts: Sequence[str], *, directory: bool = False, symlinks: bool = True
) -> Opened:
    """Open `root/parts...` read-only without following a link out of `root`.

    The result is a directory (`directory`) or a regular file, else OSError EINVAL
    (ENOENT when missing, `OutsideRoot` when it leads out). A symlink swapped in after the
    last check is resolved by the rules above or retried, never followed by the kernel.
    """
    if directory or not parts:
        fd, names, _ = walk(root, parts, symlinks=symlinks)
        if not directory:
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
        return Opened(fd, names)
    todo = list(parts)
    for _ in range(MAX_LINKS):
        dir_fd, names, name = walk(root, todo, stop_before_last=True, symlinks=symlinks)
        try:
            if name is None:
                raise OSError(errno.EINVAL, "not a regular file")
            try:
                fd = os.open(
                    name,
                    os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                    dir_fd=dir_fd,
                )
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                if not symlinks:
                    raise
                # The last component is a symlink: resolve it from where we stand.
                target = os.readlink(name, dir_fd=dir_fd)
                if not target.startswith("/"):
                    todo = [*names, *target.split("/")]
                    continue
                inside = _link_parts(target, _root_spellings(root))
                if inside is None:
                    raise OutsideRoot(errno.EXDEV, "a symlink leads outside the root") from None
                todo = inside
                continue
        finally:
            os.close(dir_fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
        return Opened(fd, (*names, name))
    raise OSError(errno.ELOOP, "too many symlinks")


def _root_spellings(root: Path) -> list[str]:
    """The paths an absolute symlink may use for the root: its real and its given one."""
    return [os.path.realpath(root), os.path.abspath(root)]


__all__ = ["MAX_LINKS", "Opened", "OutsideRoot", "open_beneath", "walk"]
