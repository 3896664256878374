"""The pacer's two classes of request: finals (answers) first, partials (streamed drafts and
edits, typing) only from budget the finals do not need, and dropped when their final is ready.

Checks are on order and counts: requests hold their turn until the test lets them go, so
what has started at a given moment depends on the pacer's decisions only, not on timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from channels.pacing import Dropped, Pacer, Rate

LONG = 60.0
"""A window so long that nothing leaves it while a test runs: counts decide everything."""


class Held:
    """Requests that take their turn and hold it until `release()`; `started` keeps order."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.started: list[str] = []
        self.dropped: list[str] = []
        self._go = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def request(
        self, name: str, key: Hashable | None = None, *, partial: Hashable | None = None
    ) -> asyncio.Task[None]:
        async def run() -> None:
            try:
                async with self.pacer.turn(key if key is not None else name, partial=partial):
                    self.started.append(name)
                    await self._go.wait()
            except Dropped:
                self.dropped.append(name)

        task = asyncio.create_task(run())
        self.tasks.append(task)
        return task

    def release(self) -> None:
        self._go.set()

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)


async def test_a_final_goes_before_every_partial_queued_ahead_of_it() -> None:
    pacer = Pacer(overall=Rate(1, 0.001))  # one request at a time, in queue order
    held = Held(pacer)
    held.request("first")
    await held.settle()
    for n in range(5):
        held.request(f"draft{n}", partial=f"stream{n}")
    await held.settle()
    held.request("answer")
    await held.settle()
    assert held.started == ["first"]
    held.release()
    await asyncio.gather(*held.tasks)
    assert held.started[1] == "answer"
    assert sorted(held.started[2:]) == [f"draft{n}" for n in range(5)]


async def test_partials_leave_the_reserve_to_finals() -> None:
    pacer = Pacer(overall=Rate(10, LONG), reserve=0.2)  # partials leave 2 of 10 free
    held = Held(pacer)
    for n in range(20):
        held.request(f"draft{n}", partial=f"stream{n}")
    await held.settle()
    assert len(held.started) == 8
    held.request("answer1")
    held.request("answer2")
    await held.settle()
    assert held.started[-2:] == ["answer1", "answer2"]  # at once, past 18 waiting partials
    assert len(held.started) == 10
    for task in held.tasks:
        task.cancel()


async def test_a_partial_takes_nothing_while_a_final_could_go() -> None:
    pacer = Pacer(overall=Rate(1, 0.001), reserve=0)
    held = Held(pacer)
    held.request("first")
    await held.settle()
    for n in range(3):
        held.request(f"answer{n}")
    held.request("draft", partial="stream")
    await held.settle()
    held.release()
    await asyncio.gather(*held.tasks)
    assert held.started == ["first", "answer0", "answer1", "answer2", "draft"]


async def test_a_final_held_by_its_own_chat_window_does_not_stop_other_partials() -> None:
    # The busy chat's answer waits for its chat's window; the bot-wide budget is free, so
    # another chat's draft may use it (the reserve stays free for answers).
    pacer = Pacer(overall=Rate(10, LONG), per_key=Rate(1, LONG))
    held = Held(pacer)
    held.request("busy-first", "busy")
    await held.settle()
    held.request("busy-answer", "busy")
    held.request("quiet-draft", "quiet", partial="stream")
    await held.settle()
    assert held.started == ["busy-first", "quiet-draft"]
    for task in held.tasks:
        task.cancel()


async def test_a_partial_never_goes_ahead_of_a_final_of_its_own_key() -> None:
    pacer = Pacer(per_key=Rate(1, 0.001))
    held = Held(pacer)
    held.request("first", "chat")
    await held.settle()
    held.request("draft", "chat", partial="stream")
    held.request("answer", "chat")
    await held.settle()
    held.release()
    await asyncio.gather(*held.tasks)
    assert held.started == ["first", "answer", "draft"]


async def test_drop_takes_a_streams_waiting_partials_out_and_no_others() -> None:
    pacer = Pacer(overall=Rate(1, 0.001))
    held = Held(pacer)
    held.request("first")
    await held.settle()
    held.request("a1", partial="a")
    held.request("b1", partial="b")
    held.request("a2", partial="a")
    await held.settle()
    assert pacer.drop("a") == 2
    assert pacer.drop("a") == 0
    await held.settle()
    assert sorted(held.dropped) == ["a1", "a2"]
    assert pacer.waiting == 1 and pacer.dropped == 2
    held.release()
    await asyncio.gather(*held.tasks)
    assert held.started == ["first", "b1"]


async def test_drop_leaves_a_partial_already_let_go_alone() -> None:
    pacer = Pacer(overall=Rate(5, LONG))
    held = Held(pacer)
    held.request("draft", partial="stream")
    await held.settle()
    assert pacer.drop("stream") == 0
    held.release()
    await asyncio.gather(*held.tasks)
    assert held.started == ["draft"] and not held.dropped


async def test_a_cancelled_partial_leaves_no_trace() -> None:
    pacer = Pacer(overall=Rate(1, 0.001))
    held = Held(pacer)
    held.request("first")
    await held.settle()
    draft = held.request("draft", partial="stream")
    await held.settle()
    draft.cancel()
    with pytest.raises(asyncio.CancelledError):
        await draft
    assert pacer.waiting == 0
    held.release()
    await asyncio.gather(*held.tasks[:1])
    async with pacer.turn("later"):
        pass


async def test_spare_is_there_only_when_no_final_needs_the_budget() -> None:
    pacer = Pacer(overall=Rate(10, LONG), reserve=0.2)
    assert pacer.spare()
    held = Held(pacer)
    for n in range(7):
        held.request(f"answer{n}")
    await held.settle()
    assert pacer.spare()  # 7 in the window: a partial would leave the 2 reserved
    held.request("answer7")
    await held.settle()
    assert not pacer.spare()  # 8 of 10: only the reserve is left
    for task in held.tasks:
        task.cancel()
    one = Pacer(overall=Rate(1, 0.001), reserve=0)
    held = Held(one)
    held.request("first")
    await held.settle()
    held.request("answer")
    await held.settle()
    assert not one.spare()  # the window is full
    held.release()
    await asyncio.gather(*held.tasks)
    await asyncio.sleep(0.01)  # both left the window
    assert one.spare()
    one.pause_all(LONG)
    assert not one.spare()


async def test_under_a_backlog_of_finals_partials_wait_and_finals_keep_the_full_rate() -> None:
    """Twenty answers and a stream offering a draft all the time: the answers go one after
    the other (nothing in between), and the drafts that did not go were dropped, not sent."""
    pacer = Pacer(overall=Rate(1, 0.001), reserve=0)
    order: list[str] = []

    async def answer(n: int) -> None:
        async with pacer.turn(f"chat{n}"):
            order.append("answer")
            await asyncio.sleep(0)

    async def drafts() -> int:
        sent = 0
        while len([o for o in order if o == "answer"]) < 20:
            try:
                async with pacer.turn("streaming", partial="stream"):
                    order.append("draft")
                    sent += 1
            except Dropped:
                continue
        return sent

    answers = [asyncio.create_task(answer(n)) for n in range(20)]
    stream = asyncio.create_task(drafts())
    await asyncio.gather(*answers)
    pacer.drop("stream")
    await stream
    first, last = order.index("answer"), len(order) - order[::-1].index("answer")
    assert order[first:last] == ["answer"] * 20
