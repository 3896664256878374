"""Forks of a tape: durable overlays a run writes to instead of its tape.

A fork is a tape row of its own (`<tape>__fork__<tag>`, role `fork`) that names its parent
and the parent's last id when it was made (`base`). Its own entries continue at `base + 1`,
so a reader (`ForkTape`, tape/fork.py) sees the parent's entries up to the fork point and
then the fork's, with dense ids, while the parent goes on receiving entries of its own.
Every sidecar the parent has when it is forked is forked with it (`<fork>__sidecar__<name>`
over `<tape>__sidecar__<name>`); a sidecar first written on the fork is a plain one.

- `merge`: one transaction appends the fork's entries to the parent after the parent's last
  id (kind, payload, meta and date kept; new dense ids), then each sidecar's entries to the
  parent's sidecar, recording a `fork.merge` event and one `sidecar.merge` event per sidecar
  on the parent (`context=False`: audit only), and drops the fork and its sidecars.
- `discard`: drops them, or (`archive=True`) moves them under an archive name, readable in
  the viewer, never live again.

Forks live on disk: a process that dies mid-run leaves its fork readable, and whoever
resumes the run decides (subagents: a background run is restarted on a fresh fork and the
interrupted one archived, since half a run is no answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .entries import TapeEntry
from .names import SIDECAR_SEP

MERGE_EVENT = "fork.merge"
SIDECAR_MERGE = "sidecar.merge"
SIDECAR_ARCHIVE = "sidecar.archive"
SIDECAR_RESET = "sidecar.reset"


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """A fork as stored: its name, parent tape, the parent's last id when forked, and the
    forked sidecars (sidecar name -> that sidecar's last id when forked)."""

    name: str
    parent: str
    base: int
    session_id: str | None = None
    sidecars: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Merged:
    """What a merge wrote on the parent: ids `first`..`last` (0, 0: the fork was empty), and
    entries merged per sidecar."""

    fork: str
    parent: str
    first: int
    last: int
    sidecars: dict[str, int] = field(default_factory=dict)

    @property
    def entries(self) -> int:
        """How many of the fork's entries the parent got."""
        return self.last - self.first + 1 if self.last else 0


class ForkError(RuntimeError):
    """The named tape is not a fork (never was, or was merged or discarded already)."""


def sidecar_suffix(tape: str, sidecar: str) -> str:
    """The sidecar's own name ("spill") from its tape name."""
    return sidecar[len(tape) + len(SIDECAR_SEP) :]


def merge_events(
    merged: Merged, base: int, sidecar_tapes: dict[str, tuple[str, str]]
) -> list[TapeEntry]:
    """The audit events a merge appends on the parent after the fork's entries:
    `fork.merge`, then `sidecar.merge` per sidecar (name -> (from tape, to tape))."""
    events = [
        TapeEntry.event(
            MERGE_EVENT,
            {
                "fork": merged.fork,
                "base": base,
                "entries": merged.entries,
                "first_id": merged.first,
                "last_id": merged.last,
            },
            context=False,
        )
    ]
    for name, count in sorted(merged.sidecars.items()):
        source, target = sidecar_tapes[name]
        events.append(
            TapeEntry.event(
                SIDECAR_MERGE,
                {"sidecar": name, "from": source, "to": target, "entries": count},
                context=False,
            )
        )
    return events


def lifecycle_events(
    tape: str, sidecars: Sequence[str], archived: str | None, *, reset: bool
) -> list[TapeEntry]:
    """The `sidecar.archive` / `sidecar.reset` events a reset (or archive) of `tape` writes
    on the fresh tape for the sidecars it had (their tape names)."""
    events: list[TapeEntry] = []
    for sidecar in sorted(sidecars):
        name = sidecar_suffix(tape, sidecar)
        if archived is not None:
            data: dict[str, Any] = {"sidecar": name, "tape": sidecar}
            data["archived"] = archived + sidecar[len(tape) :]
            events.append(TapeEntry.event(SIDECAR_ARCHIVE, data, context=False))
        if reset:
            events.append(
                TapeEntry.event(SIDECAR_RESET, {"sidecar": name, "tape": sidecar}, context=False)
            )
    return events
