"""Run a command the way an unprivileged container would: `python dockerish.py [--no-landlock]
-- ARGV...` installs a seccomp filter (what Docker's default profile does to namespaces) and
execs ARGV. Creating a user namespace fails (unshare, clone with CLONE_NEWUSER: EPERM;
clone3: ENOSYS so libc falls back to clone); `--no-landlock` also makes Landlock missing
(ENOSYS, as on an old kernel). Inherited by every child, so bwrap really fails."""

from __future__ import annotations

import os
import sys

from bub_bot.agent.sandbox.landlock_helper import (
    ARCHES,
    ENOSYS,
    EPERM,
    NR_CLONE3,
    NR_CREATE,
    filter_program,
    install_filter,
)

CLONE_NEWUSER = 0x10000000


def main() -> None:
    args = sys.argv[1:]
    no_landlock = args[0] == "--no-landlock"
    if no_landlock:
        args = args[1:]
    assert args[0] == "--"
    arch = ARCHES[os.uname().machine]
    rules = [
        (arch["unshare"], EPERM, None, None),
        (arch["clone"], EPERM, CLONE_NEWUSER, None),
        (NR_CLONE3, ENOSYS, None, None),
    ]
    if no_landlock:
        rules.append((NR_CREATE, ENOSYS, None, None))
    install_filter(filter_program(rules))
    os.execv(args[1], args[1:])


if __name__ == "__main__":
    main()
