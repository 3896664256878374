"""Files the bot sends (`send_file`): read safely from the session's workspace and posted
through the conversation's channel, recorded on the tape before (`file.sending`) and after
(`file.sent`), so a repeat of the same call — a restarted turn — never posts it twice."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import PurePosixPath
from typing import Any

from channels.base import Channel, DeliveryError, DeliveryUnknown, SendsFiles

from ..agent.tools import ToolContext, ToolError
from ..config import Settings
from ..files.sniff import sniff
from ..tape import TapeEntry
from ..workspace_files import FileRefused, WorkspaceFiles

log = logging.getLogger("bub_bot.runtime")

SENDING = "file.sending"
SENT = "file.sent"
FAILED = "file.failed"


class OutFiles:
    """Sends workspace files into the conversation a turn answers."""

    def __init__(self, settings: Settings, channels: dict[str, Channel]) -> None:
        self.settings = settings
        self.channels = channels

    async def send(self, ctx: ToolContext, path: str, caption: str | None) -> dict[str, Any]:
        """Post `path` (relative to the workspace) with `caption`; the result for the model."""
        origin = ctx.origin
        channel = self.channels.get(origin.channel)
        if not isinstance(channel, SendsFiles) or not origin.reply_target:
            raise ToolError("this conversation's channel cannot receive files")
        files = WorkspaceFiles.for_settings(ctx.workspace, self.settings)
        try:
            # The workspace-files rules: beneath the workspace, no symlink out, never a
            # secret file or bub-bot's own data, regular files only.
            data = await asyncio.to_thread(
                files.read_bytes, path, self.settings.attachment_max_bytes
            )
        except FileRefused as exc:
            raise ToolError(str(exc)) from exc
        if not data:
            raise ToolError(f"{path!r} is empty")
        name = PurePosixPath(path).name
        mime = sniff(data[:8192], name)[0]
        digest = hashlib.sha256(data).hexdigest()
        # One post per (message answered, file content, path, caption): a restarted turn
        # that asks again finds the record and does not post a second copy.
        key = hashlib.sha256(
            json.dumps([origin.reply_target, digest, path, caption], sort_keys=True).encode()
        ).hexdigest()[:32]
        earlier = await ctx.tape.query(kinds=["event"], after_last_anchor=True)
        records = [
            e.payload["name"] for e in earlier if e.payload.get("name") in (SENDING, SENT, FAILED)
            and e.payload.get("data", {}).get("key") == key
        ]  # fmt: skip
        last = records[-1] if records else FAILED
        if last == SENT:
            return {"sent": True, "name": name, "note": "already sent in this conversation"}
        if last == SENDING:
            return {
                "sent": "unknown",
                "name": name,
                "note": "an earlier attempt may have posted it; not sent again",
            }
        record = {"key": key, "path": path, "name": name, "type": mime, "size": len(data)}
        await ctx.tape.append_many([TapeEntry.event(SENDING, record, context=False)])
        try:
            ids = await channel.send_file(origin.reply_target, name, data, mime, caption)
        except DeliveryUnknown as exc:
            log.warning("file.unknown session=%s path=%s: %s", origin.session_id, path, exc)
            return {"sent": "unknown", "name": name, "note": "the platform did not confirm it"}
        except DeliveryError as exc:
            # Not posted: the record is closed so asking again may try again.
            await ctx.tape.append_many(
                [TapeEntry.event(FAILED, record | {"error": str(exc)}, context=False)]
            )
            raise ToolError(f"the file was not sent: {exc}") from exc
        await ctx.tape.append_many([TapeEntry.event(SENT, record | {"ids": ids}, context=False)])
        log.info(
            "file.sent session=%s path=%s bytes=%d type=%s",
            origin.session_id,
            path,
            len(data),
            mime,
        )
        return {"sent": True, "name": name, "type": mime, "size": len(data)}
