"""Prompt jobs (kind `prompt`): what `schedule.add` makes. At its time the prompt comes back
into the conversation that created it as a user message marked scheduled, and the answer is
posted where that conversation lives.

Stored (`Job.data`): the prompt, and from the turn that created it the reply target (a
Telegram chat or topic, a Slack thread or channel, a web conversation) and the sender (the
creator, whom budgets charge for the scheduled turns).

When due: a user message (`meta.inbound`, `meta.origin = "schedule"`, the job id, the due
time, the creator as `sender`), its text prefixed `[Scheduled job <id>, due <time>]` so the
model knows nobody just typed it. Late runs (the bot was down):

- up to `BUB_SCHEDULE_GRACE_SECONDS` late: runs as if on time;
- later: runs, and the prefix says how late (and how many runs of a recurring job were
  folded into this one: a recurring job runs at most once for all the times it missed);
- later than `BUB_SCHEDULE_DROP_SECONDS` (0: never): does not run; the conversation gets a
  note saying so instead (a reply with its own target: no model call). A recurring job
  still goes on at its next time.
"""

from __future__ import annotations

from ..tape.entries import TapeEntry
from ..tape.jobs import Job
from .kinds import Due, Occurrence, job_key
from .times import local_time, span, utc_iso

PROMPT = "prompt"
NOTICE = "schedule.notice"
"""The event name of the note a dropped run leaves (a reply that carries its own target)."""


class PromptKind:
    """The `prompt` kind: a scheduled message into the conversation that created it."""

    name = PROMPT

    def __init__(self, grace_seconds: float, drop_seconds: float) -> None:
        self.grace = grace_seconds
        self.drop = drop_seconds

    def entry(self, job: Job, occurrence: Occurrence) -> Due:
        """The scheduled message (or, past the drop limit, the note that it was skipped)."""
        data = job.data
        late = occurrence.late
        when = local_time(occurrence.due, job.tz)
        meta = {
            "origin": "schedule",
            "channel": job.channel,
            "reply_target": data.get("reply_target") or {},
            "sender": data.get("sender") or {},
            "job": job.id,
            "due": utc_iso(occurrence.due),
        }
        if self.drop and late > self.drop:
            text = (
                f"A scheduled job ({job.id}) was due at {when} while I was not running; it is"
                f" {span(late)} late, so I skipped it."
            )
            if occurrence.next_due is not None:
                text += f" Its next run is {local_time(occurrence.next_due, job.tz)}."
            notice = {"text": text, "job": job.id, "due": meta["due"], "seen_through": 0}
            return Due(TapeEntry.event(NOTICE, notice, context=False, dropped=True, **meta))
        head = f"[Scheduled job {job.id}, due {when}"
        if late > self.grace:
            head += f"; running {span(late)} late: the bot was not running at the time"
            meta["late_seconds"] = round(late)
        if occurrence.missed:
            runs = "run was" if occurrence.missed == 1 else "runs were"
            head += f"; {occurrence.missed} earlier {runs} missed meanwhile and not repeated"
            meta["missed"] = occurrence.missed
        content = f"{head}]\n{data.get('prompt', '')}"
        key = job_key(job.id, occurrence.due)
        message = {"role": "user", "content": content}
        return Due(
            TapeEntry.message(message, inbound=True, delivery_key=key, message_id="", **meta)
        )
