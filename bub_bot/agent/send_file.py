"""The `send_file` tool: the bot posts a file from the workspace into the conversation. The
posting (and its record on the tape) is the runtime's: it is given as a `FileSender`."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from pydantic import Field

from .tools import ToolContext, ToolRegistry


class FileSender(Protocol):
    """Posts a workspace file into the conversation a turn answers."""

    async def send(self, ctx: ToolContext, path: str, caption: str | None) -> dict[str, Any]: ...


def register_send_file(registry: ToolRegistry, sender: FileSender) -> None:
    """Add `send_file` to `registry`, posting through `sender`."""

    # A file tool of the workspace: BUB_TOOLS / a workspace rule's `tools` without fs drop it.
    @registry.tool("send_file", group="fs")
    async def send_file(
        ctx: ToolContext,
        path: Annotated[str, Field(description="The file, relative to the workspace")],
        caption: Annotated[
            str | None, Field(description="A short text shown with the file", max_length=1000)
        ] = None,
    ) -> dict[str, Any]:
        """Post a file from the workspace into this conversation (images as photos where the
        chat shows them). Use it when the user should get the file itself, e.g. a report or a
        chart you made; each file is posted once."""
        return await sender.send(ctx, path, caption)
