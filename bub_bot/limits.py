"""The operator's limits as text: message rates (`20/min,200/day`), token or money budgets
(`200000/day`, `5M/month`, `$5/day`), model prices (`gpt-4o=2.5/10`) and admins
(`slack:U123,telegram:42`). Every parser raises ValueError naming the setting it reads, so a
malformed value stops the start with one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

RATE_UNITS = {
    "min": "minute",
    "minute": "minute",
    "m": "minute",
    "h": "hour",
    "hour": "hour",
    "d": "day",
    "day": "day",
    "month": "month",
}
BUDGET_UNITS = {"d": "day", "day": "day", "month": "month"}
_RATE_RE = re.compile(r"^(\d+)/([a-z]+)$")
_BUDGET_RE = re.compile(r"^(\$)?(\d+(?:\.\d+)?)([km]?)/([a-z]+)$")
_PRICE_RE = re.compile(r"^([^=\s]+)=(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)$")
_ADMIN_RE = re.compile(r"^[a-z][a-z0-9_-]*:\S+$")
_OFF = ("", "off", "none")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `count` messages per calendar `unit` (minute, hour, day, month)."""

    count: int
    unit: str


@dataclass(frozen=True, slots=True)
class Budget:
    """At most `amount` per calendar `unit` (day, month): tokens (input + output), or
    micro-dollars when `money`."""

    amount: int
    unit: str
    money: bool = False

    def text(self) -> str:
        """As the operator wrote it, roughly (`200000 tokens/day`, `$5.00/day`)."""
        if self.money:
            return f"${self.amount / 1_000_000:.2f}/{self.unit}"
        return f"{self.amount} tokens/{self.unit}"


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per 1 M input and output tokens; a token costs that many micro-dollars."""

    input: float
    output: float

    def cost(self, tokens_in: int, tokens_out: int) -> int:
        """Micro-dollars for these tokens."""
        return round(tokens_in * self.input + tokens_out * self.output)


def _items(value: str) -> list[str]:
    text = value.strip().lower()
    if text in _OFF:
        return []
    return [part.strip().replace(" ", "") for part in text.split(",") if part.strip()]


def parse_rates(value: str, setting: str) -> tuple[Rate, ...]:
    """`20/min,200/day` (minute, hour, day, month; `off` or empty: none)."""
    rates = []
    for item in _items(value):
        match = _RATE_RE.match(item)
        unit = RATE_UNITS.get(match.group(2)) if match else None
        if match is None or unit is None or int(match.group(1)) < 1:
            raise ValueError(
                f"{setting}: {item!r} is not a message rate: write <count>/<min|hour|day|month>"
                " like 20/min,200/day, or off"
            )
        rates.append(Rate(int(match.group(1)), unit))
    return tuple(rates)


def parse_budgets(value: str, setting: str) -> tuple[Budget, ...]:
    """`200000/day`, `5M/month`, `300k/day`, `$5/day` (calendar day or month; `off`: none)."""
    budgets = []
    for item in _items(value):
        match = _BUDGET_RE.match(item)
        unit = BUDGET_UNITS.get(match.group(4)) if match else None
        if match is None or unit is None:
            raise ValueError(
                f"{setting}: {item!r} is not a budget: write <tokens>/<day|month> like"
                " 200000/day or 5M/month, or dollars like $5/day, or off"
            )
        money, number, scale = bool(match.group(1)), float(match.group(2)), match.group(3)
        if money and scale:
            raise ValueError(f"{setting}: {item!r}: a money budget is in dollars, like $5/day")
        if money:
            amount = round(number * 1_000_000)
        else:
            amount = round(number * {"": 1, "k": 1_000, "m": 1_000_000}[scale])
        if amount < 1:
            raise ValueError(f"{setting}: {item!r}: a budget must be above zero")
        budgets.append(Budget(amount, unit, money))
    return tuple(budgets)


def parse_prices(value: str, setting: str = "BUB_MODEL_PRICES") -> dict[str, Price]:
    """`gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6`: dollars per 1 M input/output tokens."""
    prices = {}
    for item in [p.strip() for p in value.split(",") if p.strip()]:
        match = _PRICE_RE.match(item.replace(" ", ""))
        if match is None:
            raise ValueError(
                f"{setting}: {item!r} is not a price: write <model>=<input>/<output> in dollars"
                " per 1M tokens, like gpt-4o=2.5/10"
            )
        prices[match.group(1)] = Price(float(match.group(2)), float(match.group(3)))
    return prices


def price_of(prices: dict[str, Price], model: str) -> Price | None:
    """The price of `model`: its own, else the longest priced name it starts with (providers
    report `gpt-4o-2024-08-06` for `gpt-4o`)."""
    if model in prices:
        return prices[model]
    found = [name for name in prices if model.startswith(name)]
    return prices[max(found, key=len)] if found else None


def parse_admins(value: str, setting: str = "BUB_ADMINS") -> frozenset[str]:
    """`slack:U123,telegram:42,web:alice`: per-channel user ids."""
    admins = set()
    for item in [p.strip() for p in value.split(",") if p.strip()]:
        if not _ADMIN_RE.match(item):
            raise ValueError(
                f"{setting}: {item!r} is not <channel>:<user id> (like slack:U123 or telegram:42)"
            )
        admins.add(item)
    return frozenset(admins)


@dataclass(frozen=True, slots=True)
class Limits:
    """Every limit that applies to one session (the settings, a workspace rule over them)."""

    user_rates: tuple[Rate, ...] = ()
    conversation_rates: tuple[Rate, ...] = ()
    user_budgets: tuple[Budget, ...] = ()
    conversation_budgets: tuple[Budget, ...] = ()
    total_budgets: tuple[Budget, ...] = ()
    prices: dict[str, Price] = field(default_factory=dict)
    admins: frozenset[str] = frozenset()

    @property
    def any_budget(self) -> bool:
        return bool(self.user_budgets or self.conversation_budgets or self.total_budgets)

    @property
    def any_rate(self) -> bool:
        return bool(self.user_rates or self.conversation_rates)

    def with_rule(self, rule: RuleLimits | None) -> Limits:
        """These limits with a workspace rule's over them (the total stays the operator's)."""
        if rule is None:
            return self
        return replace(self, **{k: v for k, v in rule.values.items() if v is not None})


RULE_KEYS = {
    "user": ("user_rates", parse_rates),
    "conversation": ("conversation_rates", parse_rates),
    "budget_user": ("user_budgets", parse_budgets),
    "budget_conversation": ("conversation_budgets", parse_budgets),
}


@dataclass(frozen=True, slots=True)
class RuleLimits:
    """A workspace rule's `"limits": {"user": "10/min", "budget_user": "$1/day", ...}`: the
    keys it gives replace the settings' for sessions in that workspace (`"off"`: none)."""

    values: dict[str, Any]

    @classmethod
    def parse(cls, raw: Any, where: str) -> RuleLimits:
        """Raises ValueError naming `where` and the key."""
        if not isinstance(raw, dict):
            raise ValueError(f'{where}: limits must be an object like {{"user": "10/min"}}')
        values: dict[str, Any] = {}
        for key, text in raw.items():
            if key not in RULE_KEYS:
                raise ValueError(
                    f"{where}: unknown limits key {key!r} (use {', '.join(sorted(RULE_KEYS))})"
                )
            if not isinstance(text, str):
                raise ValueError(f'{where}: limits.{key} must be a string like "10/min"')
            name, parse = RULE_KEYS[key]
            values[name] = parse(text, f"{where}: limits.{key}")
        return cls(values)


