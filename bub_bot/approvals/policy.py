"""The approval policy: `allow`, `ask` or `deny` for one tool call in one conversation.

Where a decision comes from, first match wins:

1. the workspace rule of the session (`"approve": {"bash": "allow", ...}` in
   `BUB_WORKSPACE_MAP`): an operator's decision for those conversations;
2. `BUB_APPROVE` (`bash=ask,fs.write=ask,web.fetch=allow,mcp.github.*=ask`);
3. an MCP tool's own annotations (the MCP spec's `readOnlyHint` / `destructiveHint`):
   read-only ones `allow`, the others like `fs.write`;
4. the defaults: `bash`, `fs.write`, `fs.edit` (and unannotated or destructive MCP tools) are
   `ask` in group conversations (Slack channels, Telegram groups) and `allow` in private chats,
   the web chat and the terminal; everything else is `allow`.

Within one source the most specific key wins: an exact tool name, then the longest glob,
then the tool's group (`fs`, `bash`, `mcp`, ...). The model never sees or changes any of it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..toolgroups import group_of

ALLOW, ASK, DENY = "allow", "ask", "deny"
CHOICES = (ALLOW, ASK, DENY)
ACTING = ("bash", "fs.write", "fs.edit")
"""Tools that change things: `ask` in group conversations by default (`bash.output` and
`bash.kill` only read or stop a job the conversation started: allowed)."""


def is_group_conversation(session_id: str) -> bool:
    """A conversation several people share: a Slack channel (not a DM, ids `D…`), a
    Telegram group (negative chat id). The web chat and the terminal are private."""
    parts = session_id.split(":")
    if parts[0] == "slack" and len(parts) >= 3:
        return not parts[2].startswith("D")
    if parts[0] == "telegram" and len(parts) >= 2:
        return parts[1].startswith("-")
    return False


def parse_rules(value: str | Mapping[str, object], where: str) -> dict[str, str]:
    """`key=choice,...` (or a mapping) as {key: choice}; ConfigError naming `where`."""
    items: list[tuple[str, object]]
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            key, sep, choice = part.partition("=")
            if not sep:
                raise ConfigError(f"{where}: {part!r} is not <tool or group>=allow|ask|deny")
            items.append((key.strip(), choice.strip()))
    rules: dict[str, str] = {}
    for key, choice in items:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: empty tool name")
        if not isinstance(choice, str) or choice.lower() not in CHOICES:
            raise ConfigError(f"{where}: {key}={choice!r}: expected allow, ask or deny")
        rules[key] = choice.lower()
    return rules


def _lookup(rules: Mapping[str, str], name: str, group: str) -> str | None:
    if name in rules:
        return rules[name]
    globs = [k for k in rules if any(c in k for c in "*?[") and fnmatch.fnmatchcase(name, k)]
    if globs:
        return rules[max(globs, key=len)]
    return rules.get(group)


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """What the policy needs to know about a tool (no import of the agent's Tool)."""

    name: str
    group: str = ""
    read_only: bool | None = None
    """MCP `readOnlyHint` (None: not annotated / not an MCP tool)."""
    destructive: bool | None = None
    """MCP `destructiveHint` (None: not annotated)."""


@dataclass(frozen=True)
class ApprovalPolicy:
    """`BUB_APPROVE` parsed; `decide` adds the workspace rule and the defaults."""

    rules: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: str) -> ApprovalPolicy:
        return cls(parse_rules(value or "", "BUB_APPROVE"))

    def decide(
        self,
        tool: ToolFacts,
        session_id: str,
        workspace_rules: Mapping[str, str] | None = None,
    ) -> str:
        """`allow`, `ask` or `deny` for a call of `tool` in `session_id`."""
        group = tool.group or group_of(tool.name)
        for rules in (workspace_rules or {}, self.rules):
            found = _lookup(rules, tool.name, group)
            if found is not None:
                return found
        acting = tool.name in ACTING
        if group == "mcp":
            if tool.read_only:
                return ALLOW
            acting = True  # destructive or unannotated: like fs.write
        if acting:
            return ASK if is_group_conversation(session_id) else ALLOW
        return ALLOW
