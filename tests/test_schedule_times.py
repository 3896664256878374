"""When jobs are due: recurring jobs across DST changes (computed times in Europe/Berlin and
America/New_York), catching up after downtime, and bad schedules refused with a reason."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from bub_bot.config import ConfigError, load_settings
from bub_bot.schedules.times import (
    Schedule,
    ScheduleError,
    local_time,
    parse_schedule,
    utc_iso,
)

NOW = datetime(2025, 3, 27, 12, 0, tzinfo=UTC).timestamp()  # a Thursday before the EU change


def parse(**given: object) -> tuple[Schedule, float]:
    values = {"at": None, "in_seconds": None, "cron": None, "tz": None}
    values.update(given)
    return parse_schedule(**values, now=NOW, default_tz="UTC", min_interval=300)  # type: ignore[arg-type]


def runs(schedule: Schedule, first: float, count: int) -> list[float]:
    found = [first]
    while len(found) < count:
        following = schedule.after(found[-1])
        assert following is not None
        found.append(following)
    return found


def utc(*fields: int) -> str:
    return utc_iso(datetime(*fields, tzinfo=UTC).timestamp())


def test_a_nine_oclock_job_stays_at_nine_across_the_spring_change_in_berlin() -> None:
    schedule, first = parse(cron="0 9 * * *", tz="Europe/Berlin")
    times = runs(schedule, first, 4)
    # CET is UTC+1 until the night of 30 March, CEST (UTC+2) after it.
    assert [utc_iso(t) for t in times] == [
        utc(2025, 3, 28, 8, 0),
        utc(2025, 3, 29, 8, 0),
        utc(2025, 3, 30, 7, 0),
        utc(2025, 3, 31, 7, 0),
    ]
    assert [local_time(t, "Europe/Berlin")[11:] for t in times] == [
        "09:00 CET",
        "09:00 CET",
        "09:00 CEST",
        "09:00 CEST",
    ]


def test_new_york_autumn_change_keeps_local_time_and_runs_a_repeated_hour_once() -> None:
    start = datetime(2025, 11, 1, 12, 0, tzinfo=UTC).timestamp()
    ten = Schedule(tz="America/New_York", cron="0 10 * * *")
    first = ten.after(start)
    assert first is not None
    assert [utc_iso(t) for t in runs(ten, first, 3)] == [
        utc(2025, 11, 1, 14, 0),  # EDT: UTC-4
        utc(2025, 11, 2, 15, 0),  # EST from 2 November: UTC-5
        utc(2025, 11, 3, 15, 0),
    ]
    # 01:30 happens twice on 2 November (EDT, then EST): the job runs once, the first time.
    half_past_one = Schedule(tz="America/New_York", cron="30 1 * * *")
    first = half_past_one.after(start)
    assert first is not None
    assert [utc_iso(t) for t in runs(half_past_one, first, 2)] == [
        utc(2025, 11, 2, 5, 30),  # 01:30 EDT
        utc(2025, 11, 3, 6, 30),  # 01:30 EST, the next day
    ]


def test_a_time_the_clocks_skip_runs_when_they_come_back_and_intervals_keep_real_spacing() -> None:
    schedule, first = parse(cron="30 2 * * *", tz="Europe/Berlin")
    assert [local_time(t, "Europe/Berlin") for t in runs(schedule, first, 4)] == [
        "2025-03-28 02:30 CET",
        "2025-03-29 02:30 CET",
        "2025-03-30 03:00 CEST",  # 02:30 does not exist that night
        "2025-03-31 02:30 CEST",
    ]
    # Every 30 minutes through the change: real time, never a doubled or lost run.
    every = Schedule(tz="Europe/Berlin", cron="*/30 * * * *")
    start = datetime(2025, 3, 30, 0, 15, tzinfo=UTC).timestamp()
    first = every.after(start)
    assert first is not None
    times = runs(every, first, 6)
    assert {b - a for a, b in itertools.pairwise(times)} == {1800.0}
    assert local_time(times[1], "Europe/Berlin") == "2025-03-30 03:00 CEST"  # 01:00 UTC


def test_catch_up_runs_once_for_everything_missed() -> None:
    daily = Schedule(tz="Europe/Berlin", cron="0 9 * * *")
    due = datetime(2025, 3, 28, 8, 0, tzinfo=UTC).timestamp()
    now = datetime(2025, 3, 31, 7, 30, tzinfo=UTC).timestamp()  # 09:30 CEST three days on
    latest, missed, following = daily.catch_up(due, now)
    assert utc_iso(latest) == utc(2025, 3, 31, 7, 0) and missed == 3
    assert following is not None and utc_iso(following) == utc(2025, 4, 1, 7, 0)
    # Down for longer than the steps counted one by one: it still lands on the last one.
    often = Schedule(tz="UTC", cron="*/5 * * * *")
    start = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    latest, missed, following = often.catch_up(start, start + 30 * 86400 + 7)
    assert latest == start + 30 * 86400 and following == latest + 300 and missed == 1000
    once = Schedule(tz="UTC", at=start)
    assert once.catch_up(start, start + 99) == (start, 0, None)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"at": "tomorrow at nine"}, "not an ISO 8601 time"),
        ({"at": "2025-03-27T11:59:00+00:00"}, "in the past"),
        ({"at": "2025-03-30T02:30:00", "tz": "Europe/Berlin"}, "does not exist in Europe/Berlin"),
        ({"in_seconds": 60, "tz": "Mars/Olympus_Mons"}, "unknown time zone 'Mars/Olympus_Mons'"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"cron": "0 0 31 4,6 *"}, "never fires"),
        ({"cron": "61 * * * *"}, "bad minute"),
        ({"cron": "0 9 * *"}, "five fields"),
        ({"cron": "0 0 9 * * *"}, "five fields"),
        ({"cron": "*/2 * * * *"}, "2 min apart"),
        ({"cron": "0,1 9 * * *"}, "1 min apart"),
        ({"cron": "59 23 * * *", "at": "2030-01-01T00:00:00Z"}, "exactly one of"),
        ({}, "exactly one of at, in_seconds or cron (got none)"),
        ({"in_seconds": 0}, "at least 1"),
        ({"in_seconds": 11 * 366 * 86400}, "more than ten years ahead"),
    ],
)
def test_bad_schedules_are_refused_with_what_is_wrong(given: dict, says: str) -> None:
    with pytest.raises(ScheduleError) as error:
        parse(**given)
    assert says in str(error.value)


def test_good_schedules() -> None:
    schedule, due = parse(at="2025-03-28T09:00:00+01:00")
    assert (schedule.at, schedule.cron, due) == (due, None, NOW + 20 * 3600)
    schedule, due = parse(at="2025-03-28T09:00:00", tz="Europe/Berlin")  # no offset: the zone
    assert due == NOW + 20 * 3600 and schedule.tz == "Europe/Berlin"
    schedule, due = parse(in_seconds=90)
    assert due == NOW + 90 and not schedule.recurring
    schedule, due = parse(cron="  0   9 * * 1-5 ", tz="America/New_York")
    assert schedule.cron == "0 9 * * 1-5" and schedule.recurring
    assert "(cron '0 9 * * 1-5', America/New_York)" in schedule.describe()


def test_the_bots_time_zone_is_checked_at_start() -> None:
    assert load_settings(require_model=False, _env_file=None, timezone="Asia/Tokyo").timezone
    with pytest.raises(ConfigError) as error:
        load_settings(require_model=False, _env_file=None, timezone="Europe/Atlantis")
    assert "BUB_TIMEZONE" in str(error.value) and "Europe/Atlantis" in str(error.value)
    with pytest.raises(ConfigError) as error:
        load_settings(
            require_model=False,
            _env_file=None,
            schedule_grace_seconds=600,
            schedule_drop_seconds=60,
        )
    assert "BUB_SCHEDULE_DROP_SECONDS" in str(error.value)