def limits_from(settings: Any) -> Limits:
    """The operator's limits from the settings (ValueError naming the setting)."""
    return Limits(
        user_rates=parse_rates(settings.limit_user, "BUB_LIMIT_USER"),
        conversation_rates=parse_rates(settings.limit_conversation, "BUB_LIMIT_CONVERSATION"),
        user_budgets=parse_budgets(settings.budget_user, "BUB_BUDGET_USER"),
        conversation_budgets=parse_budgets(settings.budget_conversation, "BUB_BUDGET_CONVERSATION"),
        total_budgets=parse_budgets(settings.budget_total, "BUB_BUDGET_TOTAL"),
        prices=parse_prices(settings.model_prices),
        admins=parse_admins(settings.admins),
    )


def check_priced(limits: Limits, model: str) -> None:
    """A budget in money needs a price for the configured model (ValueError naming both)."""
    money = [
        name
        for name, budgets in (
            ("BUB_BUDGET_USER (or a workspace rule's budget_user)", limits.user_budgets),
            (
                "BUB_BUDGET_CONVERSATION (or a workspace rule's budget_conversation)",
                limits.conversation_budgets,
            ),
            ("BUB_BUDGET_TOTAL", limits.total_budgets),
        )
        if any(b.money for b in budgets)
    ]
    if money and price_of(limits.prices, model) is None:
        raise ValueError(
            f"{money[0]} is in dollars but BUB_MODEL_PRICES has no price for BUB_MODEL {model!r}"
        )
