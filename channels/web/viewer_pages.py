"""The tape viewer's HTML: pure functions from the data its JSON variant carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from bub_bot.tape import KINDS, TapeEntry, TapeStats
from bub_bot.tape.names import tape_role

from .entries import call_names, entry_html, message_html
from .render import markdown, pre, when

NONE = '<li class="muted">none</li>'


def url(path: str, **params: Any) -> str:
    """`path` with the query parameters that have a value."""
    query = {k: v for k, v in params.items() if v not in (None, "")}
    return path + ("?" + urlencode(query) if query else "")


def nav(*crumbs: tuple[str, str | None]) -> str:
    links = ['<a href="/">Chat</a>', '<a href="/tapes">Tapes</a>']
    for label, href in crumbs:
        links.append(f'<a href="{escape(href)}">{escape(label)}</a>' if href else escape(label))
    return '<nav class="top">' + " › ".join(links) + "</nav>"


def _count(n: object, noun: str) -> str:
    return f"{escape(str(n))} {noun}{'' if n == 1 else 's'}"


def pager(
    back: str | None,
    forward: str | None,
    label: str,
    names: tuple[str, str] = ("‹ previous", "next ›"),
) -> str:
    left = f'<a rel=prev href="{escape(back)}">{names[0]}</a>' if back else ""
    right = f'<a rel=next href="{escape(forward)}">{names[1]}</a>' if forward else ""
    return f'<div class="pager">{left}<span class="muted">{escape(label)}</span>{right}</div>'


# -- all tapes ---------------------------------------------------------------------------------
def tapes_html(data: dict[str, Any], channel: str, needle: str) -> str:
    options = "".join(
        f'<option value="{escape(c)}"{" selected" if c == channel else ""}>{escape(c)}</option>'
        for c in data["channels"]
    )
    form = (
        '<form class="filters" method=get action="/tapes">'
        f'<label>Channel <select name=channel><option value="">all</option>{options}</select>'
        f'</label><label>Session id <input name=q value="{escape(needle)}" placeholder="search">'
        "</label><button type=submit>Filter</button></form>"
    )
    rows = "".join(
        f'<tr><td><a href="/tapes/{escape(t["name"])}">{escape(t["session_id"] or t["name"])}'
        f"</a></td><td>{escape(t['channel'])}</td><td class=num>{t['entries']}</td>"
        f"<td class=num>{t['anchors']}</td><td>{when(t['last_activity'])}</td></tr>"
        for t in data["tapes"]
    )
    table = (
        "<table class=tapes><thead><tr><th>Session</th><th>Channel</th><th>Entries</th>"
        f"<th>Anchors</th><th>Last activity (UTC)</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else '<p class="muted">No tapes match.</p>'
    )
    page_no, pages = data["page"], data["pages"]
    links = pager(
        url("/tapes", channel=channel, q=needle, page=page_no - 1) if page_no > 1 else None,
        url("/tapes", channel=channel, q=needle, page=page_no + 1) if page_no < pages else None,
        f"page {page_no} of {pages} · {_count(data['total'], 'tape')}",
    )
    return f'{nav()}<main class="viewer"><h1>Tapes</h1>{form}{table}{links}</main>'


# -- one tape ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TapePage:
    """One page of a tape and what is shown beside it."""

    name: str
    stats: TapeStats
    view: str
    """"anchor" (since the last anchor) or "all"."""
    kind: str | None
    entries: list[TapeEntry]
    older: str | None
    newer: str | None
    anchors: list[TapeEntry]
    archives: list[dict[str, Any]]
    spills: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    """The session's scheduled jobs (`job_summary` and its kind), soonest first."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """Subagent tapes and forks under this tape (viewer_family.py)."""
    parent: dict[str, Any] | None = None
    """The tape this one is a fork or subagent of."""

    def to_json(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "tape": self.name,
            "session_id": stats.session_id,
            "role": tape_role(self.name),
            "stats": {
                "entries": stats.entries,
                "anchors": stats.anchors,
                "last_anchor_id": stats.last_anchor_id,
                "entries_since_anchor": stats.entries - stats.last_anchor_id,
            },
            "view": self.view,
            "kind": self.kind,
            "entries": [e.to_json() for e in self.entries],
            "older": self.older,
            "newer": self.newer,
            "anchors": [
                {
                    "id": a.id,
                    "name": a.payload.get("name"),
                    "date": a.date,
                    "state": a.payload.get("state"),
                }
                for a in self.anchors
            ],
            "archives": self.archives,
            "spills": self.spills,
            "jobs": self.jobs,
            "children": self.children,
            "parent": self.parent,
        }


def _summary(anchor: TapeEntry) -> str:
    summary = (anchor.payload.get("state") or {}).get("summary")
    if isinstance(summary, str) and summary.strip():
        return f'<div class="summary">{markdown(summary)}</div>'
    return ""


