"""The Landlock backend: `landlock_helper.py` (stdlib only) confines and supervises a command
where user namespaces are not available (unprivileged containers, PaaS dynos).

No mount namespace here: the command sees real paths, works in the workspace's real
directory, and gets a private temporary directory (not size-capped: documented). As root the
helper drops to BUB_SHELL_UID, so the workspace is handed over to that uid first.
"""

from __future__ import annotations

import logging
import marshal
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .base import LAUNCH_ENV, MINIMAL_PATH, NET_ETC, RO_ETC, RO_SYSTEM, CommandSpec, Launch

log = logging.getLogger("bub_bot.sandbox")

HELPER = Path(__file__).with_name("landlock_helper.py")
HAND_OVER_LIMIT = 200_000
"""At most this many entries are re-owned per command (a huge tree is left as it is)."""


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


def hand_over(root: Path, uid: int) -> None:
    """Give `root`'s files to `uid` so the sandboxed command can use them (the bot, root,
    still can). Symlinks are re-owned themselves, never followed."""
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [".", *dirnames, *filenames]:
            seen += 1
            if seen > HAND_OVER_LIMIT:
                log.warning("sandbox.hand_over stopped after %d entries in %s", seen, root)
                return
            path = os.path.join(dirpath, name)
            try:
                if os.lstat(path).st_uid != uid:
                    os.lchown(path, uid, uid)
            except OSError:
                pass


class LandlockBackend:
    """Runs commands through the Landlock helper with the bot's own interpreter."""

    name = "landlock"

    def __init__(self, tmp_root: Path, python: str = sys.executable) -> None:
        self.tmp_root = tmp_root
        self.python = python

    def launch(self, spec: CommandSpec) -> Launch:
        workspace = Path(spec.workspace)
        root = os.geteuid() == 0
        self.tmp_root.mkdir(parents=True, exist_ok=True, mode=0o711)
        tmp = Path(tempfile.mkdtemp(prefix="sbx-", dir=self.tmp_root))
        if root:
            os.chown(tmp, spec.uid, spec.uid)
            hand_over(workspace, spec.uid)
        limits = spec.limits
        # HOME by path must be reachable by the dropped uid: else the private tmp directory.
        home = workspace if not root or reachable_by(workspace, spec.uid) else tmp
        env = {
            "PATH": MINIMAL_PATH,
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(tmp),
            "USER": "sandbox",
        }
        cfg = {
            "workspace": str(workspace),
            "tmp": str(tmp),
            "uid": spec.uid if root else None,
            "gid": spec.uid if root else None,
            "net": spec.network,
            "ro": list(RO_SYSTEM + RO_ETC + (NET_ETC if spec.network else ())),
            "dev": ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"],
            "env": env,
            "limits": {
                "cpu": limits.cpu_seconds,
                "as": limits.memory_mb * 1024 * 1024 if limits.memory_mb else None,
                "fsize": limits.file_mb * 1024 * 1024 if limits.file_mb else None,
                "nofile": limits.nofile,
                "nproc": limits.nproc,
            },
        }
        argv = [self.python, "-I", "-S", str(HELPER), marshal.dumps(cfg).hex(), "--"]
        argv += ["/bin/sh", "-c", spec.cmd]
        return Launch(argv, dict(LAUNCH_ENV), graceful=True, cleanup=[tmp])


def clean(paths: list[Path]) -> None:
    """Remove a launch's private temporary directories."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


class NoSandbox:
    """BUB_SHELL_SANDBOX=none: the command runs as the bot, in the workspace, with a minimal
    environment (for one user's own machine only; a warning at every start)."""

    name = "none"

    def launch(self, spec: CommandSpec) -> Launch:
        env = {"PATH": MINIMAL_PATH, "HOME": str(spec.workspace), "LANG": "C.UTF-8"}
        return Launch(["/bin/sh", "-c", spec.cmd], env, cwd=Path(spec.workspace))
