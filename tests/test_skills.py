"""Skills: discovery in the workspace and BUB_SKILLS_DIR, the prompt's list, the skill tool
through the fake model, malformed files skipped, /skills, and symlinks refused."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from bub_bot.agent import ToolContext, default_registry
from bub_bot.agent.skills import SkillIndex, open_beneath
from bub_bot.config import ConfigError
from tests.fakes.openai_server import text, tool_calls
from tests.runtime_channel import idle, make_runtime

__all__ = ["make_runtime"]  # the fixture

SECRET = "TOP-SECRET-SKILL-OUTSIDE"


def write_skill(root: Path, folder: str, front: str, body: str = "") -> Path:
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\n{front}\n---\n{body}", encoding="utf-8")
    return path


@pytest.fixture
def operator_dir(tmp_path: Path) -> Path:
    """BUB_SKILLS_DIR with two skills, one of them also in the workspace."""
    root = tmp_path / "operator-skills"
    write_skill(
        root,
        "release",
        "name: release\ndescription: OPERATOR release steps",
        "OPERATOR-RELEASE-BODY",
    )
    write_skill(
        root,
        "pdf-tools",
        "name: pdf-tools\ndescription: >\n  Extract text from PDF files.\n  Use for PDFs.\n"
        "license: MIT\nmetadata:\n  author: ops\n  version: '1.0'\nallowed-tools: Read Bash",
        "Run references/extract.md's steps.\n",
    )
    (root / "pdf-tools" / "references").mkdir()
    (root / "pdf-tools" / "references" / "extract.md").write_text("EXTRACT-STEPS")
    return root


@pytest.fixture
def workspace_skills(workspace: Path) -> Path:
    root = workspace / "skills"
    write_skill(
        root,
        "release",
        'name: release\ndescription: "Cut a release: tag, changelog, publish."',
        "# Releasing\n\nWORKSPACE-RELEASE-BODY: run `make release`.\n",
    )
    write_skill(root, "résumé", "name: résumé\ndescription: Unicode names are lower-case too")
    (root / "notes.txt").write_text("not a skill")
    (root / "empty-folder").mkdir()
    return root


async def test_skills_listed_in_the_prompt_and_loaded_through_the_tool(
    fake_openai, agent, tape, operator_dir, workspace_skills
):
    fake_openai.script(
        tool_calls([("skill", {"name": "release"})]),
        tool_calls(
            [
                ("skill", {"name": "pdf-tools"}),
                ("skill", {"name": "pdf-tools", "file": "references/extract.md"}),
                ("skill", {"name": "pdf-tools", "file": "../release/SKILL.md"}),
                ("skill", {"name": "nope"}),
            ]
        ),
        text("done"),
    )
    bot = agent(skills_dir=operator_dir)
    result = await bot.run_turn(tape, [{"role": "user", "content": "release it"}])
    assert result.status == "ok"

    first, second, third = (r.body["messages"] for r in fake_openai.completion_requests())
    prompt = first[0]["content"]
    section = prompt[prompt.index("## Skills") :]
    assert "- pdf-tools: Extract text from PDF files. Use for PDFs." in section
    assert "- release: Cut a release: tag, changelog, publish." in section  # workspace wins
    assert "- résumé: Unicode names are lower-case too" in section
    for hidden in ("OPERATOR", "WORKSPACE-RELEASE-BODY", "notes.txt", "empty-folder"):
        assert hidden not in prompt

    loaded = next(m for m in second if m["role"] == "tool")["content"]
    assert loaded.startswith("Skill: release\nFolder: skills/release\nIt is in the workspace")
    assert loaded.endswith("# Releasing\n\nWORKSPACE-RELEASE-BODY: run `make release`.")

    body, extract, dotdot, unknown = [m["content"] for m in third if m["role"] == "tool"][1:]
    assert body.startswith("Skill: pdf-tools\nFolder: pdf-tools in the operator's skills")
    assert "skill(name='pdf-tools', file='<relative path>')" in body
    assert body.endswith("Run references/extract.md's steps.")
    assert extract == "EXTRACT-STEPS"
    assert dotdot == "error: '..' is not allowed in file: '../release/SKILL.md'"
    assert unknown == "error: no skill named 'nope' here. Skills: pdf-tools, release, résumé"
    assert "OPERATOR-RELEASE-BODY" not in json.dumps([r.body for r in fake_openai.requests])


async def test_no_skills_no_section_and_the_setting_is_checked(fake_openai, agent, tape, tmp_path):
    fake_openai.script(text("hi"))
    await agent().run_turn(tape, [{"role": "user", "content": "hi"}])
    assert "## Skills" not in fake_openai.last_messages()[0]["content"]
    with pytest.raises(ConfigError, match=r"BUB_SKILLS_DIR: .* is not a directory"):
        agent(skills_dir=tmp_path / "missing")


MALFORMED = {
    "no-front": ("no YAML front matter", "just text\n"),
    "unclosed": ("not closed by a --- line", "---\nname: unclosed\ndescription: x\n"),
    "bad-yaml": (
        "not valid YAML: ",  # libyaml's words or PyYAML's, then the line
        "---\nname: [bad-yaml\ndescription: x\n---\n",
    ),
    "a-list": ("must be a mapping", "---\n- name\n- description\n---\n"),
    "no-name": ("name is missing", "---\ndescription: x\n---\n"),
    "Upper": ("must be lower-case", "---\nname: Upper\ndescription: x\n---\n"),
    "double--dash": ("single hyphens", "---\nname: double--dash\ndescription: x\n---\n"),
    "other-folder": ("differs from its folder", "---\nname: elsewhere\ndescription: x\n---\n"),
    "no-description": ("description is missing", "---\nname: no-description\n---\n"),
    "long-description": (
        "longer than 1024",
        "---\nname: long-description\ndescription: " + "x" * 1025 + "\n---\n",
    ),
    "bad-metadata": (
        "metadata must be a mapping",
        "---\nname: bad-metadata\ndescription: x\nmetadata: 3\n---\n",
    ),
    "not-utf8": ("not UTF-8", None),
    "too-big": (
        "larger than 262144 bytes",
        "---\nname: too-big\ndescription: x\n---\n" + "x" * 262_144,
    ),
}


async def test_malformed_skills_are_skipped_with_a_log_line(
    fake_openai, agent, tape, workspace, caplog
):
    root = workspace / "skills"
    write_skill(root, "good", "name: good\ndescription: The one that works")
    for folder, (_reason, content) in MALFORMED.items():
        (root / folder).mkdir(parents=True)
        data = content.encode() if content is not None else b"---\nname: not-utf8\n\xff\n---\n"
        (root / folder / "SKILL.md").write_bytes(data)
    caplog.set_level(logging.WARNING, logger="bub_bot.agent.skills")
    fake_openai.script(text("one"), text("two"))
    bot = agent()
    for line in ("one", "two"):
        result = await bot.run_turn(tape, [{"role": "user", "content": line}])
        assert result.status == "ok"
    prompt = fake_openai.last_messages()[0]["content"]
    section = prompt[prompt.index("## Skills") :]
    assert section.count("\n- ") == 1 and "- good: The one that works" in section
    skipped = [r.getMessage() for r in caplog.records if "skill.skipped" in r.getMessage()]
    assert len(skipped) == len(MALFORMED)  # once each, not at every step
    for folder, (reason, _content) in MALFORMED.items():
        line = next(m for m in skipped if f"/{folder}/SKILL.md" in m)
        assert f"file={root / folder / 'SKILL.md'} in=workspace: " in line and reason in line
    assert next(m for m in skipped if "/bad-yaml/" in m).endswith(" at line 3")

    # Fixing a file is seen at the next step, without a restart.
    write_skill(root, "no-description", "name: no-description\ndescription: Fixed now")
    os.utime(root / "no-description" / "SKILL.md", ns=(1, 1))  # a different stat, surely
    fake_openai.script(text("three"))
    await bot.run_turn(tape, [{"role": "user", "content": "three"}])
    assert "- no-description: Fixed now" in fake_openai.last_messages()[0]["content"]


async def test_symlinks_out_of_the_skills_folder_are_refused(
    tmp_path, workspace, settings, tape, caplog
):
    outside = tmp_path / "outside"
    write_skill(outside, "evil", "name: evil\ndescription: " + SECRET, SECRET)
    write_skill(outside, "linked-file", "name: linked-file\ndescription: " + SECRET, SECRET)
    (outside / "secret.md").write_text(SECRET)
    root = workspace / "skills"
    root.mkdir()
    os.symlink(outside / "evil", root / "evil")  # a folder that is a link
    (root / "linked-file").mkdir()
    os.symlink(outside / "linked-file" / "SKILL.md", root / "linked-file" / "SKILL.md")
    ok = write_skill(root, "ok", "name: ok\ndescription: fine")
    os.symlink(outside / "secret.md", ok.parent / "notes.md")
    os.mkfifo(root / "ok" / "pipe.md")
    caplog.set_level(logging.WARNING, logger="bub_bot.agent.skills")

    found = SkillIndex().catalog(workspace)
    assert [s.name for s in found.skills] == ["ok"]
    reasons = {Path(s.file).parent.name: s.reason for s in found.skipped}
    assert set(reasons) == {"evil", "linked-file"}
    assert all("symlink" in r for r in reasons.values())
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert str(root / "linked-file" / "SKILL.md") in logged and SECRET not in logged

    ctx = ToolContext(tape=tape, workspace=workspace, settings=settings())
    registry = default_registry()
    for args, expected in [
        ({"name": "evil"}, "error: no skill named 'evil' here. Skills: ok"),
        ({"name": "ok", "file": "notes.md"}, "a symlink or a non-directory is on its path"),
        ({"name": "ok", "file": "pipe.md"}, "not a regular file"),
        ({"name": "ok", "file": "/etc/passwd"}, "file must be a path relative"),
        ({"name": "ok", "file": ".env"}, "may hold secrets"),
    ]:
        done, result = await registry.call(ctx, "skill", json.dumps(args))
        assert not done and expected in result and SECRET not in result

    # The skills folder itself as a link: refused whole.
    other = tmp_path / "ws2"
    other.mkdir()
    os.symlink(outside, other / "skills")
    linked = SkillIndex().catalog(other)
    assert linked.skills == () and "symlink" in linked.skipped[0].reason


def test_open_beneath_follows_no_link(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    os.symlink(tmp_path / "a", tmp_path / "link")
    fd = open_beneath(tmp_path, ("a", "f"))
    os.close(fd)
    for parts in (("link", "f"), ("a", "..", "a", "f"), ("a",)):
        with pytest.raises(OSError):
            os.close(open_beneath(tmp_path, parts))


async def test_skills_command(make_runtime, fake_openai, workspace, operator_dir, workspace_skills):
    (workspace_skills / "broken").mkdir()
    (workspace_skills / "broken" / "SKILL.md").write_text("no front matter")
    runtime, channel = make_runtime(skills_dir=operator_dir, openai_api_key="sk-hidden-12345")
    write_skill(workspace_skills, "leaky", "name: leaky\ndescription: key sk-hidden-12345")
    for line in ("/skills", "/skills now", "/help"):
        await channel.say(line, "a")
        await idle(runtime, "test:a")
    listing, usage, help_text = channel.texts("a")
    assert listing.splitlines() == [
        "Skills (4):",
        "- leaky — key [redacted] [skills/leaky]",
        "- pdf-tools — Extract text from PDF files. Use for PDFs. [pdf-tools in the operator's"
        " skills directory (BUB_SKILLS_DIR)]",
        "- release — Cut a release: tag, changelog, publish. [skills/release]",
        "- résumé — Unicode names are lower-case too [skills/résumé]",
        "",
        "Skipped (1):",
        f"- {workspace_skills / 'broken' / 'SKILL.md'} — no YAML front matter (the file must"
        " start with a --- line)",
    ]
    assert (
        usage
        == "skills takes no arguments. Usage: /skills — the skills the model can load here, and SKILL.md files skipped"
    )
    assert "/skills — the skills the model can load here" in help_text
    assert fake_openai.completion_requests() == []


async def test_skills_command_without_skills(make_runtime):
    runtime, channel = make_runtime()
    await channel.say("/skills", "a")
    await idle(runtime, "test:a")
    assert channel.texts("a")[0].startswith("No skills here. A skill is a folder skills/<name>/")
