"""The expiry of an approval request: a one-off job (kind `approval.expiry`) whose entry is
the `approval.decision` event `expired`, keyed `approval:<id>:decision` like a person's click:
whichever is stored first wins, the other writes nothing (`bub_bot/schedules/kinds.py`)."""

from __future__ import annotations

from ..schedules.kinds import Due, Occurrence
from ..tape.entries import TapeEntry
from ..tape.jobs import Job
from .requests import DECISION, EXPIRED, decision_key, iso

KIND = "approval.expiry"


def expiry_job_id(request_id: str) -> str:
    return f"approval-{request_id}"


def decision_entry(
    request_id: str,
    decision: str,
    *,
    by: dict[str, str],
    at: float,
    digest: str,
    channel: str,
    reply_target: dict,
    via: str,
    payer: dict | None = None,
) -> TapeEntry:
    """The inbound entry of a decision (a click, a command, the expiry). `payer`: the
    request's (whom the turn it continues is charged to, bub_bot/budgets/payer.py)."""
    extra = {"payer": dict(payer)} if payer else {}
    return TapeEntry.event(
        DECISION,
        {"request": request_id, "decision": decision, "by": by, "at": iso(at), "digest": digest},
        inbound=True,
        channel=channel,
        reply_target=reply_target,
        sender=by,
        delivery_key=decision_key(request_id),
        message_id="",
        origin=via,
        **extra,
    )


class ExpiryKind:
    """The `approval.expiry` job kind."""

    name = KIND

    def entry(self, job: Job, occurrence: Occurrence) -> Due:
        data = job.data
        request_id = str(data.get("request", ""))
        entry = decision_entry(
            request_id,
            EXPIRED,
            by={"id": "", "name": "timeout"},
            at=occurrence.due,
            digest=str(data.get("digest", "")),
            channel=job.channel,
            reply_target=data.get("reply_target") or {},
            via="approval.expiry",
            payer=data.get("payer") or None,
        )
        return Due(entry, (decision_key(request_id),))
