"""Queries: a query's filters (`QuerySpec`, checked once for every store) and the SQL both
stores run for it, and for the one-statement operations of statements.py (dedupe keys, a
session's tapes, jobs). The two databases differ in a few spellings (table names,
parameters, a few functions, how a list of names is passed, how due jobs are claimed); those
are data (`Dialect`), so one builder writes both stores' statements.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from .entries import KINDS, safe_text
from .jobs import COLUMNS

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


class AnchorNotFound(LookupError):
    """A query named an anchor the tape does not have."""


def _day_start(d: date) -> str:
    return datetime(d.year, d.month, d.day, tzinfo=UTC).isoformat(timespec="microseconds")


def date_bound(value: str | date | datetime, *, end: bool) -> tuple[str, str]:
    """Turn a user date bound into (operator, ISO string); bare dates cover whole UTC days."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return ("<=" if end else ">="), moment.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, date):
        day = value
    else:
        text = str(value).strip()
        try:
            if len(text) == 10:
                day = date.fromisoformat(text)
            else:
                return date_bound(datetime.fromisoformat(text.replace("Z", "+00:00")), end=end)
        except ValueError:
            raise ValueError(f"not a date or ISO-8601 time: {value!r}") from None
    if end:
        return "<", _day_start(day + timedelta(days=1))
    return ">=", _day_start(day)


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """A query's filters, checked and normalised once for every store.

    Anchor filters: after the last anchor; after the last occurrence of a named anchor;
    `between=(start, end)`: after the last `start` anchor and before the first `end` anchor
    that follows it (to the end of the tape if none does). `since`/`until` take datetimes or
    ISO strings; a bare date (YYYY-MM-DD) covers the whole UTC day. `text` finds a substring of
    the payload in any script, case-insensitive for ASCII letters only (`needle` is the text
    as it appears inside stored JSON, ASCII-folded).
    """

    tape: str
    after_last_anchor: bool = False
    after_anchor: str | None = None
    between: tuple[str, str] | None = None
    after_id: int = 0
    before_id: int | None = None
    kinds: tuple[str, ...] | None = None
    names: tuple[str, ...] | None = None
    since: tuple[str, str] | None = None
    until: tuple[str, str] | None = None
    needle: str | None = None
    limit: int | None = None
    newest_first: bool = False

    @classmethod
    def build(
        cls,
        tape: str,
        *,
        after_last_anchor: bool = False,
        after_anchor: str | None = None,
        between: tuple[str, str] | None = None,
        after_id: int | None = None,
        before_id: int | None = None,
        kinds: Iterable[str] | None = None,
        names: Iterable[str] | None = None,
        since: str | date | datetime | None = None,
        until: str | date | datetime | None = None,
        text: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> QuerySpec:
        """Check the filters (ValueError naming the bad one) and normalise them."""
        kind_list = None
        if kinds is not None:
            kind_list = tuple(kinds)
            unknown = [k for k in kind_list if k not in KINDS]
            if unknown:
                raise ValueError(f"unknown entry kind(s) {unknown}; kinds are {', '.join(KINDS)}")
        needle = None
        if text:
            # Payloads are stored as JSON without ASCII escapes, so any script matches as-is;
            # the needle is escaped the same way so quotes and newlines match too. Only ASCII
            # is folded (both databases fold the stored side the same way), so "Привет" is
            # found as written.
            needle = safe_text(json.dumps(text, ensure_ascii=False)[1:-1]).translate(_ASCII_LOWER)
        return cls(
            tape=tape,
            after_last_anchor=after_last_anchor,
            after_anchor=after_anchor,
            between=between,
            after_id=int(after_id or 0),
            before_id=None if before_id is None else int(before_id),
            kinds=kind_list,
            names=None if names is None else tuple(safe_text(n) for n in names),
            since=None if since is None else date_bound(since, end=False),
            until=None if until is None else date_bound(until, end=True),
            needle=needle,
            limit=None if limit is None else int(limit),
            newest_first=newest_first,
        )

    @property
    def start_anchor(self) -> str | None:
        """The named anchor the view starts after, if any."""
        if self.between is not None:
            return self.between[0]
        return self.after_anchor

    def kind_sql(self) -> str | None:
        """The kind filter as literal SQL (kinds are checked), so partial indexes apply."""
        if self.kinds is None:
            return None
        if len(self.kinds) == 1:
            return f"kind = '{self.kinds[0]}'"
        if not self.kinds:
            return "FALSE"
        return f"kind IN ({','.join(repr(k) for k in self.kinds)})"

    def anchored(self, bounds: Any) -> tuple[int, int, int | None]:
        """(tape row id, low id, high id) of a view that starts at a named anchor, from the
        row `Dialect.anchors` found (None: no such tape); AnchorNotFound when the tape has no
        such anchor."""
        if bounds is None or bounds[1] is None:
            raise AnchorNotFound(f"anchor {self.start_anchor!r} not found")
        tape_id, start, stop = bounds[0], bounds[1], bounds[2]
        high = self.before_id
        if stop is not None:
            high = stop if high is None else min(high, stop)
        return tape_id, max(self.after_id, start), high


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells what the queries need."""

    prefix: str
    """Of the table names (PostgreSQL's tables are `bub_…`)."""
    param: str
    """Numbered parameters: `?1` (SQLite) or `$1` (PostgreSQL)."""
    greatest: str
    """The larger of two values: `max` (SQLite) or `greatest` (PostgreSQL)."""
    position: str
    """Where a substring starts (0: nowhere): `instr` or `strpos`."""
    arrays: bool
    """Pass a list of names as one array parameter (else one parameter per name)."""
    claim: str = ""
    """What a claim of due jobs adds so that replicas firing at once take disjoint rows
    (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite's write lock is the whole database)."""

    def params(self, *first: Any) -> tuple[list[Any], Callable[[Any], str]]:
        """A statement's parameter list (starting with `first`) and the function that adds
        one value to it and returns its placeholder."""
        args: list[Any] = list(first)

        def arg(value: Any) -> str:
            args.append(value)
            return f"{self.param}{len(args)}"

        return args, arg

    def among(self, column: str, values: Sequence[str], arg: Callable[[Any], str]) -> str:
        """`column` is one of `values` (text), in this database's spelling."""
        if not values:
            return "FALSE"
        if self.arrays:
            return f"{column} = ANY({arg(list(values))}::text[])"
        return f"{column} IN ({','.join(arg(v) for v in values)})"

    def anchors(self) -> str:
        """One row for a view that starts at a named anchor: the tape's row id, the last
        anchor named `$2` and the first anchor named `$3` after it (NULL: none). Parameters:
        tape name, start anchor, end anchor (NULL without `between`)."""
        entries, p = f"{self.prefix}entries", self.param
        start = (
            f"(SELECT max(id) FROM {entries} WHERE tape = t.id AND kind = 'anchor' AND name = {p}2)"
        )
        return (
            f"SELECT t.id, {start},"
            f" (SELECT min(id) FROM {entries}"
            f" WHERE tape = t.id AND kind = 'anchor' AND name = {p}3 AND id > {start})"
            f" FROM {self.prefix}tapes t WHERE t.name = {p}1"
        )

    def entries(
        self, spec: QuerySpec, tape: Any, low: int, high: int | None, *, by_name: bool = False
    ) -> tuple[str, list[Any]]:
        """The entries of `spec` with ids between `low` and `high` (exclusive) and its
        parameters; `tape` is the tape's row id, or (`by_name`) its name, looked up in the
        same statement (one round trip for the common read)."""
        args, arg = self.params(tape, low)
        entries, p = f"{self.prefix}entries", self.param
        tape_ref = f"(SELECT id FROM {self.prefix}tapes WHERE name = {p}1)" if by_name else f"{p}1"
        above = f"{p}2"
        if spec.after_last_anchor:
            above = (
                f"{self.greatest}({p}2, (SELECT coalesce(max(a.id), 0) FROM {entries} a"
                f" WHERE a.tape = {tape_ref} AND a.kind = 'anchor'))"
            )
        sql = (
            f"SELECT id, kind, payload, meta, date FROM {entries}"
            f" WHERE tape = {tape_ref} AND id > {above}"
        )
        if high is not None:
            sql += f" AND id < {arg(high)}"
        kind = spec.kind_sql()
        if kind:
            sql += " AND " + kind
        if spec.names is not None:
            sql += " AND " + self.among("name", spec.names, arg)
        for bound in (spec.since, spec.until):
            if bound is not None:
                sql += f" AND date {bound[0]} {arg(bound[1])}"
        if spec.needle:
            # lower() folds ASCII only in both (SQLite's always, PostgreSQL's under the "C"
            # collation), as the needle is folded.
            sql += f" AND {self.position}(lower(payload), {arg(spec.needle)}) > 0"
        sql += " ORDER BY id DESC" if spec.newest_first else " ORDER BY id"
        if spec.limit is not None:
            sql += f" LIMIT {arg(spec.limit)}"
        return sql, args

    # -- one-statement reads (tape/statements.py) -----------------------------------------------
    def is_duplicate(self, key: str) -> tuple[str, list[Any]]:
        """A row when the dedupe key is recorded."""
        return f"SELECT 1 FROM {self.prefix}dedupe WHERE key = {self.param}1", [key]

    def dedupe(self, after: str, limit: int) -> tuple[str, list[Any]]:
        """Recorded dedupe keys greater than `after`, in key order."""
        p = self.param
        sql = (
            f"SELECT key, tape, entry_id, date FROM {self.prefix}dedupe WHERE key > {p}1"
            f" ORDER BY key LIMIT {p}2"
        )
        return sql, [after, limit]

    def session_tapes(self, session_id: str) -> tuple[str, list[Any]]:
        """The names of a session id's live tapes, oldest first."""
        sql = (
            f"SELECT name FROM {self.prefix}tapes WHERE session_id = {self.param}1"
            " AND role = 'live' ORDER BY id"
        )
        return sql, [session_id]

    # -- jobs (tape/jobs.py) -------------------------------------------------------------------
    def jobs(
        self, session_id: str | None, kinds: Sequence[str] | None, limit: int
    ) -> tuple[str, list[Any]]:
        """Jobs soonest first: all, or a session's, or of `kinds`."""
        args, arg = self.params()
        where = self._job_filter(session_id, kinds, arg)
        sql = f"SELECT {COLUMNS} FROM {self.prefix}jobs{where} ORDER BY due, id LIMIT {arg(limit)}"
        return sql, args

    def remove_job(
        self, job_id: str, session_id: str | None, kinds: Sequence[str] | None
    ) -> tuple[str, list[Any]]:
        """Delete a job (only a session's or of `kinds` when given), returning its row."""
        args, arg = self.params()
        where = f" WHERE id = {arg(safe_text(job_id))}"
        where += self._job_filter(session_id, kinds, arg).replace(" WHERE ", " AND ", 1)
        return f"DELETE FROM {self.prefix}jobs{where} RETURNING {COLUMNS}", args

    def next_due(self, kinds: Sequence[str], channels: Sequence[str]) -> tuple[str, list[Any]]:
        """The soonest due time of the jobs of `kinds` for `channels`."""
        args, arg = self.params()
        sql = (
            f"SELECT min(due) FROM {self.prefix}jobs WHERE {self.among('kind', kinds, arg)}"
            f" AND {self.among('channel', channels, arg)}"
        )
        return sql, args

    def due_jobs(
        self, now: float, kinds: Sequence[str], channels: Sequence[str], limit: int
    ) -> tuple[str, list[Any]]:
        """Up to `limit` jobs of `kinds` for `channels` due at `now`, claimed (`claim`)."""
        args, arg = self.params()
        sql = (
            f"SELECT {COLUMNS} FROM {self.prefix}jobs WHERE due <= {arg(now)}"
            f" AND {self.among('kind', kinds, arg)} AND {self.among('channel', channels, arg)}"
            f" ORDER BY due, id LIMIT {arg(limit)}{self.claim}"
        )
        return sql, args

    def _job_filter(
        self, session_id: str | None, kinds: Sequence[str] | None, arg: Callable[[Any], str]
    ) -> str:
        clauses = []
        if session_id is not None:
            clauses.append(f"session_id = {arg(safe_text(session_id))}")
        if kinds is not None:
            clauses.append(self.among("kind", kinds, arg))
        return " WHERE " + " AND ".join(clauses) if clauses else ""


SQLITE = Dialect(prefix="", param="?", greatest="max", position="instr", arrays=False)
POSTGRES = Dialect(
    prefix="bub_",
    param="$",
    greatest="greatest",
    position="strpos",
    arrays=True,
    claim=" FOR UPDATE SKIP LOCKED",
)
