"""The bubblewrap backend: a fresh user, pid, mount, ipc, uts (and net) namespace per command.

Only what is bound exists inside: the system directories read-only, curated /etc files, a
private size-capped /tmp, the new pid namespace's /proc, and the workspace read-write at
/work (the working directory). bwrap itself starts with a clean environment; the command's
is set with --clearenv. `--die-with-parent` + the pid namespace: killing bwrap kills
everything inside, `setsid` children included.
"""

from __future__ import annotations

import logging
import os
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
from .landlock_helper import network_filter

INSIDE = "/work"
log = logging.getLogger("bub_bot.sandbox")


class BwrapBackend:
    """Runs commands through `bwrap` (path: BUB_SHELL_BWRAP)."""

    name = "bwrap"

    def __init__(self, bwrap: str = "bwrap") -> None:
        self.bwrap = bwrap
        self.warned = False
        self.handed = HandOver()

    def launch(self, spec: CommandSpec) -> Launch:
        seccomp = _unix_filter_fd() if spec.network else None
        try:
            launch = self._launch(spec, seccomp)
        except BaseException:
            if seccomp is not None:
                os.close(seccomp)
            raise
        launch.pass_fd = seccomp
        return launch

    def _launch(self, spec: CommandSpec, seccomp: int | None) -> Launch:
        if os.geteuid() == 0 and reachable_by(Path(spec.workspace), spec.uid):
            # As root, bwrap itself runs as the sandbox uid where it can reach the workspace
            # (bwrap resolves the bind source as that uid): RLIMIT_NPROC does not apply to
            # uid 0, and an escape would not be root. The workspace is handed over to it.
            self.handed.ensure(Path(spec.workspace), spec.uid)
            drop = ["/usr/bin/setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}"]
            argv = [*drop, "--clear-groups", "--", *self.argv(spec, seccomp)]
            return Launch(argv, dict(LAUNCH_ENV))
        if os.geteuid() == 0 and not self.warned:
            self.warned = True
            log.warning(
                "sandbox.bwrap_as_root workspace=%s is not reachable by BUB_SHELL_UID=%d: the"
                " sandbox runs as root mapped to uid %d in its own user namespace (no"
                " capabilities); BUB_SHELL_NPROC is not enforced for it (put workspaces where"
                " that uid can traverse the parents, or run the bot as a non-root user)",
                spec.workspace,
                spec.uid,
                spec.uid,
            )
        return Launch(self.argv(spec, seccomp), dict(LAUNCH_ENV))

    def argv(self, spec: CommandSpec, seccomp: int | None = None) -> list[str]:
        """The full argv (tests check it keeps --die-with-parent); `seccomp`: the fd of a
        filter program bwrap loads for the command."""
        limits = spec.limits
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
        if spec.network:
            args.append("--share-net")
        if seccomp is not None:
            args += ["--seccomp", str(seccomp)]
        args += ["--cap-drop", "ALL", "--die-with-parent", "--new-session"]
        inside = spec.uid if spec.inside_uid is None else spec.inside_uid
        args += ["--hostname", "sandbox", "--uid", str(inside), "--gid", str(inside)]
        for path in RO_SYSTEM:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in RO_ETC + (NET_ETC if spec.network else ()):
            args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        args += ["--bind", str(Path(spec.workspace)), INSIDE, "--chdir", INSIDE]
        args += ["--clearenv", "--setenv", "PATH", MINIMAL_PATH, "--setenv", "HOME", INSIDE]
        args += ["--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
        args += ["--setenv", "USER", "sandbox"]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        args.append("--")
        # RLIMIT_NPROC inside the new user namespace counts this sandbox only.
        args += ["/usr/bin/prlimit", "--core=0"]
        if limits.nproc:
            args.append(f"--nproc={limits.nproc}")
        if limits.cpu_seconds:
            args.append(f"--cpu={limits.cpu_seconds}")
        if limits.memory_mb:
            args.append(f"--as={limits.memory_mb * 1024 * 1024}")
        if limits.file_mb:
            args.append(f"--fsize={limits.file_mb * 1024 * 1024}")
        if limits.nofile:
            args.append(f"--nofile={limits.nofile}")
        return [*args, "--", "/bin/sh", "-c", spec.cmd]


def _unix_filter_fd() -> int:
    """A pipe's read end holding the seccomp program bwrap loads when the network is on.

    --share-net shares the host's network namespace, and with it the host's abstract Unix
    sockets (the namespace they live in: X11, D-Bus, container shims listen there), so
    socket(AF_UNIX) and datagram socketpairs are denied then, as under Landlock. With the
    network off the command has a namespace of its own and sees no host socket at all."""
    program = network_filter(net=True)
    read, write = os.pipe()
    try:
        os.write(write, program)  # a few hundred bytes: far below the pipe's buffer
    finally:
        os.close(write)
    return read
