"""Outbound pacing: keep a bot under a platform's send limits, fairly across chats.

A `Pacer` hands out turns to send. Each request to the platform is one turn:

    async with pacer.turn(chat_id, group=True):
        await bot.send_message(...)

Limits are sliding windows (`Rate`: at most `count` requests in any `seconds`) for the whole
bot, for each key (a chat, a Slack channel) and, on top, for each key marked `group`. A
request holds its place in every window from the moment it is let go until `seconds` after it
*finished*: the platform saw it somewhere in between, so however long the request took on the
wire, the platform never counts more than `count` in any window of its own.

Fairness: keys with waiting requests take turns (round robin), one request each per round,
among those whose own windows allow a request now. A key with a long backlog (a busy group)
gets one turn per round like every other key, so a private chat waits at most one round.
Within a key requests go out first come, first served, one after the other when the key's
window holds one request (the usual 1/s per chat), which keeps pieces in order.

Two classes of request. A *final* one (a piece of an answer) is what the budget is for. A
*partial* one (a streamed draft or edit, typing) is sent with `partial=owner` and takes only
budget no final needs: it is let go only when no final request can go now, only while every
window it counts in keeps `reserve` of its count free (so a final that becomes ready finds a
place at once), and never ahead of a final of its own key. `drop(owner)` takes the owner's
partial requests that are still waiting out of the queue (they raise `Dropped`): a stream calls
it when its final answer is ready, so the answer never waits behind its stale partials. Under a
backlog of finals partials simply wait (the stream sends fewer, larger steps) and the finals go
at the full rate. `spare()` is for a request that is only worth sending now (typing): it takes
a place in the overall window when a partial could, or reports that there is none.

Pauses: a 429 with a retry-after pauses its key (`flood`), or everything (`pause_all`, or
`flood` when several keys are told to wait at once, which is how a bot-wide limit shows).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass

from bub_bot.config_values import parse_rate

log = logging.getLogger("channels.pacing")

FLOOD_KEYS = 3
"""How many keys told to wait within `FLOOD_SPAN` seconds make a flood bot-wide."""
FLOOD_SPAN = 1.0
RESERVE = 0.25
"""The share of each window's count that partial requests leave free for finals (rounded
down: a window of one request a second keeps none, 30 a second keep 7, 20 a minute keep 5),
so that a burst of answers right after a lull the partials used goes at once."""
_SWEEP_EVERY = 256


class Dropped(Exception):
    """A partial request was taken out of the queue before its turn (`Pacer.drop`)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `count` requests in any `seconds`."""

    count: int
    seconds: float

    @classmethod
    def parse(cls, value: str) -> Rate | None:
        """A rate setting (`30/s`, `20/min`, `1/0.1s`); None for `off`."""
        parsed = parse_rate(value)
        return cls(*parsed) if parsed else None

    def __str__(self) -> str:
        return f"{self.count}/{self.seconds:g}s"


class Window:
    """The requests one `Rate` counts: those in flight and those finished in its last window.

    `reserve`: places a partial request leaves free (see the module)."""

    __slots__ = ("busy", "finished", "rate", "reserve")

    def __init__(self, rate: Rate, reserve: float = 0.0) -> None:
        self.rate = rate
        self.reserve = int(rate.count * reserve)
        self.busy = 0
        self.finished: deque[float] = deque()

    def free_at(self, now: float, *, partial: bool = False) -> float:
        """The earliest time another request fits (`now` if it does, inf until one finishes);
        `partial`: one that leaves `reserve` places free."""
        finished, seconds = self.finished, self.rate.seconds
        while finished and finished[0] <= now - seconds:
            finished.popleft()
        over = self.busy + len(finished) - self.rate.count + 1
        if partial:
            over += self.reserve
        if over <= 0:
            return now
        if over > len(finished):
            return math.inf
        return finished[over - 1] + seconds

    def idle(self, now: float) -> bool:
        """Nothing in flight and nothing counted any more."""
        self.free_at(now)  # drops what left the window
        return self.busy == 0 and not self.finished

    def start(self) -> None:
        self.busy += 1

    def finish(self, now: float, *, counted: bool = True) -> None:
        self.busy -= 1
        if counted:
            self.finished.append(now)


Waiter = asyncio.Future[tuple[Window, ...]]


class _Lane:
    """One key's queues of waiting requests (finals, partials), its windows and its pause."""

    __slots__ = ("group", "partials", "paused_until", "waiters", "windows")

    def __init__(self, windows: list[Window]) -> None:
        self.waiters: deque[Waiter] = deque()
        self.partials: deque[tuple[Waiter, Hashable]] = deque()
        self.windows = windows
        self.group = False
        self.paused_until = 0.0

    def ready_at(self, now: float, *, partial: bool = False) -> float:
        at = max(now, self.paused_until)
        for window in self.windows:
            at = max(at, window.free_at(now, partial=partial))
        return at

    def idle(self, now: float) -> bool:
        return (
            not self.waiters
            and not self.partials
            and self.paused_until <= now
            and all(window.idle(now) for window in self.windows)
        )


