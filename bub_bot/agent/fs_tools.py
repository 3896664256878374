"""The file tools: fs.list, fs.read, fs.write, fs.edit — all through `workspace_files`
(confined beneath the session's workspace, secret files and bub-bot's own data refused)."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from ..secrets import Scrubber
from . import workspace_files as wf
from .tools import ToolContext, ToolError, ToolRegistry

if TYPE_CHECKING:
    from ..config import Settings

FS_READ_DEFAULT = 20_000
FS_READ_LIMIT = 256 * 1024
"""At most this many characters per fs.read: a 200 KB file fits one call (and is spilled)."""
COUNT_CHARS_UP_TO = 8 * 1024 * 1024
"""Files up to this size get their exact character count in a partial read's note."""
BINARY_SNIFF = 8192


def file_policy(settings: Settings) -> wf.FilePolicy:
    """The operator's file policy: BUB_HOME and the tape database (with its journals) are
    never opened; hard links as BUB_FS_ALLOW_HARDLINKS says."""
    protected = [Path(os.path.realpath(settings.home.expanduser()))]
    database = settings.database_path
    if "://" not in database:
        db = Path(os.path.realpath(Path(database).expanduser()))
        protected += [db.with_name(db.name + s) for s in ("", "-wal", "-shm", "-journal")]
    return wf.FilePolicy(tuple(protected), allow_hardlinks=settings.fs_allow_hardlinks)


def _scrubber(ctx: ToolContext) -> Scrubber:
    return ctx.scrubber if ctx.scrubber is not None else Scrubber.for_settings(ctx.settings)


