"""`bub-bot usage`: the counters summed per person, conversation or model over calendar days
(BUB_TIMEZONE), as a table, CSV or JSON, for reports."""

from __future__ import annotations

import csv
import io
import json
from datetime import date

from ..tape import TapeStore

BY = {"user": "u:", "conversation": "c:", "model": "model:"}
FIELDS = ["messages", "tokens_in", "tokens_out", "tokens", "cost_usd", "estimated_tokens"]


def day(value: str) -> str:
    """argparse type: a calendar day `YYYY-MM-DD` (ValueError naming the format)."""
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        raise ValueError(f"{value!r} is not a day: write YYYY-MM-DD") from None


async def usage_rows(
    store: TapeStore, since: str, until: str | None, by: str
) -> list[dict[str, object]]:
    """One dict per key, most tokens first."""
    prefix = BY[by]
    last = f"d:{until}" if until else "d:9999-12-31"
    rows = await store.top_usage(prefix, f"d:{since}", last, limit=1_000_000)
    return [
        {
            by: r.key[len(prefix) :],
            "messages": r.messages,
            "tokens_in": r.tokens_in,
            "tokens_out": r.tokens_out,
            "tokens": r.tokens,
            "cost_usd": round(r.cost / 1_000_000, 6),
            "estimated_tokens": r.estimated,
        }
        for r in rows
    ]


def render(rows: list[dict[str, object]], by: str, fmt: str) -> str:
    """The rows as `table`, `csv` or `json`."""
    if fmt == "json":
        return json.dumps(rows, ensure_ascii=False, indent=1)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=[by, *FIELDS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    if not rows:
        return "no usage in that time"
    lines = [f"{by.upper():<40} {'MESSAGES':>9} {'TOKENS':>12} {'COST':>10}"]
    for row in rows:
        lines.append(
            f"{str(row[by])[:40]:<40} {row['messages']:>9} {row['tokens']:>12,}"
            f" {'$' + format(row['cost_usd'], '.2f'):>10}"
        )
    return "\n".join(lines)