def _side(p: TapePage) -> str:
    base = f"/tapes/{p.name}"
    timeline = "".join(
        f'<li><a href="{escape(url(base, view="all", after=a.id - 1))}">#{a.id}'
        f" {escape(str(a.payload.get('name', '')))}</a> <time>{when(a.date)}</time>"
        f"{_summary(a)}</li>"
        for a in reversed(p.anchors)
    )
    archives = "".join(
        f'<li><a href="/tapes/{escape(a["name"])}">{when(a["archived"])}</a>'
        f' <span class="muted">{a["entries"]} entries</span></li>'
        for a in p.archives
    )
    spills = "".join(
        f'<li><a href="{escape(base)}/spill/{escape(str(s.get("handle", "")))}">'
        f'{escape(str(s.get("handle", "")))}</a> <span class="muted">'
        f"{escape(str(s.get('tool', '')))} · {escape(str(s.get('chars', '?')))} characters ·"
        f" {_count(s.get('chunks'), 'page')}</span></li>"
        for s in p.spills
    )
    jobs = "".join(
        f"<li><code>{escape(str(j['id']))}</code> {escape(str(j['next_run']))}"
        f' <span class="muted">{escape(str(j["kind"]))} · {escape(str(j["schedule"]))}'
        f" · ran {escape(str(j['runs_so_far']))}×</span>"
        f"<div>{escape(str(j['prompt']))}</div></li>"
        for j in p.jobs
    )
    usage = ""
    if p.stats.session_id:
        link = "/usage/sessions/" + quote(p.stats.session_id, safe="")
        usage = f'<p><a href="{escape(link)}">Usage of this conversation</a></p>'
    children = "".join(
        f'<li><a href="/tapes/{escape(c["name"])}">{escape(str(c["session_id"] or c["name"]))}</a>'
        f' <span class="muted">{escape(c["kind"])} · {c["entries"]} entries</span></li>'
        for c in p.children
    )
    parent = ""
    if p.parent is not None:
        parent = (
            f"<h2>Parent</h2><p>{escape(p.parent['kind'])}"
            f' <a href="/tapes/{escape(p.parent["name"])}">'
            f"{escape(str(p.parent.get('session_id') or p.parent['name']))}</a></p>"
        )
    return (
        f"{usage}{parent}<h2>Subagents and forks</h2><ul>{children or NONE}</ul>"
        f"<h2>Scheduled jobs</h2><ul>{jobs or NONE}</ul>"
        f"<h2>Anchors (newest first)</h2><ol class=timeline>{timeline or NONE}</ol>"
        f"<h2>Archives of this session</h2><ul>{archives or NONE}</ul>"
        f"<h2>Spilled outputs</h2><ul>{spills or NONE}</ul>"
    )


def tape_html(p: TapePage) -> str:
    stats, base = p.stats, f"/tapes/{p.name}"
    title = stats.session_id or p.name
    since = stats.entries - stats.last_anchor_id
    tabs = "".join(
        f'<a class="tab{" on" if key == p.view else ""}" href="{escape(href)}">{escape(label)}</a>'
        for key, label, href in (
            ("anchor", f"Since the last anchor ({since})", url(base, kind=p.kind)),
            ("all", f"All ({stats.entries})", url(base, view="all", kind=p.kind)),
            ("context", "Context now", f"{base}/context"),
        )
    )
    options = "".join(
        f'<option value="{k}"{" selected" if k == p.kind else ""}>{k}</option>' for k in KINDS
    )
    form = (
        f'<form class="filters" method=get action="{escape(base)}">'
        + ("<input type=hidden name=view value=all>" if p.view == "all" else "")
        + f'<label>Kind <select name=kind><option value="">all kinds</option>{options}</select>'
        "</label><button type=submit>Filter</button></form>"
    )
    names = call_names(p.entries)
    listing = (
        "".join(entry_html(e, names) for e in p.entries) or '<p class="muted">No entries here.</p>'
    )
    label = f"#{p.entries[0].id}–#{p.entries[-1].id}" if p.entries else ""
    links = pager(p.older, p.newer, label, ("‹ older", "newer ›"))
    head = (
        f'<h1>{escape(title)}</h1><p class="muted">tape {escape(p.name)} · {tape_role(p.name)}'
        f" · {stats.entries} entries · {stats.anchors} anchors</p>"
    )
    return (
        f'{nav((title, None))}<main class="viewer tape"><div class="main">{head}'
        f'<div class="tabs">{tabs}</div>{form}{links}{listing}{links}</div>'
        f'<aside class="side">{_side(p)}</aside></main>'
    )


# -- context now and spilled output ---------------------------------------------------------
def context_html(data: dict[str, Any]) -> str:
    title = data["session_id"] or data["tape"]
    tokens = data["estimated_tokens"]
    messages = data["messages"]
    listing = "".join(message_html(m) for m in messages)
    return (
        f'{nav((title, "/tapes/" + data["tape"]), ("context now", None))}<main class="viewer">'
        f'<h1>Context now</h1><p class="muted">What the next model call gets: {len(messages)}'
        f" messages, about {tokens['messages']} tokens (characters ÷ 4), plus"
        f" {len(data['tools'])} tool schemas (about {tokens['tools']} tokens). While a turn runs,"
        f" messages queued behind a command are held back until the command is done.</p>"
        f"{listing}</main>"
    )


def spill_html(data: dict[str, Any], path: str, title: str) -> str:
    page_no, pages = data["page"], data["pages"]
    links = pager(
        url(path, page=page_no - 1) if page_no > 0 else None,
        url(path, page=page_no + 1) if page_no + 1 < pages else None,
        f"page {page_no + 1} of {pages} · {data.get('total_bytes')} bytes in all",
    )
    handle = data["handle"]
    return (
        f'{nav((title, "/tapes/" + data["tape"]), (handle, None))}<main class="viewer">'
        f"<h1>Spilled output {escape(handle)}</h1>{links}{pre(data['content'])}{links}</main>"
    )
