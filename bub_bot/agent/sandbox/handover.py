"""Hand a workspace over to the sandbox uid (the bot runs as root, commands as BUB_SHELL_UID).

When: once per workspace directory per process (`HandOver.ensure`), not before every command
— a walk costs ~6 ms per 1000 entries, paid by every command of a big workspace otherwise.
What is there when the bot starts (the operator's files, a previous run's) is handed over by
that first walk; what the bot's own file tools write later is created for the workspace's uid
(`WorkspaceFiles.owner`); what the sandbox writes is its uid's already. Files put there as
root by anything else while the bot runs (an MCP server, the operator) stay root's — readable
to commands when their mode says so, not writable — until the next start. A workspace
directory that was removed and made again is a new inode: walked again.

Why by file descriptor: the tree is being changed concurrently by the very uid it is handed
to (a background job of the same conversation). A walk by path name follows a directory
that was swapped for a symlink between the listing and the chown, and chowns a host file
outside the workspace. So every directory is opened relative to its already-open parent
with O_NOFOLLOW | O_DIRECTORY (a symlink fails the open, it is never followed), must stay on
the workspace's file system, and is re-owned through its fd; other entries are re-owned
with fchownat(parent_fd, name, AT_SYMLINK_NOFOLLOW) (a symlink is re-owned itself). A
directory fd stays the same directory wherever it is renamed, and the sandbox can only
rename within what it can write (the workspace, its private tmp): nothing reached this way is
outside them. Files with more than one hard link are left alone (a hard link is the one way
a host inode could appear in the tree; the sandboxes do not let a command make one to a
file outside, this is defence in depth). Nothing is ever chmodded.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("bub_bot.sandbox")

HAND_OVER_LIMIT = 200_000
"""At most this many entries are looked at per walk (a huge tree is left as it is)."""
MAX_DEPTH = 256
"""Directories deeper than this are not descended into (one open fd per level)."""
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def reachable_by(path: Path, uid: int) -> bool:
    """Whether `uid` (not root, no groups) can traverse every parent of `path`."""
    for parent in path.resolve().parents:
        try:
            st = parent.stat()
        except OSError:
            return False
        if st.st_mode & 0o001 or (st.st_uid == uid and st.st_mode & 0o100):
            continue
        if st.st_gid == uid and st.st_mode & 0o010:
            continue
        return False
    return True


class _Walk:
    def __init__(self, root: Path, uid: int, dev: int, limit: int) -> None:
        self.root = root
        self.uid = uid
        self.dev = dev
        self.left = limit
        self.changed = 0

    def directory(self, fd: int, depth: int) -> None:
        """Re-own the open directory `fd` and everything beneath it."""
        st = os.fstat(fd)
        if st.st_dev != self.dev:
            return  # a mount point inside the tree: not ours to hand over
        if st.st_uid != self.uid or st.st_gid != self.uid:
            os.fchown(fd, self.uid, self.uid)
            self.changed += 1
        subdirs: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                self.left -= 1
                if self.left < 0:
                    return
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    else:
                        self.entry(fd, entry.name)
                except OSError:
                    pass  # gone or changed meanwhile: the next command's walk sees it
        if depth >= MAX_DEPTH:
            return
        for name in subdirs:
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # swapped for a symlink (ELOOP/ENOTDIR) or gone: never followed
            try:
                self.directory(child, depth + 1)
            except OSError:
                pass
            finally:
                os.close(child)
            if self.left < 0:
                return

    def entry(self, dir_fd: int, name: str) -> None:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_uid == self.uid and st.st_gid == self.uid:
            return
        if st.st_dev != self.dev or stat.S_ISDIR(st.st_mode):
            return  # a directory that appeared since the listing: the next walk
        if not stat.S_ISLNK(st.st_mode) and st.st_nlink > 1:
            return  # possibly an inode that also lives outside: left alone
        os.chown(name, self.uid, self.uid, dir_fd=dir_fd, follow_symlinks=False)
        self.changed += 1


def hand_over(root: Path, uid: int, limit: int = HAND_OVER_LIMIT) -> int:
    """Give `root`'s tree to `uid` so the sandboxed command can use it (the bot, root, still
    can), never touching anything outside it (see the module docstring). Returns how many
    entries were re-owned."""
    try:
        top = os.open(root, DIR_FLAGS)
    except OSError as exc:
        log.warning("sandbox.hand_over cannot open %s: %s", root, exc)
        return 0
    walk = _Walk(root, uid, os.fstat(top).st_dev, limit)
    try:
        walk.directory(top, 0)
    except OSError as exc:
        log.warning("sandbox.hand_over of %s stopped: %s", root, exc)
    finally:
        os.close(top)
    if walk.left < 0:
        log.warning("sandbox.hand_over stopped after %d entries in %s", limit, root)
    return walk.changed


class HandOver:
    """Hands each workspace over once per process (see the module docstring)."""

    def __init__(self) -> None:
        self.done: set[tuple[int, int, int]] = set()

    def ensure(self, root: Path, uid: int) -> None:
        """Walk `root` for `uid` unless this very directory was already walked for it."""
        try:
            st = os.stat(root, follow_symlinks=False)
        except OSError:
            return
        key = (st.st_dev, st.st_ino, uid)
        if key in self.done and st.st_uid == uid:
            return
        hand_over(root, uid)
        self.done.add(key)
