"""The budgets and rate limits of one bot: what a message or a model call adds to the usage
counters in the store, and whether a payer may still call the model.

Counters live in the store (tape/usage.py) and move in the transaction that writes what they
count: an inbound message's with the message, a model step's with its `run` event. So several
replicas share them and a restart keeps them; nothing is counted in memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..limits import Budget, Limits, limits_from, price_of
from ..schedules.times import zone_named
from ..tape import Counting, TapeEntry, TapeStore, UsageAdd, UsageRow
from ..workspaces import WorkspaceMap, load_workspace_map
from .payer import Payer
from .windows import Moment, when_text

LIMIT_NOTICE = "limit.notice"
"""The event name of the note a message over a rate limit gets (a reply with its own target,
once per window)."""


@dataclass(frozen=True, slots=True)
class Spent:
    """A budget that is used up: whose, which, and when it resets."""

    scope: str
    """user | conversation | total"""
    budget: Budget
    until: str

    @property
    def reason(self) -> str:
        return f"budget_{self.scope}"

    def what(self) -> str:
        """`Your daily budget (200000 tokens/day) is used up`."""
        whose = {"user": "Your", "conversation": "This conversation's", "total": "The bot's"}
        return (
            f"{whose[self.scope]} {'daily' if self.budget.unit == 'day' else 'monthly'} budget"
            f" ({self.budget.text()}) is used up"
        )

    def text(self) -> str:
        """The note a turn stopped by the budget ends with."""
        return f"{self.what()}, so I stopped here. It resets {self.until}."


@dataclass(frozen=True, slots=True)
class StepUsage:
    """What one model call used, as the provider reported it (or estimated)."""

    tokens_in: int
    tokens_out: int
    estimated: int = 0


def step_usage(usage: dict[str, Any], sent: Any = None, answer: str = "") -> StepUsage:
    """Tokens from a reply's usage; a provider that reports none: estimated from the text
    (about 4 characters a token), and marked estimated."""
    tin, tout = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(tin, int) and isinstance(tout, int):
        return StepUsage(tin, tout)
    est_in = tin if isinstance(tin, int) else max(1, len(str(sent or "")) // 4)
    est_out = tout if isinstance(tout, int) else max(1, len(answer) // 4)
    estimated = (0 if isinstance(tin, int) else est_in) + (0 if isinstance(tout, int) else est_out)
    return StepUsage(est_in, est_out, estimated)


class Budgets:
    """Limits per session, the counters they add, and the checks against them."""

    def __init__(
        self,
        store: TapeStore,
        limits: Limits,
        zone: str = "UTC",
        workspaces: WorkspaceMap | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.limits = limits
        self.zone = zone_named(zone)
        self.workspaces = workspaces
        self.clock = clock
        self._pruned = 0.0

    @classmethod
    def for_settings(
        cls, store: TapeStore, settings: Any, clock: Callable[[], float] = time.time
    ) -> Budgets:
        """The bot's budgets from its settings (checked at start: no errors here)."""
        workspaces = None
        if settings.workspace_map is not None:
            workspaces = load_workspace_map(settings.workspace_map, settings.workspace)
        return cls(store, limits_from(settings), settings.timezone, workspaces, clock)

    async def prune(self) -> int:
        """Drop minute and hour windows older than yesterday (at most once an hour per
        process; any replica may: deleting is idempotent). Days and months stay: reports."""
        now = self.clock()
        if now - self._pruned < 3600:
            return 0
        self._pruned = now
        yesterday = Moment.at(now - 86400, self.zone).local.strftime("%Y-%m-%d")
        return await self.store.prune_usage([f"h:{yesterday}", f"m:{yesterday}"])

    def now(self) -> Moment:
        return Moment.at(self.clock(), self.zone)

    def limits_for(self, session_id: str) -> Limits:
        """The settings' limits with the matching workspace rule's over them (read now)."""
        rule = self.workspaces.rule_for(session_id) if self.workspaces else None
        return self.limits.with_rule(rule.limits if rule else None)

    def is_admin(self, user: str) -> bool:
        return bool(user) and user in self.limits.admins

    # -- messages ---------------------------------------------------------------------------
    def inbound(self, session_id: str, entry: TapeEntry) -> Counting | None:
        """What a user message adds (messages today, and each rate's window), and the check
        that marks it refused when it is over a rate: decided from the counts inside the
        write, so two replicas agree, and exactly one message per window gets the note."""
        if entry.kind != "message":
            return None
        limits = self.limits_for(session_id)
        payer = Payer.of(session_id, entry.meta)
        now = self.now()
        # Each (key, window) once: a `/day` rate reads the day's message counter itself.
        windows = [(f"c:{session_id}", now.day), ("t", now.day)]
        if payer.user:
            windows.append((f"u:{payer.user}", now.day))
        checks: list[tuple[int, str, int, str]] = []  # (add index, scope, limit, unit)
        rated = [("conversation", f"c:{session_id}", limits.conversation_rates)]
        if payer.user and not self.is_admin(payer.user):
            rated.append(("user", f"u:{payer.user}", limits.user_rates))
        for scope, key, rates in rated:
            for rate in rates:
                window = (key, now.key(rate.unit))
                if window not in windows:
                    windows.append(window)
                checks.append((windows.index(window), scope, rate.count, rate.unit))
        adds = [UsageAdd(key, window, 1) for key, window in windows]
        if not checks:
            return Counting(tuple(adds))

        def decide(counts: list[int]) -> list[TapeEntry] | None:
            over = [(scope, limit, unit, counts[i]) for i, scope, limit, unit in checks]
            over = [o for o in over if o[3] > o[1]]
            if not over:
                return None
            ends = max(now.end(unit) for _, _, unit, _ in over)
            scope = over[0][0]
            note = any(count == limit + 1 for _, limit, _, count in over)
            until = when_text(ends, now.local)
            refused = {"reason": f"rate_{scope}", "until": ends.isoformat(), "note": note}
            meta = {**entry.meta, "refused": refused}
            written = [TapeEntry(entry.kind, entry.payload, meta, entry.date)]
            if note:
                whose = "You are" if scope == "user" else "This conversation is"
                text = (
                    f"{whose} sending messages faster than this bot allows, so I did not pass"
                    f" this on to the model. You can write again {until}."
                )
                target = {
                    "channel": entry.meta.get("channel", ""),
                    "reply_target": entry.meta.get("reply_target") or {},
                }
                data = {"text": text, "reason": refused["reason"], "seen_through": 0}
                written.append(TapeEntry.event(LIMIT_NOTICE, data, context=False, **target))
            return written

        return Counting(tuple(adds), decide)

    # -- model calls ------------------------------------------------------------------------
    async def check(self, payer: Payer) -> Spent | None:
        """The first budget `payer` has used up (None: it may call the model). Admins are
        exempt from the per-person budget, not from the conversation's or the total."""
        limits = self.limits_for(payer.conversation)
        scoped: list[tuple[str, str, tuple[Budget, ...]]] = []
        if payer.user and limits.user_budgets and not self.is_admin(payer.user):
            scoped.append(("user", f"u:{payer.user}", limits.user_budgets))
        if limits.conversation_budgets:
            scoped.append(("conversation", f"c:{payer.conversation}", limits.conversation_budgets))
        if limits.total_budgets:
            scoped.append(("total", "t", limits.total_budgets))
        if not scoped:
            return None
        now = self.now()
        monthly = any(b.unit == "month" for _, _, budgets in scoped for b in budgets)
        first = now.month_first if monthly else now.day
        rows = await self.store.usage([key for _, key, _ in scoped], first, now.day)
        for scope, key, budgets in scoped:
            mine = [r for r in rows if r.key == key]
            for budget in budgets:
                used = [r for r in mine if budget.unit == "month" or r.window == now.day]
                spent = sum(r.cost if budget.money else r.tokens for r in used)
                if spent >= budget.amount:
                    until = when_text(now.end(budget.unit), now.local)
                    return Spent(scope, budget, until)
        return None

    def step(self, payer: Payer, model: str, used: StepUsage) -> Counting:
        """What one model call adds: the payer's, the conversation's, the total's and the
        model's counters for today (written with the step's `run` event)."""
        price = price_of(self.limits.prices, model)
        cost = price.cost(used.tokens_in, used.tokens_out) if price else 0
        day = self.now().day
        keys = [f"c:{payer.conversation}", "t", f"model:{model}"]
        if payer.user:
            keys.append(f"u:{payer.user}")
        return Counting(
            tuple(
                UsageAdd(k, day, 0, used.tokens_in, used.tokens_out, cost, used.estimated)
                for k in keys
            )
        )

    def cost(self, model: str, used: StepUsage) -> int:
        """Micro-dollars of a call (0: the model has no price)."""
        price = price_of(self.limits.prices, model)
        return price.cost(used.tokens_in, used.tokens_out) if price else 0

    async def charge(self, payer: Payer, model: str, used: StepUsage) -> None:
        """THE HOOK for model calls that no `run` event records (a `/handoff` summary; a
        subagent or an approval's continuation that calls the model outside the turn loop):
        add their usage to `payer`'s counters in one transaction."""
        await self.store.add_usage(self.step(payer, model, used).adds)

    # -- reports ----------------------------------------------------------------------------
    async def rows(self, keys: list[str]) -> dict[str, tuple[UsageRow, UsageRow]]:
        """Per key: (today, this month) summed."""
        now = self.now()
        found = await self.store.usage(keys, now.month_first, now.day)
        out = {}
        for key in keys:
            mine = [r for r in found if r.key == key]
            out[key] = (
                _sum(key, now.day, [r for r in mine if r.window == now.day]),
                _sum(key, now.month_first, mine),
            )
        return out


def _sum(key: str, window: str, rows: list[UsageRow]) -> UsageRow:
    return UsageRow(
        key,
        window,
        sum(r.messages for r in rows),
        sum(r.tokens_in for r in rows),
        sum(r.tokens_out for r in rows),
        sum(r.cost for r in rows),
        sum(r.estimated for r in rows),
    )
