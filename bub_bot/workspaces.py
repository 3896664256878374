"""Which workspace a conversation works in: `BUB_WORKSPACE_MAP` rules, first match wins.

    {"workspaces": [
        {"match": "slack:T0123:C0456:*", "path": "/srv/backend"},
        {"match": "web:*", "path": "/srv/scratch/{tape}"}
    ]}

`match` is a glob on the session id; `path` a directory; optional operator keys: `tools` (tool
groups, narrowing BUB_TOOLS) and `network` (bash commands get the network). `{session}` and `{tape}` give each
conversation a directory of its own (a safe name, created on first use). No match: the
default workspace (`BUB_WORKSPACE`). The runtime decides a session's workspace once, when the
session starts, and records it on the tape; a changed map applies to new sessions only.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .limits import RuleLimits
from .toolgroups import check_groups

_PLACEHOLDER = re.compile(r"\{(session|tape)\}")
RULE_KEYS = {"match", "path", "tools", "network", "limits"}
"""A rule's keys: where, then the operator's decisions for it (`tools`, `network`: issue 19;
`limits`: issue 23); `approve` joins with approvals."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class WorkspaceRule:
    """One rule: sessions whose id matches `match` work in `path`."""

    match: str
    path: str
    index: int
    tools: tuple[str, ...] | None = None
    """Tool groups this workspace allows (narrows BUB_TOOLS); None: all of BUB_TOOLS."""
    network: bool = False
    """Sandboxed commands (bash) may use the network: the operator's choice, per workspace."""
    limits: RuleLimits | None = None
    """`"limits": {...}`: the message rates and budgets of sessions here (bub_bot/limits.py)."""

    @property
    def per_session(self) -> bool:
        """Each conversation gets its own directory (the path has a placeholder)."""
        return bool(_PLACEHOLDER.search(self.path))

    def directory(self, session_id: str) -> Path:
        """The directory for `session_id` (not created)."""
        if not self.per_session:
            return Path(self.path)
        values = {"session": safe_name(session_id), "tape": tape_dir_name(session_id)}
        return Path(_PLACEHOLDER.sub(lambda m: values[m.group(1)], self.path))


def safe_name(session_id: str) -> str:
    """`session_id` as one path component: readable, no separators, never `.` or `..`,
    and unique (a short hash keeps `a:b` and `a_b` apart)."""
    readable = _UNSAFE.sub("_", session_id).strip("_")[:80] or "session"
    digest = hashlib.md5(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{readable}-{digest}"


def tape_dir_name(session_id: str) -> str:
    """An opaque per-session name (the session-id half of a tape name)."""
    return hashlib.md5(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class WorkspaceMap:
    """The rules of `BUB_WORKSPACE_MAP` in order, and the default workspace."""

    def __init__(self, rules: list[WorkspaceRule], default: Path, source: str = "") -> None:
        self.rules = rules
        self.default = default
        self.source = source

    def rule_for(self, session_id: str) -> WorkspaceRule | None:
        """The first rule matching `session_id` (case-sensitive glob), or None."""
        for rule in self.rules:
            if fnmatch.fnmatchcase(session_id, rule.match):
                return rule
        return None

    def resolve(self, session_id: str) -> Path:
        """The workspace a new session `session_id` gets; a per-session directory is
        created here (its parent must exist: it was checked at start)."""
        rule = self.rule_for(session_id)
        if rule is None:
            return self.default
        path = rule.directory(session_id)
        if rule.per_session:
            path.mkdir(parents=True, exist_ok=True)
        return path

    def check(self) -> None:
        """Every fixed directory exists, and every per-session template can be created:
        ConfigError naming the rule otherwise."""
        for rule in self.rules:
            fixed = Path(_PLACEHOLDER.split(rule.path, maxsplit=1)[0])
            if rule.per_session:
                fixed = fixed if rule.path.startswith(str(fixed) + "/") else fixed.parent
            if not fixed.is_dir():
                raise ConfigError(
                    f"BUB_WORKSPACE_MAP: {self.source}: rule {rule.index + 1}"
                    f" (match {rule.match!r}): directory {str(fixed)!r} does not exist"
                )


def load_workspace_map(path: Path | None, default: Path) -> WorkspaceMap:
    """Read `BUB_WORKSPACE_MAP` (None: no rules). A broken file is a ConfigError naming the
    file and the problem."""
    if path is None:
        return WorkspaceMap([], default)
    where = f"BUB_WORKSPACE_MAP: {path}"
    try:
        raw = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    rules = _rules(raw, where)
    found = WorkspaceMap(rules, default, str(path))
    found.check()
    return found


def _rules(raw: Any, where: str) -> list[WorkspaceRule]:
    if not isinstance(raw, dict) or set(raw) != {"workspaces"}:
        raise ConfigError(f'{where}: expected {{"workspaces": [...]}} and nothing else')
    items = raw["workspaces"]
    if not isinstance(items, list):
        raise ConfigError(f"{where}: workspaces must be a list of rules")
    rules = []
    for index, item in enumerate(items):
        name = f"{where}: rule {index + 1}"
        if not isinstance(item, dict) or not {"match", "path"} <= set(item) <= RULE_KEYS:
            raise ConfigError(
                f'{name}: expected {{"match": "<glob>", "path": "<directory>"}} (optional keys:'
                f" {', '.join(sorted(RULE_KEYS - {'match', 'path'}))})"
            )
        match, path = item["match"], item["path"]
        if not isinstance(match, str) or not match:
            raise ConfigError(f"{name}: match must be a non-empty glob on the session id")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"{name}: path must be an absolute directory")
        unknown = set(re.findall(r"\{([^}]*)\}", path)) - {"session", "tape"}
        if unknown:
            raise ConfigError(
                f"{name}: unknown placeholder {{{sorted(unknown)[0]}}} (use {{session}} or {{tape}})"
            )
        if ".." in Path(path).parts:
            raise ConfigError(f"{name}: path must not contain '..'")
        tools = item.get("tools")
        if tools is not None:
            if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
                raise ConfigError(f"{name}: tools must be a list of tool groups")
            try:
                check_groups(tools, name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        network = item.get("network", False)
        if not isinstance(network, bool):
            raise ConfigError(f"{name}: network must be true or false")
        limits = None
        if "limits" in item:
            try:
                limits = RuleLimits.parse(item["limits"], name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        rules.append(
            WorkspaceRule(
                match,
                path,
                index,
                tools=None if tools is None else tuple(tools),
                network=network,
                limits=limits,
            )
        )
    return rules
