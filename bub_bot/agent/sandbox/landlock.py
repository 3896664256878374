"""The Landlock backend: `landlock_helper.py` (stdlib only) confines and supervises a command
where user namespaces are not available (unprivileged containers, PaaS dynos).

No mount namespace here: the command sees real paths, works in the workspace's real
directory, and gets a private temporary directory (not size-capped: documented). As root the
helper drops to the workspace's uid (BUB_SHELL_UID, or its own one of BUB_SHELL_UIDS), so the
workspace is handed over to that uid first, once per start (handover.py).
"""

from __future__ import annotations

import marshal
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .base import (
    LAUNCH_ENV,
    MINIMAL_PATH,
    NET_ETC,
    RO_ETC,
    RO_SYSTEM,
    SANDBOX_ENV,
    CommandSpec,
    Launch,
)
from .handover import HandOver, reachable_by

HELPER = Path(__file__).with_name("landlock_helper.py")


class LandlockBackend:
    """Runs commands through the Landlock helper with the bot's own interpreter."""

    name = "landlock"

    def __init__(self, tmp_root: Path, python: str = sys.executable) -> None:
        self.tmp_root = tmp_root
        self.python = python
        self.handed = HandOver()

    def launch(self, spec: CommandSpec) -> Launch:
        workspace = Path(spec.workspace)
        root = os.geteuid() == 0
        self.tmp_root.mkdir(parents=True, exist_ok=True, mode=0o711)
        tmp = Path(tempfile.mkdtemp(prefix="sbx-", dir=self.tmp_root))
        if root:
            os.chown(tmp, spec.uid, spec.uid)
            self.handed.ensure(workspace, spec.uid)
        limits = spec.limits
        # HOME by path must be reachable by the dropped uid: else the private tmp directory.
        home = workspace if not root or reachable_by(workspace, spec.uid) else tmp
        env = {
            "PATH": MINIMAL_PATH,
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(tmp),
            "USER": "sandbox",
            **SANDBOX_ENV,
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
