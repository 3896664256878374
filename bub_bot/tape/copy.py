"""Copying every tape from one store to another (`bub-bot tapes copy`): moving to PostgreSQL.

Per tape, in name order: what the destination already holds must be the start of the source
tape (same last entry); the rest is appended in batches with ids, dates and meta as they are;
then the counters (entries, anchors, last anchor) are compared. A second run finds every tape
complete and copies nothing; an interrupted run continues where it stopped. Dedupe keys are
copied too, so platform re-deliveries after the move are still recognised, and the usage
counters, so budgets go on counting where they were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .store import TapeStore, TapeSummary

BATCH = 2000


@dataclass
class CopyReport:
    """What a copy did: tapes seen, entries and dedupe keys written, tapes that failed."""

    tapes: int = 0
    entries: int = 0
    dedupe_keys: int = 0
    usage_rows: int = 0
    failed: list[str] = field(default_factory=list)


async def copy_tapes(
    source: TapeStore,
    destination: TapeStore,
    *,
    progress: Callable[[str], None] = lambda line: None,
    batch: int = BATCH,
) -> CopyReport:
    """Copy every tape (live, sidecars, archives) and every dedupe key; one progress line per
    tape. Tapes that cannot be copied are listed in `failed` and left untouched."""
    report = CopyReport()
    summaries = sorted(await source.list_tapes(include_all=True), key=lambda s: s.name)
    for number, summary in enumerate(summaries, start=1):
        report.tapes += 1
        prefix = f"[{number}/{len(summaries)}] {summary.name}"
        try:
            copied, total = await _copy_tape(source, destination, summary, batch)
        except _Mismatch as exc:
            report.failed.append(summary.name)
            progress(f"{prefix}: FAILED, {exc}")
            continue
        report.entries += copied
        state = "up to date" if copied == 0 else f"{copied:,} copied"
        progress(f"{prefix}: {total:,} entries, {state}, verified")
    after = ""
    while True:
        records = await source.dedupe_records(after=after, limit=batch)
        if not records:
            break
        report.dedupe_keys += await destination.add_dedupe_records(records)
        after = records[-1].key
    # The usage counters (budgets keep counting where they were); rows the destination has
    # already stay as they are.
    position = ("", "")
    while True:
        rows = await source.usage_records(after=position, limit=batch)
        if not rows:
            break
        report.usage_rows += await destination.add_usage_records(rows)
        position = (rows[-1].key, rows[-1].window)
    return report


class _Mismatch(Exception):
    """The destination's tape is not a prefix of the source's, or counts differ after a copy."""


async def _copy_tape(
    source: TapeStore, destination: TapeStore, summary: TapeSummary, batch: int
) -> tuple[int, int]:
    """Copy what `destination` lacks of one tape; returns (entries copied, entries in total)."""
    name = summary.name
    want = await source.stats(name)
    have = await destination.stats(name)
    if have.entries > want.entries:
        raise _Mismatch(
            f"the destination has {have.entries:,} entries, the source {want.entries:,}"
        )
    if have.entries:
        theirs = await destination.get(name, have.entries)
        ours = await source.get(name, have.entries)
        if theirs != ours:
            raise _Mismatch(
                f"entry {have.entries} differs between source and destination (the"
                " destination holds other data under this name)"
            )
    copied = 0
    position = have.entries
    # An empty tape (archived, nothing since) is created too; it shows in `tapes list`.
    if position == want.entries:
        await destination.append_copies(
            name, [], session_id=summary.session_id, updated=summary.updated
        )
    while position < want.entries:
        chunk = await source.query(
            name, after_id=position, limit=min(batch, want.entries - position)
        )
        if not chunk:
            break
        copied += await destination.append_copies(
            name, chunk, session_id=summary.session_id, updated=summary.updated
        )
        position = chunk[-1].id
    got = await destination.stats(name)
    if (got.entries, got.anchors, got.last_anchor_id) != (
        want.entries,
        want.anchors,
        want.last_anchor_id,
    ):
        raise _Mismatch(
            f"after copying: {got.entries:,} entries / {got.anchors} anchors, source has"
            f" {want.entries:,} / {want.anchors}"
        )
    return copied, want.entries
