"""The outbound pacer on its own: windows, order, fairness, pauses, cancellation.

Windows here are tens of milliseconds. Checks on times are lower bounds (a request never
starts before its window allows), which a slow machine can only make easier to meet.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import pytest

from bub_bot.config import ConfigError, Settings
from bub_bot.config_values import parse_rate
from channels.pacing import FLOOD_KEYS, Pacer, Rate, Window


@dataclass
class Request:
    key: Hashable
    start: float
    end: float = 0.0


class Recorder:
    """Runs requests through a pacer and records when each started and ended."""

    def __init__(self, pacer: Pacer, duration: float = 0.002) -> None:
        self.pacer = pacer
        self.duration = duration
        self.done: list[Request] = []
        self.started: list[Hashable] = []

    async def request(self, key: Hashable, *, group: bool = False) -> None:
        loop = asyncio.get_running_loop()
        async with self.pacer.turn(key, group=group):
            request = Request(key, loop.time())
            self.started.append(key)
            await asyncio.sleep(self.duration)
            request.end = loop.time()
        self.done.append(request)

    def of(self, key: Hashable) -> list[Request]:
        return [r for r in self.done if r.key == key]


def never_more_than(requests: list[Request], rate: Rate) -> bool:
    """No request started while `rate.count` others were in flight or had ended less than
    `rate.seconds` before it."""
    for r in requests:
        counted = [
            o
            for o in requests
            if o is not r and o.start <= r.start and o.end > r.start - rate.seconds
        ]
        if len(counted) >= rate.count:
            return False
    return True


def test_rate_settings_are_read_and_bad_ones_name_the_setting(
    settings: Callable[..., Settings],
) -> None:
    assert parse_rate("30/s") == (30, 1.0)
    assert parse_rate("20/min") == (20, 60.0)
    assert parse_rate("1/0.1s") == (1, 0.1)
    assert parse_rate("3 / 2 seconds") == (3, 2.0)
    assert parse_rate("off") is None
    assert Rate.parse("20/60s") == Rate(20, 60.0)
    for bad in ("fast", "0/s", "5/0s", "-1/s", "1/h", "1.5/s"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    with pytest.raises(ConfigError, match="BUB_TELEGRAM_RATE_GROUP"):
        settings(telegram_rate_group="20 per minute")
    with pytest.raises(ConfigError, match="BUB_SLACK_RATE_CHANNEL"):
        settings(slack_rate_channel="1/0s")


def test_window_counts_requests_in_flight_and_until_seconds_after_they_end() -> None:
    window = Window(Rate(2, 1.0))
    assert window.free_at(10.0) == 10.0
    window.start()
    window.start()
    assert window.free_at(10.0) == float("inf")  # both in flight: wait for one to end
    window.finish(10.5)
    assert window.free_at(10.6) == 11.5
    window.finish(10.7, counted=False)  # let go but never sent
    assert window.free_at(10.8) == 10.8
    assert not window.idle(11.0)
    assert window.idle(11.5)


async def test_one_key_goes_in_order_one_request_per_window() -> None:
    rate = Rate(1, 0.03)
    rec = Recorder(Pacer(per_key=rate))
    tasks = []
    for _ in range(5):
        tasks.append(asyncio.create_task(rec.request("chat")))
        await asyncio.sleep(0)  # queued in this order
    await asyncio.gather(*tasks)
    requests = rec.of("chat")
    assert [r.start for r in requests] == sorted(r.start for r in requests)
    assert never_more_than(requests, rate)
    for before, after in itertools.pairwise(requests):
        assert after.start >= before.end + rate.seconds


async def test_overall_limit_holds_across_keys() -> None:
    rate = Rate(3, 0.04)
    rec = Recorder(Pacer(overall=rate), duration=0.01)
    await asyncio.gather(*(rec.request(f"chat{i}") for i in range(12)))
    assert len(rec.done) == 12
    assert never_more_than(rec.done, rate)


async def test_group_limit_applies_to_groups_only() -> None:
    group_rate = Rate(2, 0.1)
    pacer = Pacer(per_key=Rate(10, 0.001), per_group=group_rate)
    rec = Recorder(pacer)
    await asyncio.gather(
        *(rec.request("group", group=True) for _ in range(5)),
        *(rec.request("private") for _ in range(5)),
    )
    assert never_more_than(rec.of("group"), group_rate)
    assert not never_more_than(rec.of("private"), group_rate)  # not held to it
    # The private chat never waited for the group's window.
    assert rec.started.index("private") < rec.started.index("group") + 3
    assert max(r.start for r in rec.of("private")) < sorted(r.start for r in rec.of("group"))[2]


async def test_a_busy_key_gets_one_turn_per_round() -> None:
    """Under the overall limit, keys take turns: a key queued behind a long backlog of another
    waits one round, not the whole backlog."""
    rec = Recorder(Pacer(overall=Rate(1, 0.005)), duration=0.001)
    busy = [asyncio.create_task(rec.request("group")) for _ in range(60)]
    await asyncio.sleep(0.02)  # the backlog is being worked through
    light = [asyncio.create_task(rec.request(f"private{i}")) for i in range(5)]
    await asyncio.sleep(0)
    queued_after = len(rec.started)
    assert queued_after < 50  # else this machine is too slow to tell
    await asyncio.gather(*busy, *light)
    order = rec.started
    # Every private chat goes in the first round after they queued: the group's request in
    # flight and its next turn may come first, then the five, then the group again.
    for i in range(5):
        assert order.index(f"private{i}") <= queued_after + 2 + i
    assert order.count("group") == 60


async def test_pause_holds_one_key_and_not_the_others() -> None:
    pacer = Pacer(per_key=Rate(1, 0.001))
    rec = Recorder(pacer)
    loop = asyncio.get_running_loop()
    paused_at = loop.time()
    pacer.pause("slow", 0.1)
    await asyncio.gather(rec.request("slow"), rec.request("other"))
    assert rec.started == ["other", "slow"]
    assert rec.of("slow")[0].start >= paused_at + 0.1
    assert pacer.paused_for("slow") == 0.0
    pacer.pause("slow", 60)
    assert 59 < pacer.paused_for("slow") <= 60 and pacer.paused_for("other") == 0.0


async def test_floods_in_several_keys_pause_everything() -> None:
    pacer = Pacer(per_key=Rate(1, 0.001))
    loop = asyncio.get_running_loop()
    for n in range(FLOOD_KEYS - 1):
        assert pacer.flood(f"chat{n}", 0.1) is False
    paused_at = loop.time()
    assert pacer.flood("chat-last", 0.1) is True
    rec = Recorder(pacer)
    await rec.request("fresh")  # never told to wait itself, but the limit is bot-wide
    assert rec.done[0].start >= paused_at + 0.1
    assert pacer.floods == FLOOD_KEYS


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    pacer = Pacer(per_key=Rate(1, 0.02))
    rec = Recorder(pacer, duration=0.01)
    first = asyncio.create_task(rec.request("chat"))
    await asyncio.sleep(0)
    second = asyncio.create_task(rec.request("chat"))
    third = asyncio.create_task(rec.request("chat"))
    await asyncio.sleep(0.001)
    second.cancel()
    await asyncio.gather(first, third)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert len(rec.done) == 2 and pacer.waiting == 0


async def test_a_turn_granted_but_cancelled_before_use_is_given_back() -> None:
    pacer = Pacer(per_key=Rate(1, 0.0))  # one request in flight at a time

    async def enter() -> None:
        async with pacer.turn("chat"):
            pass

    async with pacer.turn("chat"):
        waiting = asyncio.create_task(enter())
        await asyncio.sleep(0)
    # Leaving the block handed the turn to `waiting`, which has not run yet.
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(enter(), 1)  # not held by a turn nobody used


async def test_idle_keys_are_forgotten() -> None:
    pacer = Pacer(per_key=Rate(1, 0.001))
    rec = Recorder(pacer, duration=0)
    for round_ in range(3):
        await asyncio.gather(*(rec.request((round_, i)) for i in range(200)))
        await asyncio.sleep(0.01)
    assert len(rec.done) == 600
    assert pacer.tracked < 300  # swept every 256 requests


async def test_a_key_that_turns_out_to_be_a_group_keeps_its_counts() -> None:
    group_rate = Rate(1, 0.03)
    pacer = Pacer(per_key=Rate(5, 0.001), per_group=group_rate)
    async with pacer.turn("chat"):  # not known as a group yet
        async with pacer.turn("chat", group=True):  # now it is: its group window starts here
            pass
    rec = Recorder(pacer)
    await asyncio.gather(*(rec.request("chat", group=True) for _ in range(3)))
    assert never_more_than(rec.done, group_rate)
