"""Skills: Agent Skills folders the model loads on demand.

A skill is a folder `<name>/SKILL.md`: YAML front matter (`name`, `description`, optional
`license`, `compatibility`, `metadata`, `allowed-tools`) and a Markdown body. They are
looked up in `<workspace>/skills/` and in `BUB_SKILLS_DIR` (operator-wide); the workspace's
wins a name clash. The system prompt lists names and descriptions only; the `skill` tool
returns a body (and reads files beside it). A malformed SKILL.md is skipped with one log
line naming the file.

Nothing beneath a skills root is reached through a symlink (a command may plant one in the
workspace): see `open_beneath`. Discovery runs at every model step, so it is cached: one
stat of each root and of each SKILL.md per step; a file is read and parsed again only when
its stat changes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import unicodedata
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import yaml
from pydantic import Field

from .. import beneath
from ..secrets import secret_path_match
from .tools import ToolContext, ToolError, ToolRegistry

log = logging.getLogger(__name__)

WORKSPACE_DIR = "skills"
SKILL_FILE = "SKILL.md"
MAX_FILE_BYTES = 256 * 1024
NAME_MAX = 64
DESCRIPTION_MAX = 1024
COMPATIBILITY_MAX = 500
PROMPT_CHARS = 12_000
"""The skills section of the system prompt stops growing here (names still reachable)."""
CACHED_ROOTS = 512
# safe_load's loader, in C when PyYAML has libyaml (about 10 times faster): plain data only.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def open_beneath(root: Path, parts: Sequence[str], *, directory: bool = False) -> int:
    """A file descriptor of `root/parts...`, following no symlink beneath `root`
    (bub_bot/beneath.py: a symlink anywhere below `root` fails instead of leading
    elsewhere); the last must be a directory (`directory`) or a regular file (else OSError
    EINVAL). `root` itself is the operator's path and may contain symlinks. The caller
    closes the descriptor."""
    base = os.open(root, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    try:
        flags = os.O_RDONLY | (os.O_DIRECTORY if directory else os.O_NONBLOCK)
        fd = beneath.open_beneath(base, parts, flags)
    finally:
        os.close(base)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)):
            raise OSError(errno.EINVAL, "not a regular file")
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_beneath(root: Path, parts: Sequence[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file `root/parts...` (no symlink followed beneath `root`);
    OSError as `open_beneath` raises it, or EFBIG past `limit` bytes."""
    fd = open_beneath(root, parts)
    try:
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Skill:
    """A valid skill: its name, description, and where its folder is (the body is read
    when the model loads it: the cache holds no bodies)."""

    name: str
    description: str
    base: Path
    """The root the skill was found under (the workspace, or BUB_SKILLS_DIR)."""
    parts: tuple[str, ...]
    """The folder beneath `base` (`("skills", name)` in a workspace, `(name,)` else)."""
    operator: bool
    """Found in BUB_SKILLS_DIR (outside the workspace)."""

    @property
    def where(self) -> str:
        """The folder as the model and /skills show it."""
        if self.operator:
            return f"{self.name} in the operator's skills directory (BUB_SKILLS_DIR)"
        return "/".join(self.parts)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A SKILL.md that was not used, and why."""

    file: str
    reason: str


@dataclass(frozen=True, slots=True)
class Catalog:
    """The skills of one workspace (sorted by name) and the files skipped."""

    skills: tuple[Skill, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    def get(self, name: str) -> Skill | None:
        wanted = unicodedata.normalize("NFKC", name.strip())
        return next((s for s in self.skills if s.name == wanted), None)


def parse_skill(text: str, folder: str) -> tuple[str, str, str]:
    """(name, description, body) of a SKILL.md in folder `folder`; ValueError says what
    is wrong, as the Agent Skills specification has it."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        raise ValueError("no YAML front matter (the file must start with a --- line)")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        raise ValueError("the front matter is not closed by a --- line")
    try:
        meta = yaml.load("".join(lines[1:end]), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        detail = _one_line(str(exc))
        mark = getattr(exc, "problem_mark", None)
        if getattr(exc, "problem", None) and mark is not None:
            detail = f"{exc.problem} at line {mark.line + 2}"  # type: ignore[attr-defined]
        raise ValueError(f"the front matter is not valid YAML: {detail}") from None
    if not isinstance(meta, dict):
        raise ValueError("the front matter must be a mapping with name and description")
    name = meta.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name is missing (a non-empty string)")
    name = unicodedata.normalize("NFKC", name.strip())
    if len(name) > NAME_MAX:
        raise ValueError(f"name is longer than {NAME_MAX} characters")
    if (
        name != name.lower()
        or not all(c.isalnum() or c == "-" for c in name)
        or name.startswith("-")
        or name.endswith("-")
        or "--" in name
    ):
        raise ValueError(
            f"name {name!r} must be lower-case letters, digits and single hyphens (not at"
            " either end)"
        )
    if name != unicodedata.normalize("NFKC", folder):
        raise ValueError(f"name {name!r} differs from its folder's name {folder!r}")
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("description is missing (a non-empty string)")
    description = description.strip()
    if len(description) > DESCRIPTION_MAX:
        raise ValueError(f"description is longer than {DESCRIPTION_MAX} characters")
    compatibility = meta.get("compatibility")
    if compatibility is not None and (
        not isinstance(compatibility, str) or not 1 <= len(compatibility) <= COMPATIBILITY_MAX
    ):
        raise ValueError(f"compatibility must be a string of 1-{COMPATIBILITY_MAX} characters")
    if "metadata" in meta and not isinstance(meta["metadata"], dict):
        raise ValueError("metadata must be a mapping")
    tools = meta.get("allowed-tools")
    if tools is not None and not (
        isinstance(tools, str)
        or (isinstance(tools, list) and all(isinstance(t, str) for t in tools))
    ):
        raise ValueError("allowed-tools must be a string or a list of strings")
    return name, description, "".join(lines[end + 1 :]).strip("\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(slots=True)
class _Root:
    key: tuple[int, int, int]
    names: list[str]


class SkillIndex:
    """Finds the skills of a workspace, cached by the stat of each root and SKILL.md."""

    def __init__(self) -> None:
        self._roots: OrderedDict[str, _Root] = OrderedDict()
        self._files: OrderedDict[str, tuple[tuple[int, ...], Skill | Skipped]] = OrderedDict()

    def catalog(self, workspace: Path, operator_dir: Path | None = None) -> Catalog:
        """The skills of `workspace`: its `skills/` first, then `operator_dir`'s."""
        found: dict[str, Skill] = {}
        skipped: list[Skipped] = []
        roots = [(workspace, (WORKSPACE_DIR,), False)]
        if operator_dir is not None:
            roots.append((operator_dir.expanduser(), (), True))
        for base, parts, operator in roots:
            for item in self._scan(base, parts, operator):
                if isinstance(item, Skipped):
                    skipped.append(item)
                elif item.name not in found:  # the workspace's comes first and wins
                    found[item.name] = item
        skills = tuple(sorted(found.values(), key=lambda s: s.name))
        return Catalog(skills, tuple(skipped))

    def _scan(self, base: Path, parts: tuple[str, ...], operator: bool) -> list[Skill | Skipped]:
        shown_root = base.joinpath(*parts)
        try:
            fd = open_beneath(base, parts, directory=True)
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [self._note(str(shown_root), (-1,), _why(exc), operator=operator)]
        try:
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino, info.st_mtime_ns)
            root = self._roots.get(str(shown_root))
            if root is None or root.key != key:
                names = sorted(n for n in os.listdir(fd) if not n.startswith("."))
                root = _Root(key, names)
            self._remember(self._roots, str(shown_root), root)
            items: list[Skill | Skipped] = []
            shown = str(shown_root)
            for name in root.names:
                item = self._skill(fd, base, parts, name, operator, shown)
                if item is not None:
                    items.append(item)
            return items
        finally:
            os.close(fd)

    def _skill(
        self,
        root_fd: int,
        base: Path,
        parts: tuple[str, ...],
        name: str,
        operator: bool,
        root: str,
    ) -> Skill | Skipped | None:
        """The skill in folder `name`, from the cache while its SKILL.md is unchanged."""
        shown = f"{root}/{name}/{SKILL_FILE}"
        try:
            info = os.stat(f"{name}/{SKILL_FILE}", dir_fd=root_fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            try:  # a folder without SKILL.md is not a skill; a symlinked folder is refused
                if stat.S_ISLNK(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode):
                    return self._note(shown, (-2,), "the folder is a symlink", operator=operator)
            except OSError:
                pass
            return None
        except OSError as exc:
            return self._note(shown, (-3,), _why(exc), operator=operator)
        key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
        cached = self._files.get(shown)
        if cached is not None and cached[0] == key:
            self._files.move_to_end(shown)
            return cached[1]
        try:
            skill_name, description, _body = load(base, (*parts, name))
        except (OSError, ValueError) as exc:
            reason = _why(exc) if isinstance(exc, OSError) else str(exc)
            return self._note(shown, key, reason, operator=operator)
        skill = Skill(skill_name, description, base, (*parts, name), operator)
        self._remember(self._files, shown, (key, skill))
        return skill

    def _note(self, file: str, key: tuple[int, ...], reason: str, *, operator: bool) -> Skipped:
        """A skipped file, logged once per change of the file (not at every step)."""
        cached = self._files.get(file)
        if cached is not None and cached[0] == key and isinstance(cached[1], Skipped):
            return cached[1]
        skipped = Skipped(file, reason)
        where = "BUB_SKILLS_DIR" if operator else "workspace"
        log.warning("skill.skipped file=%s in=%s: %s", file, where, reason)
        self._remember(self._files, file, (key, skipped))
        return skipped

    @staticmethod
    def _remember(cache: OrderedDict[str, Any], key: str, value: Any) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > CACHED_ROOTS * 4:
            cache.popitem(last=False)


def load(base: Path, folder: tuple[str, ...]) -> tuple[str, str, str]:
    """(name, description, body) of the SKILL.md in `folder` beneath `base`; OSError when
    it cannot be read safely, ValueError when it is malformed."""
    data = read_beneath(base, (*folder, SKILL_FILE))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    return parse_skill(text, folder[-1])


def _why(exc: OSError) -> str:
    if exc.errno == errno.EFBIG:
        return exc.strerror or "too large"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symlink or a non-directory is on its path (links are not followed here)"
    if exc.errno == errno.EINVAL:
        return "not a regular file"
    return exc.strerror or str(exc)


INDEX = SkillIndex()
"""The process's skill index (the tool, the system prompt and /skills share its cache)."""


def catalog(workspace: Path, operator_dir: Path | None = None) -> Catalog:
    """The skills of `workspace` (see SkillIndex.catalog)."""
    return INDEX.catalog(workspace, operator_dir)


def prompt_section(found: Catalog) -> str:
    """The system prompt's list of skills: name and description only, bounded."""
    if not found.skills:
        return ""
    lines = [
        "## Skills",
        "Skills hold instructions for particular tasks. When one fits the request, load it"
        " with the skill tool first and follow it.",
    ]
    used = sum(len(line) for line in lines)
    for index, skill in enumerate(found.skills):
        line = f"- {skill.name}: {_one_line(skill.description)}"
        if used + len(line) > PROMPT_CHARS:
            rest = len(found.skills) - index
            lines.append(f"- … and {rest} more (calling skill with an unknown name lists them)")
            break
        lines.append(line)
        used += len(line)
    return "\n".join(lines)


def _header(skill: Skill) -> str:
    if skill.operator:
        reach = (
            "It is outside the workspace: read files beside SKILL.md with skill(name="
            f"{skill.name!r}, file='<relative path>'); fs tools and commands cannot reach them."
        )
    else:
        reach = (
            "It is in the workspace: fs_read and fs_list reach its files, and commands see"
            " them at this path relative to the working directory."
        )
    return f"Skill: {skill.name}\nFolder: {skill.where}\n{reach}"


def _file_parts(file: str) -> tuple[str, ...]:
    path = PurePosixPath(file)
    if path.is_absolute() or not path.parts:
        raise ToolError(f"file must be a path relative to the skill's folder: {file!r}")
    if ".." in path.parts:
        raise ToolError(f"'..' is not allowed in file: {file!r}")
    pattern = secret_path_match(path)
    if pattern is not None:
        raise ToolError(f"refused: {file!r} may hold secrets (it matches {pattern!r})")
    return tuple(p for p in path.parts if p != ".")


def register_skills(registry: ToolRegistry, index: SkillIndex | None = None) -> None:
    """Add the `skill` tool to `registry`."""

    @registry.tool("skill")
    async def skill(
        ctx: ToolContext,
        name: Annotated[str, Field(min_length=1, max_length=200, description="the skill's name")],
        file: Annotated[
            str | None,
            Field(
                description="a file in the skill's folder to read instead (e.g. references/x.md)"
            ),
        ] = None,
    ) -> str:
        """Load a skill's instructions by name (the skills are listed in the system prompt); with file, read a file in the skill's folder."""
        found = (index or INDEX).catalog(ctx.workspace, ctx.settings.skills_dir)
        chosen = found.get(name)
        if chosen is None:
            known = ", ".join(s.name for s in found.skills[:200]) or "none"
            raise ToolError(f"no skill named {name!r} here. Skills: {known}")
        if file is None:
            try:
                body = load(chosen.base, chosen.parts)[2]
            except (OSError, ValueError) as exc:  # changed since the catalog was read
                reason = _why(exc) if isinstance(exc, OSError) else str(exc)
                raise ToolError(f"cannot load skill {chosen.name!r}: {reason}") from None
            return f"{_header(chosen)}\n\n{body}"
        parts = _file_parts(file)
        try:
            data = read_beneath(chosen.base, (*chosen.parts, *parts))
        except FileNotFoundError:
            raise ToolError(f"no file {file!r} in skill {chosen.name!r}") from None
        except OSError as exc:
            raise ToolError(f"cannot read {file!r} of skill {chosen.name!r}: {_why(exc)}") from None
        if b"\0" in data[:8192]:
            raise ToolError(f"{file!r} is a binary file; skill reads text files")
        return data.decode("utf-8", errors="replace")


__all__ = [
    "INDEX",
    "Catalog",
    "Skill",
    "SkillIndex",
    "Skipped",
    "catalog",
    "load",
    "open_beneath",
    "parse_skill",
    "prompt_section",
    "read_beneath",
    "register_skills",
]
