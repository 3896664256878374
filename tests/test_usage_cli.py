"""`bub-bot usage` as an operator runs it: real subprocesses, the counters `bub-bot run` left."""

from __future__ import annotations

import csv
import io
import json

from tests.test_cli import bub, env, fake

__all__ = ["env", "fake"]  # fixtures


async def test_usage_report_as_csv_and_json(env, tmp_path, fake) -> None:
    for text in ("hello", "hello again"):
        code, _, err = await bub("run", text, env=env, cwd=tmp_path)
        assert code == 0, err
    code, out, err = await bub(
        "usage", "--since", "2000-01-01", "--by", "conversation", "--format", "csv",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 1 and rows[0]["messages"] == "2"
    assert int(rows[0]["tokens"]) == int(rows[0]["tokens_in"]) + int(rows[0]["tokens_out"]) > 0
    assert list(rows[0]) == [
        "conversation", "messages", "tokens_in", "tokens_out", "tokens", "cost_usd",
        "estimated_tokens",
    ]  # fmt: skip
    code, out, _ = await bub(
        "usage", "--since", "2000-01-01", "--by", "model", "--format", "json",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert [r["model"] for r in json.loads(out)] == ["fake-model"]
    code, out, _ = await bub("usage", "--since", "2999-01-01", env=env, cwd=tmp_path)
    assert out.strip() == "no usage in that time"


async def test_a_bad_day_is_a_usage_error(env, tmp_path) -> None:
    code, _, err = await bub("usage", "--since", "last week", env=env, cwd=tmp_path)
    assert code == 2 and "'last week' is not a day: write YYYY-MM-DD" in err
