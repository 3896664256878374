"""Calendar windows in BUB_TIMEZONE as counter window keys (`d:2026-12-02`, `m:…T06:51`,
`h:…T06`, `M:2026-12`), and when each one ends (when a person can write again)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo


@dataclass(frozen=True, slots=True)
class Moment:
    """One instant seen in the operator's zone, with the window keys it falls in."""

    local: datetime

    @classmethod
    def at(cls, unix: float, zone: ZoneInfo) -> Moment:
        return cls(datetime.fromtimestamp(unix, zone))

    @property
    def day(self) -> str:
        return "d:" + self.local.strftime("%Y-%m-%d")

    @property
    def month_first(self) -> str:
        """The first day key of this month (a month's tokens are the sum of its days)."""
        return "d:" + self.local.strftime("%Y-%m-01")

    @property
    def month_last(self) -> str:
        return "d:" + self.local.strftime("%Y-%m-31")

    def key(self, unit: str) -> str:
        """The window key of `unit` (minute, hour, day, month) this moment is in."""
        if unit == "minute":
            return "m:" + self.local.strftime("%Y-%m-%dT%H:%M")
        if unit == "hour":
            return "h:" + self.local.strftime("%Y-%m-%dT%H")
        if unit == "day":
            return self.day
        return "M:" + self.local.strftime("%Y-%m")

    def end(self, unit: str) -> datetime:
        """When the window of `unit` this moment is in ends (local time)."""
        t = self.local
        if unit == "minute":
            start = t.replace(second=0, microsecond=0)
            return start + timedelta(minutes=1)
        if unit == "hour":
            start = t.replace(minute=0, second=0, microsecond=0)
            return start + timedelta(hours=1)
        day = t.replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
        if unit == "day":
            nxt = day + timedelta(days=1)
        else:
            nxt = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
        return nxt.replace(tzinfo=t.tzinfo)  # midnight local (wall clock across DST)


def when_text(end: datetime, now: datetime) -> str:
    """`at 14:05`, `tomorrow at 00:00`, or `on 2027-01-01 at 00:00` (the zone's name after)."""
    zone = end.tzname() or ""
    clock = end.strftime("%H:%M")
    if end.date() == now.date():
        return f"at {clock} {zone}".rstrip()
    if end.date() == now.date() + timedelta(days=1):
        return f"tomorrow at {clock} {zone}".rstrip()
    return f"on {end.strftime('%Y-%m-%d')} at {clock} {zone}".rstrip()
