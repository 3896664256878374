"""What `/usage` and `/usage all` say: use today and this month (messages, tokens, cost when
priced) and what is left of each budget; estimated tokens are said to be estimated."""

from __future__ import annotations

from ..limits import Budget, Limits, Rate
from ..tape import UsageRow
from .book import Budgets
from .payer import Payer


def _money(micro: int) -> str:
    return f"${micro / 1_000_000:.2f}"


def use_text(row: UsageRow, priced: bool) -> str:
    """`3 messages, 1,234 tokens (1,000 in, 234 out), $0.01`."""
    text = (
        f"{row.messages} message{'s' if row.messages != 1 else ''}, {row.tokens:,} tokens"
        f" ({row.tokens_in:,} in, {row.tokens_out:,} out)"
    )
    if priced:
        text += f", {_money(row.cost)}"
    if row.estimated:
        text += f" (~{row.estimated:,} tokens estimated: the model server reported no usage)"
    return text


def left_text(budgets: tuple[Budget, ...], today: UsageRow, month: UsageRow) -> list[str]:
    lines = []
    for budget in budgets:
        row = today if budget.unit == "day" else month
        used = row.cost if budget.money else row.tokens
        left = max(0, budget.amount - used)
        amount = _money(left) if budget.money else f"{left:,} tokens"
        period = "today" if budget.unit == "day" else "this month"
        lines.append(f"  Left {period}: {amount} of {budget.text()}")
    return lines


UNIT_NOW = {"minute": "this minute", "hour": "this hour", "day": "today", "month": "this month"}


async def rates_text(budgets: Budgets, key: str, rates: tuple[Rate, ...]) -> list[str]:
    """`  Messages this minute: 3 of 20` per rate, from the window counters."""
    now = budgets.now()
    lines = []
    for rate in rates:
        window = now.key(rate.unit)
        found = await budgets.store.usage([key], window, window)
        used = found[0].messages if found else 0
        lines.append(f"  Messages {UNIT_NOW[rate.unit]}: {used} of {rate.count}")
    return lines


async def usage_text(budgets: Budgets, payer: Payer) -> str:
    """The `/usage` reply: the person's own use, and the conversation's."""
    limits: Limits = budgets.limits_for(payer.conversation)
    priced = bool(limits.prices)
    keys = [f"c:{payer.conversation}"] + ([f"u:{payer.user}"] if payer.user else [])
    found = await budgets.rows(keys)
    lines = []
    if payer.user:
        today, month = found[f"u:{payer.user}"]
        admin = budgets.is_admin(payer.user)
        lines.append(f"You ({payer.user}{', admin' if admin else ''}):")
        lines.append(f"  Today: {use_text(today, priced)}")
        lines.append(f"  This month: {use_text(month, priced)}")
        if admin:
            lines.append("  Admins have no per-person limits (the bot's total still applies).")
        else:
            lines += left_text(limits.user_budgets, today, month)
            lines += await rates_text(budgets, f"u:{payer.user}", limits.user_rates)
    today, month = found[f"c:{payer.conversation}"]
    lines.append("This conversation:")
    lines.append(f"  Today: {use_text(today, priced)}")
    lines.append(f"  This month: {use_text(month, priced)}")
    lines += left_text(limits.conversation_budgets, today, month)
    key = f"c:{payer.conversation}"
    lines += await rates_text(budgets, key, limits.conversation_rates)
    if limits.total_budgets:
        total_today, total_month = (await budgets.rows(["t"]))["t"]
        lines.append("The bot as a whole:")
        lines += left_text(limits.total_budgets, total_today, total_month)
    return "\n".join(lines)


async def usage_all_text(budgets: Budgets, top: int = 10) -> str:
    """The `/usage all` reply (admins): the total, then the top people and conversations
    this month."""
    now = budgets.now()
    priced = bool(budgets.limits.prices)
    total_today, total_month = (await budgets.rows(["t"]))["t"]
    lines = [
        f"All use (calendar in {budgets.zone.key}):",
        f"  Today: {use_text(total_today, priced)}",
        f"  This month: {use_text(total_month, priced)}",
    ]
    lines += left_text(budgets.limits.total_budgets, total_today, total_month)
    for title, prefix in (("Top people", "u:"), ("Top conversations", "c:")):
        rows = await budgets.store.top_usage(prefix, now.month_first, now.day, limit=top)
        lines.append(f"{title} this month:")
        if not rows:
            lines.append("  (none)")
        for row in rows:
            lines.append(f"  {row.key[len(prefix) :]}: {use_text(row, priced)}")
    models = await budgets.store.top_usage("model:", now.month_first, now.day, limit=top)
    if models:
        lines.append("Models this month:")
        lines += [f"  {r.key[6:]}: {use_text(r, priced)}" for r in models]
    return "\n".join(lines)
