"""What every sandbox backend is given and returns: limits, a command spec, a launch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
LAUNCH_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
"""The environment the launcher itself (bwrap, the helper) gets: never the bot's."""

SANDBOX_ENV = {"GIT_CONFIG_NOSYSTEM": "1"}
"""Set inside every sandbox (besides PATH, HOME, LANG, TMPDIR, USER): the host's
/etc/gitconfig is not the sandbox's (credential helpers, proxies), and where it exists but is
not readable (Landlock) git would refuse to run at all."""

RO_SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
RO_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/debian_version",
    "/etc/os-release",
)
"""Curated /etc files: what programs need, never all of /etc (secret files live there)."""
NET_ETC = ("/etc/resolv.conf", "/etc/hosts", "/etc/gai.conf")
"""Only when the workspace rule turns the network on."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-command resource limits (None: not limited)."""

    cpu_seconds: int | None = 60
    memory_mb: int | None = 4096
    file_mb: int | None = 1024
    nofile: int | None = 1024
    nproc: int | None = 256
    tmp_mb: int = 256


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command to run: `cmd` through /bin/sh -c, in `workspace`."""

    cmd: str
    workspace: Path
    network: bool = False
    limits: Limits = field(default_factory=Limits)
    uid: int = 65534
    """The unprivileged uid the command runs as when the bot runs as root."""
    inside_uid: int | None = None
    """The uid bubblewrap shows inside its user namespace (None: `uid`)."""


@dataclass
class Launch:
    """How to start a sandboxed command: argv and environment of the launcher, how to stop
    it (`graceful`: SIGTERM to the supervisor first), and what to clean afterwards."""

    argv: list[str]
    env: dict[str, str]
    graceful: bool = False
    cwd: Path | None = None
    pass_fd: int | None = None
    """An fd the launcher inherits (bwrap --bind-fd: the workspace's parents need not be
    reachable by the sandbox uid); the runner closes it once the launcher started."""
    cleanup: list[Path] = field(default_factory=list)


class Backend(Protocol):
    """A sandbox backend (bwrap, landlock, none)."""

    name: str

    def launch(self, spec: CommandSpec) -> Launch:
        """The launch for `spec` (raises OSError when it cannot be prepared)."""
        ...
