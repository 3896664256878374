"""Readers of single setting values (bub_bot/config.py uses them in its validators and the
rest of the bot where it needs them): send rates (`30/s`), comma lists, IP networks, and
the uid range of the sandbox (BUB_SHELL_UIDS) with the uid each workspace gets from it."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from pathlib import Path

_RATE_RE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*(s|sec|second|seconds|m|min|minute|minutes)\s*$",
    re.IGNORECASE,
)
_RATE_OFF = ("off", "none", "0", "")


def parse_rate(value: str) -> tuple[int, float] | None:
    """A send limit `"<count>/<window>"` as (count, seconds); None for `off`.

    `30/s`, `1/s`, `20/min`, `20/60s` and `1/0.1s` are all valid. Raises ValueError."""
    text = value.strip().lower()
    if text in _RATE_OFF:
        return None
    match = _RATE_RE.match(text)
    if not match:
        raise ValueError(
            f"{value!r} is not a rate: write <count>/<window> like 30/s, 20/min, 1/0.5s, or off"
        )
    count, number, unit = int(match.group(1)), match.group(2), match.group(3)
    seconds = float(number) if number else 1.0
    if unit.startswith("m"):
        seconds *= 60
    if count < 1 or seconds <= 0:
        raise ValueError(f"{value!r}: the count and the window must be above zero")
    return count, seconds


def csv_list(value: object) -> list[str]:
    """A comma list setting (or a list given directly) as its non-empty, stripped items."""
    if value is None:
        return []
    if isinstance(value, list | tuple | set):
        return [str(v).strip() for v in value if str(v).strip()]
    return [part.strip() for part in str(value).split(",") if part.strip()]


def check_networks(value: list[str]) -> list[str]:
    """`value` if every item is an IP address or CIDR; ValueError naming the first that is not."""
    for item in value:
        try:
            ipaddress.ip_network(item.strip(), strict=False)
        except ValueError:
            raise ValueError(f"not an IP address or CIDR: {item!r}") from None
    return value


# A uid per workspace for the sandbox (BUB_SHELL_UIDS): which uid a workspace's commands run
# as when the bot runs as root. By default every workspace shares BUB_SHELL_UID. Under Landlock (no user namespace) that
# uid is real: a command of one conversation owns, by uid, every other workspace handed over to
# it, so it can chmod and touch their files where it can reach them by path (Landlock does not
# cover metadata changes), and RLIMIT_NPROC counts the processes of all of them together (one
# conversation's fork bomb starves the others' commands). BUB_SHELL_UIDS="LO-HI" gives each
# workspace its own uid in that range instead (a hash of its path: two workspaces may share one
# when the range is small — choose it much larger than the number of workspaces). bubblewrap
# still shows the command BUB_SHELL_UID inside its user namespace.
UID_MIN, UID_MAX = 1000, 2**31 - 2


def uid_range(value: str) -> tuple[int, int] | None:
    """`"LO-HI"` as (LO, HI); "" as None; ValueError saying what is wrong otherwise."""
    text = value.strip()
    if not text:
        return None
    lo_text, dash, hi_text = text.partition("-")
    if not dash or not lo_text.strip().isdigit() or not hi_text.strip().isdigit():
        raise ValueError(f"expected LO-HI (two uids, e.g. 200000-299999), got {value!r}")
    lo, hi = int(lo_text), int(hi_text)
    if not UID_MIN <= lo <= hi <= UID_MAX:
        raise ValueError(f"the range must satisfy {UID_MIN} <= LO <= HI <= {UID_MAX}")
    return lo, hi


def workspace_uid(workspace: Path, shared: int, uid_range: tuple[int, int] | None) -> int:
    """The uid `workspace`'s commands run as: `shared` without a range, else one of the
    range chosen by the workspace's resolved path (the same on every start)."""
    if uid_range is None:
        return shared
    lo, hi = uid_range
    digest = hashlib.sha256(str(workspace.resolve()).encode()).digest()
    return lo + int.from_bytes(digest[:8], "big") % (hi - lo + 1)
