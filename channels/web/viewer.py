"""The read-only tape viewer (`/tapes`): every tape, one tape page by page, its anchors,
archives and spilled outputs, and "context now". HTML for people, JSON for scripts
(`Accept: application/json` or `?format=json`).

Only the store's public reads are used (list_tapes, stats, get, query) plus the agent's own
context selector (`Tape.read_messages`), system prompt builder, scrubber and spill reader, in
the session's own workspace (`Runtime.tape_workspace`), so "context now" is what the next
model call gets. No view reads a whole tape: a page is one index
range read (`after_id` / `before_id` with a limit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bub_bot.agent import spill
from bub_bot.agent.prompt import build_system_prompt
from bub_bot.config import Settings
from bub_bot.schedules.book import job_summary
from bub_bot.tape import KINDS, Tape, TapeStats
from bub_bot.tape.names import ARCHIVE_SEP, tape_role

from . import viewer_family
from .render import page
from .runtime import WebRuntime
from .viewer_pages import TapePage, context_html, spill_html, tape_html, tapes_html, url

TAPE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
HANDLE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TAPES_PER_PAGE = 50
ENTRIES_PER_PAGE = 100
MAX_PER_PAGE = 500
TIMELINE_ANCHORS = 50
LISTED_SPILLS = 50
LISTED_JOBS = 100
BIG = 1 << 62


def wants_json(request: web.Request) -> bool:
    if request.query.get("format") == "json":
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def _bad(message: str, status: int = 400) -> web.HTTPException:
    cls = web.HTTPNotFound if status == 404 else web.HTTPBadRequest
    return cls(text=json.dumps({"error": message}), content_type="application/json")


def _int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(f"{name} must be a whole number") from None
    if not lo <= value <= hi:
        raise _bad(f"{name} must be between {lo} and {hi}")
    return value


def _channel_of(session_id: str | None) -> str:
    return (session_id or "-").split(":", 1)[0]


class ViewerRoutes:
    """Handlers of /tapes and below."""

    def __init__(self, settings: Settings, runtime: Callable[[], WebRuntime]) -> None:
        self.settings = settings
        self.runtime = runtime
        """The runtime, once started (else it raises 503: `WebChannel.require_runtime`)."""

    @property
    def store(self) -> Any:
        return self.runtime().store

    @staticmethod
    def _respond(request: web.Request, title: str, html: str, data: Any) -> web.Response:
        if wants_json(request):
            return web.json_response(data, dumps=lambda v: json.dumps(v, ensure_ascii=False))
        return web.Response(text=page(title, html), content_type="text/html")

    async def _tape(self, request: web.Request) -> tuple[str, TapeStats]:
        name = request.match_info["tape"]
        if not TAPE_RE.fullmatch(name):
            raise _bad("no such tape", 404)
        stats = await self.store.stats(name)
        if not stats.entries:
            raise _bad("no such tape", 404)
        return name, stats

    # -- all tapes -------------------------------------------------------------------------------
    async def tapes(self, request: web.Request) -> web.StreamResponse:
        """Live tapes, newest activity first; `channel=`, `q=` (session id), `page=`."""
        channel = request.query.get("channel", "")
        needle = request.query.get("q", "").strip()
        page_no = _int(request, "page", 1, 1, 1_000_000)
        rows = await self.store.list_tapes()
        channels = sorted({_channel_of(r.session_id) for r in rows})
        if channel:
            rows = [r for r in rows if _channel_of(r.session_id) == channel]
        if needle:
            low = needle.lower()
            rows = [r for r in rows if low in (r.session_id or "").lower() or low in r.name]
        pages = max(1, -(-len(rows) // TAPES_PER_PAGE))
        shown = rows[(page_no - 1) * TAPES_PER_PAGE : page_no * TAPES_PER_PAGE]
        data = {
            "tapes": [
                {
                    "name": r.name,
                    "session_id": r.session_id,
                    "channel": _channel_of(r.session_id),
                    "entries": r.entries,
                    "anchors": r.anchors,
                    "last_activity": r.updated,
                }
                for r in shown
            ],
            "page": page_no,
            "pages": pages,
            "total": len(rows),
            "channels": channels,
        }
        return self._respond(request, "Tapes", tapes_html(data, channel, needle), data)

    # -- one tape ------------------------------------------------------------------------------
    async def tape(self, request: web.Request) -> web.StreamResponse:
        """One page of a tape: newest `per` entries of the view, `before=`/`after=` cursors."""
        name, stats = await self._tape(request)
        view = "all" if request.query.get("view") == "all" else "anchor"
        kind = request.query.get("kind") or None
        if kind is not None and kind not in KINDS:
            raise _bad(f"kind must be one of {', '.join(KINDS)}")
        per = _int(request, "per", ENTRIES_PER_PAGE, 1, MAX_PER_PAGE)
        before = _int(request, "before", 0, 1, BIG) or None
        after = _int(request, "after", -1, 0, BIG)
        lo = stats.last_anchor_id if view == "anchor" else 0
        kinds = [kind] if kind else None
        if after >= 0:
            found = await self.store.query(
                name, after_id=max(lo, after), kinds=kinds, limit=per + 1
            )
            entries = found[:per]
            has_newer = len(found) > per
            has_older = max(lo, after) > lo
        else:
            found = await self.store.query(
                name, after_id=lo, before_id=before, kinds=kinds, newest_first=True, limit=per + 1
            )
            entries = found[:per][::-1]
            has_older = len(found) > per
            has_newer = before is not None and before <= stats.entries
        base = f"/tapes/{name}"
        keep = {
            "view": "all" if view == "all" else None,
            "kind": kind,
            "per": per if per != ENTRIES_PER_PAGE else None,
        }
        first = entries[0].id if entries else max(lo, after) + 1
        last = entries[-1].id if entries else (before or stats.entries + 1) - 1
        tape = Tape(self.store, name, stats.session_id)
        result = TapePage(
            name=name,
            stats=stats,
            view=view,
            kind=kind,
            entries=entries,
            older=url(base, before=first, **keep) if has_older else None,
            newer=url(base, after=last, **keep) if has_newer else None,
            anchors=await tape.anchors(TIMELINE_ANCHORS),
            archives=await self._archives(name),
            spills=await self._spills(tape),
            jobs=await self._jobs(name, stats.session_id),
            children=await viewer_family.children(self.store, name, stats.session_id),
            parent=await viewer_family.parent(self.store, name, stats.session_id),
        )
        title = f"Tape {stats.session_id or name}"
        return self._respond(request, title, tape_html(result), result.to_json())

    async def _archives(self, name: str) -> list[dict[str, Any]]:
        """The session's archived tapes (not their sidecars), newest first."""
        prefix = name.split(ARCHIVE_SEP, 1)[0] + ARCHIVE_SEP
        return [
            {"name": r.name, "entries": r.entries, "anchors": r.anchors, "archived": r.updated}
            for r in await self.store.list_tapes(include_all=True)
            if r.name.startswith(prefix) and tape_role(r.name[len(prefix) :]) == "live"
        ]

    async def _jobs(self, name: str, session_id: str | None) -> list[dict[str, Any]]:
        """The session's scheduled jobs, every kind, on its live tape (an index lookup)."""
        if not session_id or tape_role(name) != "live":
            return []
        found = await self.store.jobs(session_id=session_id, limit=LISTED_JOBS)
        return [{**job_summary(j), "kind": j.kind} for j in found]

    async def _spills(self, tape: Tape) -> list[dict[str, Any]]:
        """The newest spill manifests of the tape's sidecar (index lookups)."""
        manifests = await tape.sidecar(spill.SIDECAR).query(
            kinds=["event"], names=["spill.manifest"], newest_first=True, limit=LISTED_SPILLS
        )
        return [dict(m.payload.get("data") or {}, date=m.date) for m in manifests]

    # -- context now -----------------------------------------------------------------------------
    async def context(self, request: web.Request) -> web.StreamResponse:
        """Exactly what the agent sends next: the system prompt, then the default selector's
        messages from the entries after the last anchor (`Tape.read_messages`)."""
        name, stats = await self._tape(request)
        runtime = self.runtime()
        tools = runtime.agent.tools
        tape = Tape(self.store, name, stats.session_id)
        # The session's own workspace (BUB_WORKSPACE_MAP): its AGENTS.md and MCP tools.
        workspace = await runtime.tape_workspace(tape)
        prompt = build_system_prompt(
            self.settings.system_prompt,
            workspace,
            tools.visible(workspace),
            self.settings.skills_dir,
        )
        system = runtime.agent.scrub.text(prompt)  # as the agent sends it: secrets redacted
        messages = [{"role": "system", "content": system}, *await tape.read_messages()]
        schemas = tools.schemas(workspace)
        data = {
            "tape": name,
            "session_id": stats.session_id,
            "messages": messages,
            "tools": [s.get("function", {}).get("name") for s in schemas],
            "estimated_tokens": {
                "messages": len(json.dumps(messages, ensure_ascii=False)) // 4,
                "tools": len(json.dumps(schemas, ensure_ascii=False)) // 4,
            },
        }
        title = f"Context of {stats.session_id or name}"
        return self._respond(request, title, context_html(data), data)

    # -- spilled output ------------------------------------------------------------------------
    async def spilled(self, request: web.Request) -> web.StreamResponse:
        """One page (chunk) of a spilled output, read with the agent's own `spill.read`."""
        name, stats = await self._tape(request)
        handle = request.match_info["handle"]
        if not HANDLE_RE.fullmatch(handle):
            raise _bad("no such spill handle", 404)
        page_no = _int(request, "page", 0, 0, 1_000_000)
        text = await spill.read(Tape(self.store, name, stats.session_id), handle, cursor=page_no)
        head, _, content = text.partition("\n")
        try:
            header = json.loads(head)
        except ValueError:
            header = None
        if not isinstance(header, dict):
            raise _bad(text, 404)  # spill.read explains: unknown handle, past the end, ...
        data = {
            "tape": name,
            "handle": handle,
            "page": page_no,
            "pages": int(header.get("total_chunks") or 0),
            **header,
            "content": content,
        }
        html = spill_html(data, request.path, stats.session_id or name)
        return self._respond(request, f"Spill {handle}", html, data)
