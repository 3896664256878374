"""Reading and writing files of a session's workspace: the one way every file tool (and the
attachments inbox) touches it.

A path is refused when it is absolute, has `..`, leads outside the workspace (also through a
symlink), names a secret file (the name asked for or the file it leads to), or is bub-bot's
own data (the tape database, `BUB_HOME`). What passed the check is then opened by its
canonical path with no symlink followed (`beneath.open_beneath`), so a component swapped for
a symlink in between makes the open fail instead of escaping; the opened file must be a
regular file (opened `O_NONBLOCK`: a FIFO cannot hang the call), and a file with several hard
links is refused unless the operator allows them (a hard link made in the workspace could
name a secret file or a file outside under an innocent name). Writes go to a temporary file
beside the target and are renamed over it: a crash never leaves half a file.
"""

from __future__ import annotations

import errno
import io
import os
import secrets as _random
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .beneath import make_dirs_beneath, open_beneath
from .secrets import secret_path_match


class FileRefused(Exception):
    """A clear refusal (its text is meant for the model or the person)."""


@dataclass(frozen=True, slots=True)
class WorkspaceFiles:
    """The files of one workspace directory, with bub-bot's own data kept out of reach."""

    root: Path
    home: Path | None = None
    database: Path | None = None
    allow_hardlinks: bool = False
    owner: int | None = None
    """The uid (and gid) new files and directories are given (the bot runs as root and the
    workspace's sandboxed commands as this uid: they must be able to change what the bot
    wrote); None: the bot's own."""

    @classmethod
    def for_settings(cls, root: Path, settings: Any) -> WorkspaceFiles:
        """The workspace `root` with the settings' `BUB_HOME`, tape database,
        `BUB_FS_ALLOW_HARDLINKS` and, as root with a bash sandbox, the sandbox uid."""
        database = settings.database_path
        return cls(
            root=root,
            home=settings.home.expanduser().resolve(),
            database=None if "://" in database else Path(database).expanduser().resolve(),
            allow_hardlinks=bool(getattr(settings, "fs_allow_hardlinks", False)),
            owner=_sandbox_owner(root, settings),
        )

    # -- checking -------------------------------------------------------------------------

    def locate(self, path: str) -> tuple[str, ...]:
        """The canonical components (relative to the root) of an allowed `path`, or
        FileRefused saying why. The target need not exist."""
        if not path or path == ".":
            return ()
        raw = PurePosixPath(path)
        if raw.is_absolute():
            raise FileRefused(
                f"absolute paths are not allowed: {path!r} (use a path relative to the workspace)"
            )
        if ".." in raw.parts:
            raise FileRefused(f"'..' is not allowed in paths: {path!r}")
        if "\0" in path:
            raise FileRefused(f"a NUL character is not allowed in paths: {path!r}")
        root = self.root.resolve()
        try:
            target = (root / raw).resolve()
        except OSError as exc:  # a link changing while it is resolved
            raise FileRefused(_open_error(path, exc)) from None
        if target != root and root not in target.parents:
            raise FileRefused(f"{path!r} leads outside the workspace (through a symlink)")
        canonical = target.relative_to(root)
        pattern = secret_path_match(raw) or secret_path_match(canonical)
        if pattern is not None:
            raise FileRefused(
                f"refused: {path!r} may hold secrets (it matches {pattern!r}); the file tools"
                " never open secret files"
            )
        if self._is_own_data(root, target):
            raise FileRefused(
                f"refused: {path!r} is bub-bot's own data (the tapes of every conversation)"
            )
        return canonical.parts

    def _is_own_data(self, root: Path, target: Path) -> bool:
        """The tape database (and its journal files), and anything in BUB_HOME when
        BUB_HOME is inside the workspace (by default the workspace is inside BUB_HOME)."""
        home = self.home
        if home is not None and root in home.parents:
            if target == home or home in target.parents:
                return True
        db = self.database
        return db is not None and (
            target.parent == db.parent
            and target.name in {db.name + s for s in ("", "-wal", "-shm", "-journal")}
        )

    # -- opening --------------------------------------------------------------------------

    @contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def open_file(self, path: str) -> tuple[int, os.stat_result]:
        """A read descriptor of the regular file `path` and its stat; FileRefused when it is
        refused, missing, not a regular file or hard-linked (unless allowed)."""
        parts = self.locate(path)
        if not parts:
            raise FileRefused(f"not a file: {path!r}")
        try:
            with self._root_fd() as root:
                fd = open_beneath(root, parts, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise FileRefused(f"no such file: {path!r}") from None
        except OSError as exc:
            raise FileRefused(_open_error(path, exc)) from None
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise FileRefused(f"{path!r} is a directory (use fs_list)")
            if not stat.S_ISREG(info.st_mode):
                raise FileRefused(f"{path!r} is not a regular file")
            if info.st_nlink > 1 and not self.allow_hardlinks:
                raise FileRefused(
                    f"refused: {path!r} has {info.st_nlink} hard links (another name may be a"
                    " secret file); an operator can allow them with BUB_FS_ALLOW_HARDLINKS"
                )
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    def read_bytes(self, path: str, limit: int) -> bytes:
        """The bytes of `path`; FileRefused when it is longer than `limit`."""
        fd, info = self.open_file(path)
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise FileRefused(f"{path!r} is larger than {limit} bytes ({info.st_size})")
        return data

    @contextmanager
    def open_text(self, path: str) -> Iterator[tuple[io.BufferedReader, os.stat_result]]:
        """The binary reader of `path` (see `open_file`), closed on exit."""
        fd, info = self.open_file(path)
        with os.fdopen(fd, "rb") as f:
            yield f, info

    def list_dir(self, path: str, limit: int = 1000) -> list[str] | None:
        """The sorted names in directory `path` (directories end with `/`), None when the
        workspace itself does not exist yet."""
        parts = self.locate(path)
        try:
            with self._root_fd() as root:
                fd = open_beneath(root, parts, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if not parts:
                return None
            raise FileRefused(f"no such directory: {path!r}") from None
        except NotADirectoryError:
            raise FileRefused(f"not a directory: {path!r}") from None
        except OSError as exc:
            raise FileRefused(_open_error(path, exc)) from None
        try:
            with os.scandir(fd) as entries:
                names = [e.name + ("/" if _is_dir(e) else "") for e in entries]
        finally:
            os.close(fd)
        return sorted(names)[:limit]

    # -- writing --------------------------------------------------------------------------

    def write(self, path: str, data: bytes) -> bool:
        """Create or replace the file `path` with `data` atomically (parents created).

        Returns True when a file was replaced. The new file keeps the old one's mode."""
        parts = self.locate(path)
        if not parts:
            raise FileRefused(f"not a file: {path!r}")
        *parents, name = parts
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with self._root_fd() as root:
                parent = make_dirs_beneath(root, parents, owner=self.owner)
        except NotADirectoryError:
            raise FileRefused(f"a parent of {path!r} is a file, not a directory") from None
        except OSError as exc:
            raise FileRefused(_open_error(path, exc)) from None
        try:
            try:
                old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and stat.S_ISDIR(old.st_mode):
                raise FileRefused(f"{path!r} is a directory")
            if old is not None and not (stat.S_ISREG(old.st_mode) or stat.S_ISLNK(old.st_mode)):
                raise FileRefused(f"{path!r} is not a regular file")
            mode = stat.S_IMODE(old.st_mode) if old and stat.S_ISREG(old.st_mode) else 0o644
            _replace(parent, name, data, mode, owner=self.owner)
            return old is not None
        finally:
            os.close(parent)

    def save_new(self, directory: str, name: str, data: bytes) -> str:
        """Save `data` as a new file in `directory` (created) under `name`, or under
        `stem-2.ext`, `stem-3.ext`… when taken; never replaces a file. Returns the path
        relative to the root. `name` must already be a safe single component."""
        if "/" in name or name in ("", ".", "..") or "\0" in name:
            raise FileRefused(f"not a safe file name: {name!r}")
        parts = self.locate(directory)
        self.root.mkdir(parents=True, exist_ok=True)
        with self._root_fd() as root:
            parent = make_dirs_beneath(root, parts, owner=self.owner)
        try:
            stem, dot, ext = name.rpartition(".") if "." in name[1:] else (name, "", "")
            for n in range(1, 1000):
                candidate = name if n == 1 else f"{stem}-{n}{dot}{ext}"
                try:
                    _replace(parent, candidate, data, 0o644, exclusive=True, owner=self.owner)
                except FileExistsError:
                    continue
                return str(PurePosixPath(*parts, candidate))
            raise FileRefused(f"too many files named like {name!r} in {directory!r}")
        finally:
            os.close(parent)


def _replace(
    parent: int,
    name: str,
    data: bytes,
    mode: int,
    *,
    exclusive: bool = False,
    owner: int | None = None,
) -> None:
    """Write `data` to a temporary file in `parent`, then rename it to `name` (a link for
    `exclusive`: FileExistsError when `name` exists). The rename never follows a symlink at
    `name`: it replaces the link itself. `owner`: the new file's uid and gid."""
    tmp = f".{name[:200]}.{_random.token_hex(6)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode,
        dir_fd=parent,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner, owner)
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
            os.unlink(tmp, dir_fd=parent)
        else:
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        os.fsync(parent)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=parent)
        except FileNotFoundError:
            pass
        raise


def _sandbox_owner(root: Path, settings: Any) -> int | None:
    """The uid the workspace's sandboxed commands run as, when the bot runs as root and the
    workspace was handed over to it (its directory is that uid's: the sandbox does that once
    per start, so what the bot writes later must be created for it); else None — also when
    the commands run as root mapped in a user namespace (bubblewrap where the uid cannot
    reach the workspace), which a file of another uid would be read-only to."""
    if os.geteuid() != 0 or "bash" not in getattr(settings, "tools", ()):
        return None
    if getattr(settings, "shell_sandbox", "none") == "none":
        return None
    uid = int(settings.shell_uid_for(Path(root)))
    try:
        return uid if os.stat(root).st_uid == uid else None
    except OSError:
        return None


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _open_error(path: str, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        return f"{path!r} changed while it was opened (a symlink appeared on its way); refused"
    if exc.errno == errno.ENOENT:
        return f"no such file: {path!r}"
    if exc.errno == errno.EACCES:
        return f"permission denied: {path!r}"
    return f"cannot open {path!r}: {exc.strerror}"


__all__ = ["FileRefused", "WorkspaceFiles"]
