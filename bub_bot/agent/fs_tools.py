"""The workspace file tools: fs.list, fs.read, fs.write, fs.edit.

Every one goes through `WorkspaceFiles` (bub_bot/workspace_files.py): the same confinement
and refusals for reading and writing, and files opened beneath the workspace without
following a symlink that appeared after the check.
"""

from __future__ import annotations

import asyncio
import io
from typing import Annotated

from pydantic import Field

from ..secrets import Scrubber
from ..workspace_files import FileRefused, WorkspaceFiles
from .tools import ToolContext, ToolError, ToolRegistry

FS_READ_DEFAULT = 20_000
FS_READ_LIMIT = 256 * 1024
"""At most this many characters per fs.read: a 200 KB file fits one call (and is spilled)."""
COUNT_CHARS_UP_TO = 8 * 1024 * 1024
"""Files up to this size get their exact character count in a partial read's note."""
BINARY_SNIFF = 8192


def workspace_files(ctx: ToolContext) -> WorkspaceFiles:
    """The session's workspace as the file tools see it."""
    return WorkspaceFiles.for_settings(ctx.workspace, ctx.settings)


def _read_text(
    files: WorkspaceFiles, name: str, offset: int, limit: int, scrub: Scrubber | None = None
) -> tuple[str, int, bool, int, int | None]:
    """Characters `offset`..`offset+limit` of a UTF-8 file, line endings kept as they are,
    secrets replaced (also a secret that starts before the page or ends after it).

    Returns (text, characters read, whether more follows, size in bytes, total characters
    or None when the file is too big to count cheaply). Runs in a thread: it reads no
    further than needed, except to count the characters of a file up to COUNT_CHARS_UP_TO.
    """
    margin = max(scrub.longest - 1, 0) if scrub else 0
    with files.open_text(name) as (raw, info):
        size = info.st_size
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


def _encoded(ctx: ToolContext, path: str, content: str) -> bytes:
    data = content.encode("utf-8")
    cap = ctx.settings.fs_write_max_bytes
    if len(data) > cap:
        raise ToolError(
            f"refused: {path!r} would be {len(data)} bytes, over the limit of {cap}"
            " (BUB_FS_WRITE_MAX_BYTES)"
        )
    return data


def _edit(
    files: WorkspaceFiles, ctx: ToolContext, path: str, old: str, new: str, replace_all: bool
) -> str:
    cap = ctx.settings.fs_write_max_bytes
    try:
        raw = files.read_bytes(path, cap)
    except FileRefused as exc:
        raise ToolError(str(exc)) from None
    if b"\0" in raw[:BINARY_SNIFF]:
        raise ToolError(f"{path!r} is a binary file; fs_edit edits text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path!r} is not UTF-8 text; fs_edit edits text") from None
    count = text.count(old)
    if count == 0:
        raise ToolError(f"'old' was not found in {path!r} (0 times); nothing changed")
    if count > 1 and not replace_all:
        raise ToolError(
            f"'old' was found {count} times in {path!r}; give more context so it is unique,"
            " or pass replace_all=true. Nothing changed"
        )
    edited = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    files.write(path, _encoded(ctx, path, edited))
    return (
        f"edited {path!r}: {count if replace_all else 1} replacement(s), {len(edited)} characters"
    )


def register_fs_tools(registry: ToolRegistry) -> ToolRegistry:
    """Add fs.list, fs.read, fs.write and fs.edit to `registry`."""

    @registry.tool("fs.list")
    async def fs_list(ctx: ToolContext, path: str = ".") -> list[str]:
        """List a directory of the workspace (directories end with /)."""
        try:
            names = await asyncio.to_thread(workspace_files(ctx).list_dir, path)
        except FileRefused as exc:
            raise ToolError(str(exc)) from None
        return names or []  # None: the workspace directory was not created yet

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
        try:
            text, read, more, size, total = await asyncio.to_thread(
                _read_text, workspace_files(ctx), path, offset, limit, ctx.scrub()
            )
        except FileRefused as exc:
            raise ToolError(str(exc)) from None
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
        path: Annotated[str, Field(description="a path relative to the workspace")],
        content: Annotated[str, Field(description="the whole new content of the file")],
    ) -> str:
        """Create or replace a text file in the workspace (missing parent directories are created). The write is atomic."""
        data = _encoded(ctx, path, content)
        try:
            replaced = await asyncio.to_thread(workspace_files(ctx).write, path, data)
        except FileRefused as exc:
            raise ToolError(str(exc)) from None
        return f"{'replaced' if replaced else 'created'} {path!r} ({len(data)} bytes)"

    @registry.tool("fs.edit")
    async def fs_edit(
        ctx: ToolContext,
        path: Annotated[str, Field(description="a path relative to the workspace")],
        old: Annotated[str, Field(min_length=1, description="the exact text to replace")],
        new: Annotated[str, Field(description="the text to put in its place")],
        replace_all: bool = False,
    ) -> str:
        """Replace the exact text `old` with `new` in a workspace file. `old` must occur exactly once unless replace_all is true."""
        try:
            return await asyncio.to_thread(
                _edit, workspace_files(ctx), ctx, path, old, new, replace_all
            )
        except FileRefused as exc:
            raise ToolError(str(exc)) from None

    return registry


__all__ = ["register_fs_tools", "workspace_files"]
