"""The system prompt, built for every model call (never stored on the tape).

Building it reads the workspace's AGENTS.md and lists the skills, at every step of every
turn; `PromptCache` keeps the built text per workspace, keyed by what it depends on (the
settings, the tools, the stat of AGENTS.md, the skill catalog, itself cached by stats), so
an unchanged workspace costs a few stats per call and an edit is seen at the next step.
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path

from ..beneath import open_beneath
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
CACHED_WORKSPACES = 512


class PromptCache:
    """Built system prompts (without the date line) per workspace, LRU-bounded.

    `reads` counts the reads of an AGENTS.md and `builds` the prompts built (a call that
    finds its key unchanged does neither): figures for tests and benchmarks."""

    def __init__(self, size: int = CACHED_WORKSPACES) -> None:
        self._size = size
        self._built: OrderedDict[str, tuple[tuple[object, ...], str]] = OrderedDict()
        self.reads = 0
        self.builds = 0

    def prompt(
        self, base: str | None, workspace: Path, tools: list[Tool], skills_dir: Path | None
    ) -> str:
        """The prompt of `build_system_prompt` but its date line, from the cache while
        nothing it depends on changed."""
        where = str(workspace)
        agents = os.path.join(where, AGENTS_FILE)
        try:
            # Not followed: a symlink (or a hard link) the model's commands made in its
            # workspace must not carry a file from outside into the prompt (`_read_agents`).
            info = os.lstat(agents)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise OSError
            stat_key: tuple[int, ...] | None = (
                info.st_dev,
                info.st_ino,
                info.st_mtime_ns,
                info.st_ctime_ns,
                info.st_size,
            )
        except OSError:
            stat_key = None
        tool_key = tuple((t.exposed_name, t.description) for t in tools)
        found = None
        if any(t.name == "skill" for t in tools):
            found = skills.catalog(workspace, skills_dir).skills
        key = (base, stat_key, tool_key, skills_dir, found)
        cached = self._built.get(where)
        if cached is not None and cached[0] == key:
            self._built.move_to_end(where)
            return cached[1]
        text = self._build(base, agents if stat_key is not None else None, tools, found)
        self._built[where] = (key, text)
        self._built.move_to_end(where)
        while len(self._built) > self._size:
            self._built.popitem(last=False)
        return text

    def _build(
        self,
        base: str | None,
        agents: str | None,
        tools: list[Tool],
        found: tuple[skills.Skill, ...] | None,
    ) -> str:
        self.builds += 1
        parts = [base or DEFAULT_PROMPT]
        text = ""
        if agents is not None:
            self.reads += 1
            text = _read_agents(agents)
        if text.strip():
            parts.append(f"## Workspace instructions ({AGENTS_FILE})\n{text.strip()}")
        if tools:
            lines = [f"- {t.exposed_name}: {t.description.splitlines()[0]}" for t in tools]
            parts.append("## Tools\n" + "\n".join(lines))
        if found:
            listed = skills.prompt_section(skills.Catalog(found))
            if listed:
                parts.append(listed)
        return "\n\n".join(parts)


def _read_agents(path: str) -> str:
    """The text of the workspace's AGENTS.md at `path` (up to AGENTS_LIMIT characters), opened
    beneath the workspace: never through a symlink, only a regular file with one link; "" when
    it is not such a file."""
    where, name = os.path.split(path)
    try:
        root = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = open_beneath(root, (name,), os.O_RDONLY | os.O_NONBLOCK)
        finally:
            os.close(root)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            return ""
        return file.read(AGENTS_LIMIT * 4).decode("utf-8", errors="replace")[:AGENTS_LIMIT]


PROMPTS = PromptCache()
"""The process's prompt cache (the loop and the web viewer share it)."""


def build_system_prompt(
    base: str | None,
    workspace: Path,
    tools: list[Tool],
    skills_dir: Path | None = None,
    cache: PromptCache | None = None,
) -> str:
    """`BUB_SYSTEM_PROMPT` (or the default), the workspace's AGENTS.md, the tool list, and
    the skills' names and descriptions when the `skill` tool is offered (`skills_dir`:
    BUB_SKILLS_DIR), and today's date; built once per change (`cache`, default `PROMPTS`)."""
    body = (cache or PROMPTS).prompt(base, workspace, tools, skills_dir)
    return f"{body}\n\nToday is {datetime.now(UTC):%Y-%m-%d} (UTC)."
