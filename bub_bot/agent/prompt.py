"""The system prompt, built fresh for every model call (never stored on the tape)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from . import skills
from .tools import Tool

DEFAULT_PROMPT = """You are bub, a helpful assistant in a team chat (Slack or Telegram).
Answer concisely in the language the user writes in. Use Markdown sparingly: short paragraphs,
lists and code blocks are fine. Several people may write in one conversation.
When a conversation phase is finished, or it grows long, you may call tape_handoff with a
summary; earlier messages then leave your context. Oversized tool output is stored aside:
read it with spill_read using the handle you were given."""

AGENTS_FILE = "AGENTS.md"
AGENTS_LIMIT = 20_000


def build_system_prompt(
    base: str | None, workspace: Path, tools: list[Tool], skills_dir: Path | None = None
) -> str:
    """`BUB_SYSTEM_PROMPT` (or the default), the workspace's AGENTS.md, the tool list, and
    the skills' names and descriptions when the `skill` tool is offered (`skills_dir`:
    BUB_SKILLS_DIR)."""
    parts = [base or DEFAULT_PROMPT]
    agents = workspace / AGENTS_FILE
    try:
        text = agents.read_text(encoding="utf-8", errors="replace")[:AGENTS_LIMIT]
    except OSError:
        text = ""
    if text.strip():
        parts.append(f"## Workspace instructions ({AGENTS_FILE})\n{text.strip()}")
    if tools:
        lines = [f"- {t.exposed_name}: {t.description.splitlines()[0]}" for t in tools]
        parts.append("## Tools\n" + "\n".join(lines))
    if any(t.name == "skill" for t in tools):
        listed = skills.prompt_section(skills.catalog(workspace, skills_dir))
        if listed:
            parts.append(listed)
    parts.append(f"Today is {datetime.now(UTC):%Y-%m-%d} (UTC).")
    return "\n\n".join(parts)
