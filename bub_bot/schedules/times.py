"""When a job is due: a one-off time, or a five-field cron expression read in an IANA zone.

Times are UNIX seconds (UTC) everywhere they are stored or compared; a zone matters only
for reading a cron expression (a 09:00 job stays at 09:00 local time across DST changes)
and for showing a time to people. Zones come from the standard library's `zoneinfo`; cron
expressions from `cronsim`, which follows Debian cron at DST changes: a time the clocks skip
(02:30 on the spring-forward night) runs when the clocks come back to real time (03:00), a
time they pass twice (01:30 on the fall-back night) runs once, the first time; jobs with a
`*` hour or minute (`*/15 * * * *`) keep their real spacing.

Everything a person or the model gives is checked here, and a `ScheduleError` says what is
wrong in words they can act on.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

HORIZON_SECONDS = 10 * 366 * 86400
"""How far ahead a job may be: ten years (further is a mistake, not a plan)."""
CATCH_UP_STEPS = 1000
"""Due times counted one by one when a recurring job missed several (then it jumps)."""


class ScheduleError(ValueError):
    """What is wrong with a schedule as given, in words the model or a person can act on."""


def zone_named(name: str) -> ZoneInfo:
    """The IANA zone `name` (Europe/Berlin, America/New_York, UTC); ValueError naming it."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ScheduleError(f"unknown time zone {name!r}: use an IANA name like Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"unknown time zone {name!r}: use an IANA name like Europe/Berlin or America/New_York"
        ) from None


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a job runs: once at `at`, or every time `cron` matches in zone `tz`."""

    tz: str
    at: float | None = None
    cron: str | None = None

    @property
    def recurring(self) -> bool:
        return self.cron is not None

    @property
    def zone(self) -> ZoneInfo:
        return zone_named(self.tz)

    def after(self, t: float) -> float | None:
        """The first due time strictly after `t` (None: a one-off job, or a cron expression
        that never matches again)."""
        if self.cron is None:
            return None
        start = datetime.fromtimestamp(t, self.zone)
        try:
            found = next(CronSim(self.cron, start))
        except StopIteration:  # no match for 50 years
            return None
        return found.timestamp()

    def latest(self, t: float) -> float | None:
        """The last due time at or before `t` (recurring jobs; None when there is none)."""
        if self.cron is None:
            return None
        start = datetime.fromtimestamp(t, self.zone)
        try:
            return next(CronSim(self.cron, start, reverse=True)).timestamp()
        except StopIteration:
            return None

    def catch_up(self, due: float, now: float) -> tuple[float, int, float | None]:
        """Everything from `due` to `now` runs once: returns the due time that run stands for
        (the latest one passed), how many earlier ones it folds in, and the next after `now`.
        A one-off job: (`due`, 0, None)."""
        if self.cron is None:
            return due, 0, None
        latest, missed = due, 0
        following = self.after(due)
        while following is not None and following <= now and missed < CATCH_UP_STEPS:
            latest, missed = following, missed + 1
            following = self.after(following)
        if following is not None and following <= now:
            # Down for longer than CATCH_UP_STEPS runs: jump to the last one.
            latest = self.latest(now) or latest
            following = self.after(now)
        return latest, missed, following

    def describe(self) -> str:
        """The schedule in words: "once" or the cron expression explained, with the zone."""
        if self.cron is None:
            return "once"
        try:
            words = CronSim(self.cron, datetime.now(UTC)).explain()
        except Exception:  # the explanation is a courtesy; the expression is the fact
            words = ""
        text = f"{words} (cron {self.cron!r}" if words else f"cron {self.cron!r}"
        return f"{text}, {self.tz})" if words else f"{text} ({self.tz})"


def parse_schedule(
    *,
    at: str | None,
    in_seconds: float | None,
    cron: str | None,
    tz: str | None,
    now: float,
    default_tz: str,
    min_interval: float,
) -> tuple[Schedule, float]:
    """Check a schedule as the model or a person gives it; returns it and its first due
    time. Exactly one of `at` (ISO 8601; without an offset it is read in the zone),
    `in_seconds` (from `now`) or `cron` (five fields, repeating at least `min_interval`
    seconds apart). `tz`: an IANA zone, default `default_tz`. ScheduleError says what is
    wrong."""
    options = (("at", at), ("in_seconds", in_seconds), ("cron", cron))
    given = [name for name, value in options if value is not None]
    if len(given) != 1:
        which = "none" if not given else " and ".join(given)
        raise ScheduleError(f"give exactly one of at, in_seconds or cron (got {which})")
    zone_name = tz if tz is not None else default_tz
    zone = zone_named(zone_name)
    if cron is not None:
        schedule = Schedule(tz=zone_name, cron=_check_cron(cron, min_interval))
        first = schedule.after(now)
        if first is None:
            raise ScheduleError(f"cron {cron!r} never fires (no matching date for 50 years)")
        due = first
    elif in_seconds is not None:
        if not math.isfinite(in_seconds) or in_seconds < 1:
            raise ScheduleError(f"in_seconds must be at least 1 (got {in_seconds})")
        due = now + in_seconds
    else:
        assert at is not None
        due = _parse_at(at, zone, zone_name)
        if due <= now:
            raise ScheduleError(
                f"at {at!r} is in the past (it is now {local_time(now, zone_name)}); give a"
                " future time"
            )
    if due - now > HORIZON_SECONDS:
        raise ScheduleError(f"{local_time(due, zone_name)} is more than ten years ahead")
    return (schedule if cron is not None else Schedule(tz=zone_name, at=due)), due


def _parse_at(text: str, zone: ZoneInfo, zone_name: str) -> float:
    raw = text.strip()
    try:
        # fromisoformat reads ISO 8601 (3.11: "Z", week dates, basic format too).
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ScheduleError(
            f"at {text!r} is not an ISO 8601 time: write it like 2030-05-01T09:00:00+02:00"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
        if moment != moment.astimezone(UTC).astimezone(zone):
            raise ScheduleError(
                f"at {text!r} does not exist in {zone_name} (the clocks skip it that day);"
                " give another time or an offset"
            )
    return moment.timestamp()


def _check_cron(expression: str, min_interval: float) -> str:
    cron = " ".join(expression.split())
    fields = cron.split(" ") if cron else []
    if len(fields) != 5:
        raise ScheduleError(
            f"cron {expression!r} must have five fields: minute hour day-of-month month"
            " day-of-week (e.g. '0 9 * * 1-5' for 09:00 on weekdays)"
        )
    try:
        parsed = CronSim(cron, datetime.now(UTC))
    except CronSimError as exc:
        if _valid_fields(fields):
            # Each field is fine, the combination is not (the 30th of February).
            raise ScheduleError(
                f"cron {expression!r} never fires: no month it names has that day"
            ) from None
        cause = str(exc) or "unreadable"
        raise ScheduleError(f"cron {expression!r}: {cause.lower()}") from None
    gap = _shortest_gap(parsed) * 60
    if gap < min_interval:
        raise ScheduleError(
            f"cron {expression!r} runs {span(gap)} apart; recurring jobs here must be at"
            f" least {span(min_interval)} apart"
        )
    return cron


def _valid_fields(fields: list[str]) -> bool:
    """Whether the fields parse on their own (with any month)."""
    try:
        CronSim(" ".join([*fields[:3], "*", fields[4]]), datetime.now(UTC))
    except CronSimError:
        return False
    return True


def _shortest_gap(parsed: CronSim) -> int:
    """Minutes between the two closest runs of a day (or the last of one day and the first
    of the next): the cron's shortest interval."""
    times = sorted(h * 60 + m for h in parsed.hours for m in parsed.minutes)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    gaps.append(times[0] + 1440 - times[-1])
    return min(gaps)


def local_time(t: float, tz: str) -> str:
    """`t` as people read it in zone `tz`: 2030-05-01 09:00 CEST (seconds when it has them)."""
    moment = datetime.fromtimestamp(round(t), zone_named(tz))
    shape = "%Y-%m-%d %H:%M:%S %Z" if moment.second else "%Y-%m-%d %H:%M %Z"
    return moment.strftime(shape).strip()


def utc_iso(t: float) -> str:
    """`t` as ISO 8601 UTC with milliseconds (dedupe keys, meta)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def span(seconds: float) -> str:
    """A duration in words: 45 s, 5 min, 2 h 5 min, 3 d 4 h."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    delta = timedelta(seconds=seconds)
    days, rest = delta.days, delta.seconds
    hours, minutes = rest // 3600, rest % 3600 // 60
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min"
