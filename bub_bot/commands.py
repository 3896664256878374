"""Chat commands: /handoff /reset /status /anchors /tools /skills /schedules /unschedule /usage
/stop /help.

Recognised at the start of a message (after a leading bot mention), also as `/cmd@botname`.
They write anchors and events; the model never sees them as messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .toolgroups import offered as group_offered

if TYPE_CHECKING:
    from .agent.skills import Catalog
    from .agent.tools import ToolRegistry

USAGE = {
    "handoff": "/handoff [name=<anchor-name>] [summary text] — start a new phase (without text the model writes the summary)",
    "reset": "/reset — archive this conversation and start empty",
    "status": "/status — entries, anchors, last anchor, last token usage",
    "anchors": "/anchors [count] — the most recent anchors",
    "tools": "/tools — the tools the model has here (built-in and MCP servers)",
    "skills": "/skills — the skills the model can load here, and SKILL.md files skipped",
    "schedules": "/schedules — this conversation's scheduled jobs and their next runs",
    "unschedule": "/unschedule <id> — remove a scheduled job (the ids are in /schedules)",
    "usage": "/usage [all] — your use today and this month and what is left (all: everyone's, admins only)",
    "stop": "/stop [id] — stop background work (one subagent by its id from /status, or all)",
    "help": "/help — this list",
}
COMMANDS = tuple(USAGE)
_NAME_RE = re.compile(r"[A-Za-z0-9_./:-]{1,100}")
_JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class Command:
    """A parsed command. `error` is set when the arguments are wrong (reply: usage line)."""

    name: str
    args: str
    error: str | None = None
    anchor_name: str = "handoff"
    count: int = 10

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "args": self.args, "error": self.error}


def strip_mention(text: str, bot_names: tuple[str, ...]) -> str:
    """Remove one leading mention of the bot (`@name`, `<@U123>`) and the separator after it."""
    stripped = text.lstrip()
    for name in bot_names:
        if not name or not stripped.lower().startswith(name.lower()):
            continue
        rest = stripped[len(name) :]
        if rest and (rest[0].isalnum() or rest[0] == "_"):
            continue  # "@bottle" is not a mention of "@bot"
        return rest.lstrip(" ,:\u00a0")
    return stripped


def parse(
    text: str, bot_names: tuple[str, ...] = (), *, strict_target: bool = True
) -> Command | None:
    """The command in `text`, or None when it is ordinary text for the model.

    Unknown `/words` are ordinary text. `/cmd@other` addressed to another bot is not ours
    when `strict_target` and we know our names.
    """
    body = strip_mention(text, bot_names)
    if not body.startswith("/"):
        return None
    head, _, rest = body[1:].partition(" ")
    head, _, newline_rest = head.partition("\n")
    rest = (newline_rest + " " + rest).strip() if newline_rest else rest.strip()
    name, _, target = head.partition("@")
    name = name.lower()
    if name not in COMMANDS:
        return None
    if target and strict_target and bot_names:
        ours = {n.lstrip("@").lower() for n in bot_names}
        if target.lower() not in ours:
            return None
    return _check(name, rest)


def _check(name: str, args: str) -> Command:
    if name in ("reset", "status", "tools", "skills", "schedules", "help"):
        if args:
            return Command(name, args, f"{name} takes no arguments. Usage: {USAGE[name]}")
        return Command(name, args)
    if name == "anchors":
        if not args:
            return Command(name, args)
        if args.isdigit() and 1 <= int(args) <= 100:
            return Command(name, args, count=int(args))
        return Command(name, args, f"count must be a number from 1 to 100. Usage: {USAGE[name]}")
    if name == "usage":
        if args.lower() not in ("", "all"):
            return Command(name, args, f"usage takes nothing or all. Usage: {USAGE[name]}")
        return Command(name, args.lower())
    if name == "stop":
        if args and not _JOB_ID_RE.fullmatch(args):
            return Command(name, args, f"give one id, or none for all. Usage: {USAGE[name]}")
        return Command(name, args)
    if name == "unschedule":
        if not _JOB_ID_RE.fullmatch(args):
            return Command(name, args, f"give one job id. Usage: {USAGE[name]}")
        return Command(name, args)
    # handoff
    anchor_name = "handoff"
    summary = args
    first, _, remainder = args.partition(" ")
    if first.startswith("name="):
        anchor_name = first[len("name=") :]
        summary = remainder.strip()
        if not _NAME_RE.fullmatch(anchor_name):
            return Command(
                name,
                args,
                f"anchor names are 1-100 characters of letters, digits and _ . / : -. Usage: {USAGE[name]}",
            )
    return Command(name, summary, anchor_name=anchor_name)


TOOL_LINE = 90


def _tool_line(name: str, description: str) -> str:
    first = description.strip().splitlines()[0] if description.strip() else ""
    if len(first) > TOOL_LINE:
        first = first[: TOOL_LINE - 1] + "…"
    return f"- {name} — {first}" if first else f"- {name}"


def tools_text(
    registry: ToolRegistry,
    workspace: Path | None = None,
    groups: frozenset[str] | None = None,
    why_off: dict[str, str] | None = None,
) -> str:
    """The /tools reply: the built-in tools, then each MCP server with its state and tools
    (what the model is offered in `workspace` right now, in `groups`), then the tools not
    offered and why (`why_off`: a reason per group turned off)."""
    own = registry.own(groups)
    lines = [f"Built-in tools ({len(own)}):"]
    lines += [_tool_line(t.exposed_name, t.description) for t in own]
    offered = len(own)
    reserved = {t.exposed_name for t in registry.own()}
    for source in registry.sources if groups is None or "mcp" in groups else ():
        overview = getattr(source, "overview", None)
        if overview is None:
            continue
        for server in overview(workspace, reserved):
            offered += len(server.tools)
            head = f"MCP server {server.name} ({server.transport}): {server.state}"
            if server.state == "ready":
                head += f", {len(server.tools)} tools"
            if server.detail:
                head += f" — {server.detail}"
            lines.append("")
            lines.append(head)
            lines += [_tool_line(t.exposed_name, t.description) for t in server.tools]
    off = [
        (t.exposed_name, (why_off or {}).get(t.group, "turned off"))
        for t in registry.own()
        if not group_offered(t.group, groups)
    ]
    off += [(name.replace(".", "_"), why) for name, why in registry.missing.items()]
    if groups is not None and "mcp" not in groups and registry.sources:
        off.append(("MCP servers' tools", (why_off or {}).get("mcp", "turned off")))
    if off:
        lines.append("")
        lines.append(f"Not offered here ({len(off)}):")
        lines += [f"- {name} — {why}" for name, why in off]
    lines.insert(0, f"The model has {offered} tools in this conversation.\n")
    return "\n".join(lines)


def skills_text(found: Catalog, offered: bool = True) -> str:
    """The /skills reply: each skill with its description and folder, then the SKILL.md
    files skipped and why (`offered`: the model has the skill tool here)."""
    lines = []
    if not offered:
        lines.append("The skill tool is turned off here, so the model sees no skills.\n")
    if found.skills:
        lines.append(f"Skills ({len(found.skills)}):")
        for skill in found.skills:
            lines.append(_tool_line(skill.name, skill.description) + f" [{skill.where}]")
    else:
        lines.append(
            "No skills here. A skill is a folder skills/<name>/SKILL.md in the workspace (or"
            " in BUB_SKILLS_DIR) with name and description in YAML front matter."
        )
    if found.skipped:
        lines.append("")
        lines.append(f"Skipped ({len(found.skipped)}):")
        lines += [f"- {s.file} — {s.reason}" for s in found.skipped]
    return "\n".join(lines)


def help_text() -> str:
    """The /help reply."""
    return "Commands:\n" + "\n".join(USAGE.values())
