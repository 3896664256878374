"""Which uid a workspace's commands run as when the bot runs as root.

By default every workspace shares BUB_SHELL_UID. Under Landlock (no user namespace) that
uid is real: a command of one conversation owns, by uid, every other workspace handed over to
it, so it can chmod and touch their files where it can reach them by path (Landlock does not
cover metadata changes), and RLIMIT_NPROC counts the processes of all of them together (one
conversation's fork bomb starves the others' commands). BUB_SHELL_UIDS="LO-HI" gives each
workspace its own uid in that range instead (a hash of its path: two workspaces may share one
when the range is small — choose it much larger than the number of workspaces). bubblewrap
still shows the command BUB_SHELL_UID inside its user namespace. The range is parsed and
checked with the settings (`Settings.shell_uid_range`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def workspace_uid(workspace: Path, shared: int, uid_range: tuple[int, int] | None) -> int:
    """The uid `workspace`'s commands run as: `shared` without a range, else one of the
    range chosen by the workspace's resolved path (the same on every start)."""
    if uid_range is None:
        return shared
    lo, hi = uid_range
    digest = hashlib.sha256(str(workspace.resolve()).encode()).digest()
    return lo + int.from_bytes(digest[:8], "big") % (hi - lo + 1)
