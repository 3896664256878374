"""Tool groups (issue 19 §5): what BUB_TOOLS and a workspace rule's `tools` choose from."""

from __future__ import annotations

TOOL_GROUPS = ("tape", "fs", "spill", "bash", "web", "skills", "mcp", "schedule")
_PREFIX = {"skill": "skills"}


def group_of(tool_name: str) -> str:
    """A tool's group from its dotted name (`fs.read` → fs, `skill` → skills, `mcp.x.y` → mcp);
    "" for a name of no group (always offered: BUB_TOOLS cannot name it)."""
    head = tool_name.split(".", 1)[0]
    head = _PREFIX.get(head, head)
    return head if head in TOOL_GROUPS else ""


def offered(group: str, groups: frozenset[str] | None) -> bool:
    """Whether a tool of `group` is offered when `groups` are (None: all)."""
    return groups is None or not group or group in groups


def check_groups(value: list[str], where: str) -> list[str]:
    """`value` if every entry is a known group (ValueError naming `where` otherwise)."""
    unknown = [g for g in value if g not in TOOL_GROUPS]
    if unknown:
        raise ValueError(
            f"{where}: unknown tool group {unknown[0]!r} (groups: {', '.join(TOOL_GROUPS)})"
        )
    return value
