"""The viewer's usage pages (`/usage`, `/usage/users/{user}`, `/usage/sessions/{session}`):
what `/usage` and `/usage all` say, for the operator, from the counters in the store (through
the runtime's budgets: read-only). HTML for people, JSON with `Accept: application/json` or
`?format=json`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from html import escape
from typing import Any
from urllib.parse import quote

from aiohttp import web

from .render import page
from .runtime import WebRuntime

KEY_RE = re.compile(r"[^\x00-\x1f/]{1,300}")
TOP = 50


def _row(row: Any) -> dict[str, Any]:
    return {
        "messages": row.messages,
        "tokens_in": row.tokens_in,
        "tokens_out": row.tokens_out,
        "tokens": row.tokens,
        "cost_usd": round(row.cost / 1_000_000, 6),
        "estimated_tokens": row.estimated,
    }


def _cells(data: dict[str, Any]) -> str:
    return (
        f"<td>{data['messages']}</td><td>{data['tokens']:,}</td>"
        f"<td>{data['tokens_in']:,} / {data['tokens_out']:,}</td>"
        f"<td>${data['cost_usd']:.2f}</td>"
        f"<td>{data['estimated_tokens']:,}</td>"
    )


HEAD = (
    "<tr><th></th><th>messages</th><th>tokens</th><th>in / out</th><th>cost</th>"
    "<th>estimated</th></tr>"
)


class UsageViewer:
    """Read-only usage pages; the runtime's `budgets` knows the calendar (BUB_TIMEZONE)."""

    def __init__(self, runtime: Callable[[], WebRuntime]) -> None:
        self.runtime = runtime

    def _respond(self, request: web.Request, title: str, html: str, data: Any) -> web.Response:
        if request.query.get("format") == "json" or "application/json" in request.headers.get(
            "Accept", ""
        ):
            return web.json_response(data, dumps=lambda v: json.dumps(v, ensure_ascii=False))
        nav = '<nav><a href="/tapes">Tapes</a> · <a href="/usage">Usage</a></nav>'
        return web.Response(text=page(title, html, nav=nav), content_type="text/html")

    async def overview(self, request: web.Request) -> web.StreamResponse:
        """The total today and this month, and the top people and conversations."""
        budgets = self.runtime().budgets
        now = budgets.now()
        today, month = (await budgets.rows(["t"]))["t"]
        data: dict[str, Any] = {"today": _row(today), "month": _row(month)}
        for name, prefix in (("users", "u:"), ("sessions", "c:"), ("models", "model:")):
            found = await budgets.store.top_usage(prefix, now.month_first, now.day, limit=TOP)
            data[name] = [{"key": r.key[len(prefix) :], **_row(r)} for r in found]
        body = ["<main><h1>Usage</h1><table>", HEAD]
        body.append(f"<tr><th>today</th>{_cells(data['today'])}</tr>")
        body.append(f"<tr><th>this month</th>{_cells(data['month'])}</tr></table>")
        for name, title, link in (
            ("users", "People this month", "/usage/users/"),
            ("sessions", "Conversations this month", "/usage/sessions/"),
            ("models", "Models this month", ""),
        ):
            body.append(f"<h2>{title}</h2><table>{HEAD}")
            for item in data[name]:
                label = escape(item["key"])
                if link:
                    label = f'<a href="{link}{quote(item["key"], safe="")}">{label}</a>'
                body.append(f"<tr><th>{label}</th>{_cells(item)}</tr>")
            body.append("</table>")
        body.append("</main>")
        return self._respond(request, "Usage", "".join(body), data)

    async def user(self, request: web.Request) -> web.StreamResponse:
        return await self._one(request, "u:", "Person")

    async def session(self, request: web.Request) -> web.StreamResponse:
        return await self._one(request, "c:", "Conversation")

    async def _one(self, request: web.Request, prefix: str, what: str) -> web.StreamResponse:
        key = request.match_info["key"]
        if not KEY_RE.fullmatch(key):
            raise web.HTTPNotFound(text="no such key")
        budgets = self.runtime().budgets
        today, month = (await budgets.rows([prefix + key]))[prefix + key]
        data = {"key": key, "today": _row(today), "month": _row(month)}
        html = (
            f"<main><h1>{what} {escape(key)}</h1><table>{HEAD}"
            f"<tr><th>today</th>{_cells(data['today'])}</tr>"
            f"<tr><th>this month</th>{_cells(data['month'])}</tr></table></main>"
        )
        return self._respond(request, f"Usage of {key}", html, data)
