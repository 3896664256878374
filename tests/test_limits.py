"""Parsing limits, budgets, prices and admins (one line naming the setting), and calendar
windows in BUB_TIMEZONE."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bub_bot.budgets.windows import Moment, when_text
from bub_bot.config import load_settings
from bub_bot.errors import ConfigError
from bub_bot.limits import Budget, Rate, parse_budgets, parse_prices, parse_rates, price_of
from bub_bot.schedules.times import zone_named


def test_rates_budgets_and_prices_parse() -> None:
    assert parse_rates("20/min, 200/day", "X") == (Rate(20, "minute"), Rate(200, "day"))
    assert parse_rates("off", "X") == ()
    assert parse_budgets("200000/day,5M/month", "X") == (
        Budget(200_000, "day"),
        Budget(5_000_000, "month"),
    )
    assert parse_budgets("$5/day", "X") == (Budget(5_000_000, "day", money=True),)
    prices = parse_prices("gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6")
    assert price_of(prices, "gpt-4o-2024-08-06") == prices["gpt-4o"]
    assert price_of(prices, "gpt-4o-mini-2024-07-18") == prices["gpt-4o-mini"]
    assert price_of(prices, "llama") is None
    assert prices["gpt-4o"].cost(1_000_000, 100_000) == 3_500_000  # $2.50 + $1.00


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("limit_user", "20/fortnight", "BUB_LIMIT_USER: '20/fortnight' is not a message rate"),
        ("limit_conversation", "lots", "BUB_LIMIT_CONVERSATION: 'lots' is not a message rate"),
        ("budget_user", "100/hour", "BUB_BUDGET_USER: '100/hour' is not a budget"),
        ("budget_total", "$5k/day", "BUB_BUDGET_TOTAL: '$5k/day': a money budget is in dollars"),
        ("model_prices", "gpt-4o=cheap", "BUB_MODEL_PRICES: 'gpt-4o=cheap' is not a price"),
        ("admins", "U123", "BUB_ADMINS: 'U123' is not <channel>:<user id>"),
        ("budget_conversation", "$1/day", "BUB_BUDGET_CONVERSATION (or a workspace rule"),
    ],
)
def test_bad_settings_stop_the_start_with_one_line(
    setting: str, value: str, says: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(require_model=False, home=tmp_path, _env_file=None, **{setting: value})
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_bad_workspace_rule_limit_names_the_rule(tmp_path: Path) -> None:
    rules = tmp_path / "map.json"
    rule = {"match": "x:*", "path": str(tmp_path), "limits": {"user": "often"}}
    rules.write_text(json.dumps({"workspaces": [rule]}))
    with pytest.raises(ConfigError) as error:
        load_settings(require_model=False, home=tmp_path, _env_file=None, workspace_map=rules)
    assert "rule 1: limits.user: 'often' is not a message rate" in str(error.value)
    rule["limits"] = {"total": "1/day"}
    rules.write_text(json.dumps({"workspaces": [rule]}))
    with pytest.raises(ConfigError, match="unknown limits key 'total'"):
        load_settings(require_model=False, home=tmp_path, _env_file=None, workspace_map=rules)


def test_calendar_windows_in_the_operator_zone() -> None:
    berlin = zone_named("Europe/Berlin")
    # 23:30 UTC on Dec 31 is already Jan 1 in Berlin: a new day and a new month there.
    moment = Moment.at(datetime(2026, 12, 31, 23, 30, tzinfo=UTC).timestamp(), berlin)
    assert moment.day == "d:2027-01-01" and moment.month_first == "d:2027-01-01"
    assert moment.key("minute") == "m:2027-01-01T00:30" and moment.key("month") == "M:2027-01"
    assert moment.end("day").isoformat() == "2027-01-02T00:00:00+01:00"
    assert moment.end("month").isoformat() == "2027-02-01T00:00:00+01:00"
    assert when_text(moment.end("minute"), moment.local) == "at 00:31 CET"
    assert when_text(moment.end("day"), moment.local) == "tomorrow at 00:00 CET"
    # the day DST ends is 25 hours long; the next day starts at local midnight all the same
    autumn = Moment.at(datetime(2026, 10, 25, 12, tzinfo=UTC).timestamp(), berlin)
    assert autumn.end("day").isoformat() == "2026-10-26T00:00:00+01:00"


def test_a_workspace_rule_budget_in_dollars_needs_a_price(tmp_path: Path) -> None:
    rules = tmp_path / "map.json"
    rule = {"match": "x:*", "path": str(tmp_path), "limits": {"budget_user": "$1/day"}}
    rules.write_text(json.dumps({"workspaces": [rule]}))
    with pytest.raises(ConfigError, match="is in dollars but BUB_MODEL_PRICES has no price"):
        load_settings(require_model=False, home=tmp_path, _env_file=None, workspace_map=rules)
    ok = load_settings(
        require_model=False,
        home=tmp_path,
        _env_file=None,
        workspace_map=rules,
        model="m",
        model_prices="m=1/2",
    )
    assert ok.model_prices == "m=1/2"