class Pacer:
    """A fair scheduler of outbound requests under sliding-window limits (see the module).

    `overall` limits the whole bot, `per_key` each key, `per_group` each key sent with
    `group=True` (on top of `per_key`); None means no such limit.
    """

    def __init__(
        self,
        *,
        overall: Rate | None = None,
        per_key: Rate | None = None,
        per_group: Rate | None = None,
        reserve: float = RESERVE,
        name: str = "pacer",
    ) -> None:
        self.reserve = reserve
        self.overall = Window(overall, reserve) if overall else None
        self.per_key = per_key
        self.per_group = per_group
        self.name = name
        self.paused_until = 0.0
        self.floods = 0
        """429s reported through `flood` (for logs and metrics)."""
        self.dropped = 0
        """Partial requests taken out of the queue by `drop` (for logs and benchmarks)."""
        self._lanes: dict[Hashable, _Lane] = {}
        self._queue: OrderedDict[Hashable, _Lane] = OrderedDict()  # lanes with finals, in turn
        self._partials: OrderedDict[Hashable, _Lane] = OrderedDict()  # lanes with partials
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._recent_floods: deque[tuple[float, Hashable]] = deque()
        self._releases = 0

    # -- public --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def turn(
        self, key: Hashable, *, group: bool = False, partial: Hashable | None = None
    ) -> AsyncIterator[None]:
        """Wait for `key`'s turn; the block is one request (it counts until `seconds` after
        the block ends, also when the request failed). `partial`: the request is a partial
        one of this owner (see the module); it raises `Dropped` when `drop(owner)` takes it
        out of the queue before its turn."""
        loop = asyncio.get_running_loop()
        lane = self._lane(key, group)
        waiter: Waiter = loop.create_future()
        if partial is None:
            lane.waiters.append(waiter)
            self._queue.setdefault(key, lane)
        else:
            lane.partials.append((waiter, partial))
            self._partials.setdefault(key, lane)
        self._pump()
        try:
            windows = await waiter  # the windows this request counts in
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result(), counted=False)  # let go but never used
            else:
                self._forget(key, lane, waiter, partial)
                self._pump()
            raise
        try:
            yield
        finally:
            self._release(windows)

    def drop(self, owner: Hashable) -> int:
        """Take `owner`'s partial requests that still wait out of the queue (each raises
        `Dropped`); returns how many. One already let go is not touched."""
        dropped = 0
        for key, lane in list(self._partials.items()):
            keep: deque[tuple[Waiter, Hashable]] = deque()
            for waiter, who in lane.partials:
                if who == owner and not waiter.done():
                    waiter.set_exception(Dropped())
                    dropped += 1
                else:
                    keep.append((waiter, who))
            lane.partials = keep
            if not keep:
                del self._partials[key]
        if dropped:
            self.dropped += dropped
            self._pump()
        return dropped

    def spare(self) -> bool:
        """Whether a partial request could go now (no final can, the reserve is kept,
        nothing is paused): for something only worth sending now and not counted in any
        window (typing), which is then skipped rather than queued."""
        now = self._now()
        if self.paused_until > now or self._final_ready(now):
            return False
        return self.overall is None or self.overall.free_at(now, partial=True) <= now

    def pause(self, key: Hashable, seconds: float) -> None:
        """Send nothing to `key` for `seconds` (what a 429's retry-after asks for)."""
        lane = self._lane(key, False)
        lane.paused_until = max(lane.paused_until, self._now() + seconds)
        self._pump()

    def pause_all(self, seconds: float) -> None:
        """Send nothing at all for `seconds` (a bot-wide or per-method 429)."""
        self.paused_until = max(self.paused_until, self._now() + seconds)
        self._pump()

    def flood(self, key: Hashable, seconds: float) -> bool:
        """A 429 for `key`: pause it; when `FLOOD_KEYS` different keys were told to wait within
        `FLOOD_SPAN` seconds the limit is bot-wide, so pause everything. True if it did."""
        self.floods += 1
        now = self._now()
        recent = self._recent_floods
        recent.append((now, key))
        while recent and recent[0][0] < now - FLOOD_SPAN:
            recent.popleft()
        self.pause(key, seconds)
        if len({k for _, k in recent}) >= FLOOD_KEYS:
            recent.clear()
            log.warning("%s.flood bot-wide: pausing every send for %.1fs", self.name, seconds)
            self.pause_all(seconds)
            return True
        return False

    def paused_for(self, key: Hashable) -> float:
        """Seconds until `key` may send again after a pause (0 when it is not paused)."""
        lane = self._lanes.get(key)
        until = max(self.paused_until, lane.paused_until if lane else 0.0)
        return max(0.0, until - self._now())

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn now (finals and partials)."""
        lanes = {id(lane): lane for lane in (*self._queue.values(), *self._partials.values())}
        return sum(len(lane.waiters) + len(lane.partials) for lane in lanes.values())

    @property
    def tracked(self) -> int:
        """Keys the pacer keeps state for (idle ones are forgotten every few hundred turns)."""
        return len(self._lanes)

    # -- the scheduler -------------------------------------------------------------------------
    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _lane(self, key: Hashable, group: bool) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None:
            windows = [Window(self.per_key, self.reserve)] if self.per_key else []
            lane = self._lanes[key] = _Lane(windows)
        if group and not lane.group:
            lane.group = True
            if self.per_group:
                lane.windows.append(Window(self.per_group, self.reserve))
        return lane

    def _forget(self, key: Hashable, lane: _Lane, waiter: Waiter, partial: Hashable | None) -> None:
        """A waiter cancelled before its turn leaves its queue."""
        with contextlib.suppress(ValueError):
            if partial is None:
                lane.waiters.remove(waiter)
            else:
                lane.partials.remove((waiter, partial))
        if not lane.waiters:
            self._queue.pop(key, None)
        if not lane.partials:
            self._partials.pop(key, None)

    def _release(self, windows: tuple[Window, ...], *, counted: bool = True) -> None:
        now = self._now()
        for window in windows:
            window.finish(now, counted=counted)
        self._releases += 1
        if self._releases % _SWEEP_EVERY == 0:
            self._sweep(now)
        self._pump()

    def _sweep(self, now: float) -> None:
        """Forget keys with nothing waiting, in flight or counted (chats come and go)."""
        for key in [k for k, lane in self._lanes.items() if lane.idle(now)]:
            del self._lanes[key]

    def _pump(self) -> None:
        """Let go as many requests as the limits allow now, finals first, taking keys in
        turn; then set a timer for the moment the next one fits."""
        now = self._now()
        while self._queue or self._partials:
            at = max(now, self.paused_until)
            if self.overall:
                at = max(at, self.overall.free_at(now))
            if at > now:
                self._wake_at(at)
                return
            soonest = self._grant_final(now)
            if soonest is None:
                continue
            later = self._grant_partial(now)
            if later is None:
                continue
            soonest = min(soonest, later)
            if soonest < math.inf:
                self._wake_at(soonest)
            return

    def _grant_final(self, now: float) -> float | None:
        """Let one final request go if one can; else when the soonest could (inf: when a
        request ends)."""
        soonest = math.inf
        for key, lane in self._queue.items():
            # A waiter cancelled before its turn is skipped (and removed by its task).
            while lane.waiters and lane.waiters[0].done():
                lane.waiters.popleft()
            if not lane.waiters:
                continue
            ready = lane.ready_at(now)
            if ready <= now:
                self._grant(key, lane)
                return None
            soonest = min(soonest, ready)
        for key in [k for k, lane in self._queue.items() if not lane.waiters]:
            del self._queue[key]
        return soonest

    def _grant_partial(self, now: float) -> float | None:
        """Let one partial request go if one can (no final could go now: `_grant_final` just
        said so); else when the soonest could."""
        if not self._partials:
            return math.inf
        if self.overall and (at := self.overall.free_at(now, partial=True)) > now:
            return at
        soonest = math.inf
        for key, lane in self._partials.items():
            while lane.partials and lane.partials[0][0].done():
                lane.partials.popleft()
            if not lane.partials or lane.waiters:
                continue  # a final of this key goes first
            ready = lane.ready_at(now, partial=True)
            if ready <= now:
                self._grant(key, lane, partial=True)
                return None
            soonest = min(soonest, ready)
        for key in [k for k, lane in self._partials.items() if not lane.partials]:
            del self._partials[key]
        return soonest

    def _final_ready(self, now: float) -> bool:
        """A final request waits and its own windows would let it go now."""
        return any(
            lane.waiters and lane.ready_at(now) <= now
            for lane in self._queue.values()
            if any(not w.done() for w in lane.waiters)
        )

    def _grant(self, key: Hashable, lane: _Lane, *, partial: bool = False) -> None:
        waiter = lane.partials.popleft()[0] if partial else lane.waiters.popleft()
        windows = (self.overall, *lane.windows) if self.overall else tuple(lane.windows)
        for window in windows:
            window.start()
        waiter.set_result(windows)
        queue, left = (self._partials, lane.partials) if partial else (self._queue, lane.waiters)
        if left:
            queue.move_to_end(key)  # the next round starts with the other keys
        else:
            del queue[key]

    def _wake_at(self, at: float) -> None:
        if self._timer is not None:
            if self._timer_at <= at:
                return  # an earlier wake-up is set; it sets the next one
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._pump()
