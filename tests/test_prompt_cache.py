"""The system prompt's cache: an unchanged workspace is read once, an edit of AGENTS.md or a
new skill is seen at the next call (real files; the cache's own counters, nothing patched)."""

from __future__ import annotations

import os
from pathlib import Path

from bub_bot.agent import default_registry
from bub_bot.agent.prompt import PromptCache, build_system_prompt
from bub_bot.agent.tools import Tool


def tools_with_skill(workspace: Path) -> list[Tool]:
    tools = default_registry().visible(workspace)
    assert any(t.name == "skill" for t in tools)
    return tools


def write_skill(workspace: Path, name: str, description: str) -> None:
    path = workspace / "skills" / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\n---\nbody", "utf-8")


def test_an_unchanged_workspace_reads_agents_md_once(workspace: Path) -> None:
    (workspace / "AGENTS.md").write_text("RULES-ONE", encoding="utf-8")
    write_skill(workspace, "release", "Cut a release.")
    tools, cache = tools_with_skill(workspace), PromptCache()
    prompts = {build_system_prompt(None, workspace, tools, cache=cache) for _ in range(20)}
    assert len(prompts) == 1
    (prompt,) = prompts
    assert "RULES-ONE" in prompt and "- release: Cut a release." in prompt
    assert prompt.rstrip().endswith("(UTC).")  # the date line is still there
    assert (cache.reads, cache.builds) == (1, 1)


def test_an_edit_of_agents_md_is_seen_at_the_next_call(workspace: Path) -> None:
    agents = workspace / "AGENTS.md"
    agents.write_text("RULES-ONE", encoding="utf-8")
    tools, cache = tools_with_skill(workspace), PromptCache()
    assert "RULES-ONE" in build_system_prompt(None, workspace, tools, cache=cache)
    agents.write_text("RULES-TWO", encoding="utf-8")  # same size: the stat still differs
    os.utime(agents, ns=(0, agents.stat().st_mtime_ns + 1))
    second = build_system_prompt(None, workspace, tools, cache=cache)
    assert "RULES-TWO" in second and "RULES-ONE" not in second
    agents.unlink()
    assert "RULES-TWO" not in build_system_prompt(None, workspace, tools, cache=cache)
    assert cache.builds == 3


def test_a_new_skill_and_other_settings_are_seen(workspace: Path, tmp_path: Path) -> None:
    tools, cache = tools_with_skill(workspace), PromptCache()
    first = build_system_prompt(None, workspace, tools, cache=cache)
    assert "## Skills" not in first
    write_skill(workspace, "release", "Cut a release.")
    assert "- release: Cut a release." in build_system_prompt(None, workspace, tools, cache=cache)
    assert build_system_prompt("CUSTOM BASE", workspace, tools, cache=cache).startswith(
        "CUSTOM BASE"
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "AGENTS.md").write_text("OTHER RULES", encoding="utf-8")
    assert "OTHER RULES" in build_system_prompt(None, other, tools, cache=cache)
    without_skill = [t for t in tools if t.name != "skill"]
    assert "## Skills" not in build_system_prompt(None, workspace, without_skill, cache=cache)
    assert cache.builds == 5


def test_agents_md_is_never_read_through_a_symlink_or_a_hard_link(
    workspace: Path, tmp_path: Path
) -> None:
    """A command in the workspace can make AGENTS.md a link to a file outside (a secret the
    bot can read and the sandbox cannot): the prompt never carries that file's text."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("TOP-SECRET-TEXT", encoding="utf-8")
    agents = workspace / "AGENTS.md"
    tools, cache = tools_with_skill(workspace), PromptCache()

    agents.symlink_to(secret)
    assert "TOP-SECRET-TEXT" not in build_system_prompt(None, workspace, tools, cache=cache)
    agents.unlink()
    os.link(secret, agents)
    assert "TOP-SECRET-TEXT" not in build_system_prompt(None, workspace, tools, cache=cache)
    agents.unlink()
    agents.write_text("OWN-RULES", encoding="utf-8")  # a plain file is read
    assert "OWN-RULES" in build_system_prompt(None, workspace, tools, cache=cache)