def _read_text(
    opened: wf.Opened, name: str, offset: int, limit: int, scrub: Scrubber
) -> tuple[str, int, bool, int, int | None]:
    """Characters `offset`..`offset+limit` of the UTF-8 file open as `opened`, line
    endings kept, secrets replaced (also one that starts before the page or ends after it).

    Returns (text, characters read, whether more follows, size in bytes, total characters
    or None when the file is too big to count cheaply). Reads from the descriptor that was
    checked, no further than needed (except to count a file up to COUNT_CHARS_UP_TO bytes).
    """
    margin = max(scrub.longest - 1, 0)
    with os.fdopen(opened.fd, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        if b"\0" in raw.read(BINARY_SNIFF):
            raise ToolError(f"{name!r} is a binary file ({size} bytes); fs_read reads text")
        raw.seek(0)
        f = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        skipped, before = 0, ""
        while skipped < offset:
            piece = f.read(min(offset - skipped, 1 << 20))
            if not piece:
                break
            skipped += len(piece)
            before = (before + piece)[-margin:] if margin else ""
        text = f.read(limit)
        if offset and not text:
            raise ToolError(
                f"offset {offset} is at or past the end of {name!r} ({skipped} characters)"
            )
        after = f.read(max(margin, 1))
        more = after != ""
        total: int | None = None
        if more and size <= COUNT_CHARS_UP_TO:
            total = offset + len(text) + len(after) + len(f.read())
        f.detach()
    read = len(text)
    if scrub:
        text = scrub.text_in(text, before, after)
    return text, read, more, size, total


def _read_page(
    root: Path, path: str, offset: int, limit: int, policy: wf.FilePolicy, scrub: Scrubber
) -> tuple[str, int, bool, int, int | None]:
    try:
        opened = wf.open_file(root, path, policy)
    except wf.WorkspaceError as exc:
        raise ToolError(str(exc)) from None
    return _read_text(opened, path, offset, limit, scrub)


def _edit(
    root: Path,
    path: str,
    old: str,
    new: str,
    replace_all: bool,
    max_bytes: int,
    policy: wf.FilePolicy,
) -> str:
    data = wf.read_file(root, path, max_bytes, policy)
    if b"\0" in data[:BINARY_SNIFF]:
        raise ToolError(f"{path!r} is a binary file; fs_edit edits text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path!r} is not UTF-8 text; fs_edit edits text") from None
    count = text.count(old)
    if count == 0:
        raise ToolError(f"`old` was found 0 times in {path!r}; nothing changed")
    if count > 1 and not replace_all:
        raise ToolError(
            f"`old` was found {count} times in {path!r}; nothing changed (give more context"
            " so it is found once, or set replace_all=true)"
        )
    result = text.replace(old, new).encode("utf-8")
    if len(result) > max_bytes:
        raise ToolError(f"the edited {path!r} would be larger than {max_bytes} bytes")
    wf.write_file_atomic(root, path, result, policy)
    times = "1 occurrence" if count == 1 else f"{count} occurrences"
    return f"edited {path!r}: replaced {times} ({len(result)} bytes)"


def register_fs_tools(registry: ToolRegistry) -> ToolRegistry:
    """Add fs.list, fs.read, fs.write and fs.edit to `registry`."""

    @registry.tool("fs.list")
    async def fs_list(ctx: ToolContext, path: str = ".") -> list[str]:
        """List a directory of the workspace (directories end with /)."""
        policy = file_policy(ctx.settings)
        try:
            return await asyncio.to_thread(wf.list_dir, ctx.workspace, path, policy)
        except wf.WorkspaceError as exc:
            raise ToolError(str(exc)) from None

    @registry.tool("fs.read")
    async def fs_read(
        ctx: ToolContext,
        path: str,
        offset: Annotated[int, Field(ge=0, description="first character to read")] = 0,
        limit: Annotated[
            int, Field(ge=1, le=FS_READ_LIMIT, description="how many characters")
        ] = FS_READ_DEFAULT,
    ) -> str:
        """Read a text file of the workspace, `limit` characters from `offset`. When the file goes on, the result ends with a note giving its size and the offset to continue from."""
        text, read, more, size, total = await asyncio.to_thread(
            _read_page,
            ctx.workspace,
            path,
            offset,
            limit,
            file_policy(ctx.settings),
            _scrubber(ctx),
        )
        if not more:
            return text  # the whole rest of the file, exactly
        end = offset + read
        of = f"{total} ({size} bytes)" if total is not None else f"a {size}-byte file"
        return (
            f"{text}\n\n[fs_read stopped before the end of {path!r}: this is characters"
            f" {offset}-{end} of {of}. Continue with fs_read(path={path!r}, offset={end})]"
        )

    @registry.tool("fs.write")
    async def fs_write(
        ctx: ToolContext,
        path: Annotated[str, Field(description="file path relative to the workspace")],
        content: Annotated[str, Field(description="the whole new content (UTF-8 text)")],
    ) -> str:
        """Create or replace a text file in the workspace (missing parent directories are created). The write is atomic."""
        data = content.encode("utf-8")
        cap = ctx.settings.fs_write_max_bytes
        if len(data) > cap:
            raise ToolError(
                f"content is {len(data)} bytes, more than BUB_FS_WRITE_MAX_BYTES ({cap});"
                " nothing written"
            )
        policy = file_policy(ctx.settings)
        try:
            size = await asyncio.to_thread(wf.write_file_atomic, ctx.workspace, path, data, policy)
        except wf.WorkspaceError as exc:
            raise ToolError(str(exc)) from None
        return f"wrote {size} bytes to {path!r}"

    @registry.tool("fs.edit")
    async def fs_edit(
        ctx: ToolContext,
        path: Annotated[str, Field(description="file path relative to the workspace")],
        old: Annotated[str, Field(min_length=1, description="exact text to replace")],
        new: Annotated[str, Field(description="the replacement text")],
        replace_all: bool = False,
    ) -> str:
        """Replace `old` with `new` in a workspace file. `old` must occur exactly once unless replace_all is true; otherwise nothing changes and the result says how many times it was found."""
        policy = file_policy(ctx.settings)
        cap = ctx.settings.fs_write_max_bytes
        try:
            return await asyncio.to_thread(
                _edit, ctx.workspace, path, old, new, replace_all, cap, policy
            )
        except wf.WorkspaceError as exc:
            raise ToolError(str(exc)) from None

    return registry


__all__ = ["FS_READ_DEFAULT", "FS_READ_LIMIT", "file_policy", "register_fs_tools"]
