"""Files uploaded in the web chat (the upload button, drag and drop): staged under
`$BUB_HOME/web-uploads/` until the turn fetches them into the workspace's `inbox/`
(`FetchesFiles`), like a Slack or Telegram file. The staged name is ours (conversation + a
random id), created with O_CREAT|O_EXCL|O_NOFOLLOW; the size is capped while the body is read.
With several replicas, `BUB_HOME` must be shared for uploads to reach another replica's turn."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from bub_bot.config import Settings
from channels.base import Attachment, FetchFailed

KEEP_SECONDS = 2 * 86400
"""Staged uploads older than this are removed (the turn fetched them long before)."""
SWEEP_EVERY = 3600.0
UPLOAD_ID_RE = re.compile(r"[A-Za-z0-9_-]{16,64}")
MAX_FILES = 10
"""Files one message may carry."""


class Uploads:
    """Stages uploads and serves them back to the runtime."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.home.expanduser() / "web-uploads"
        self._swept = 0.0

    def _sweep(self, dir_fd: int) -> None:
        """Remove staged uploads older than KEEP_SECONDS (at most once an hour)."""
        now = time.time()
        if now - self._swept < SWEEP_EVERY:
            return
        self._swept = now
        for name in os.listdir(dir_fd):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if now - st.st_mtime > KEEP_SECONDS:
                    os.unlink(name, dir_fd=dir_fd)
            except OSError:
                continue

    def _dir_fd(self) -> int:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    async def receive(self, request: web.Request, conversation: str) -> web.Response:
        """`POST /api/conversations/<id>/files`: the raw body is the file, `X-File-Name` its
        (URL-encoded) name. 201 with the upload's id, name and size."""
        cap = self.settings.attachment_max_bytes
        name = unquote(request.headers.get("X-File-Name", ""))[:255] or "file"
        if request.content_length is not None and request.content_length > cap:
            return _error(413, f"the file is larger than {cap} bytes (BUB_ATTACHMENT_MAX_BYTES)")
        upload_id = secrets.token_urlsafe(18)
        staged = f"{conversation}.{upload_id}"
        dir_fd = self._dir_fd()
        size = 0
        try:
            self._sweep(dir_fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(staged, flags, 0o600, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as out:
                    async for chunk in request.content.iter_chunked(65536):
                        size += len(chunk)
                        if size > cap:
                            raise _TooLarge
                        out.write(chunk)
            except BaseException:
                os.unlink(staged, dir_fd=dir_fd)
                raise
        except _TooLarge:
            return _error(413, f"the file is larger than {cap} bytes (BUB_ATTACHMENT_MAX_BYTES)")
        finally:
            os.close(dir_fd)
        if size == 0:
            return _error(400, "the file is empty")
        return web.json_response({"id": upload_id, "name": name, "size": size}, status=201)

    def attachments(self, conversation: str, files: Any) -> list[Attachment] | str:
        """The attachments a message names (`files: [{id, name}]`), or an error text."""
        if files is None:
            return []
        if not isinstance(files, list) or len(files) > MAX_FILES:
            return f"files must be a list of at most {MAX_FILES} uploads"
        found = []
        for f in files:
            if not isinstance(f, dict) or not isinstance(f.get("id"), str):
                return "each file needs the id its upload returned"
            if not UPLOAD_ID_RE.fullmatch(f["id"]):
                return "unknown upload id"
            name = f.get("name") if isinstance(f.get("name"), str) else ""
            size = f.get("size") if isinstance(f.get("size"), int) else None
            ref = {"upload": f["id"], "conversation": conversation}
            found.append(Attachment(kind="file", ref=ref, name=name[:255], size=size))
        return found

    async def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """A staged upload's bytes (`FetchesFiles`)."""
        upload, conversation = str(ref.get("upload", "")), str(ref.get("conversation", ""))
        if not UPLOAD_ID_RE.fullmatch(upload) or "/" in conversation or not conversation:
            raise FetchFailed("not an upload of this chat")
        dir_fd = self._dir_fd()
        try:
            fd = os.open(
                f"{conversation}.{upload}",
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=dir_fd,
            )
        except FileNotFoundError as exc:
            raise FetchFailed("the upload is gone (never finished, or cleaned up)") from exc
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as f:
            got = 0
            while chunk := f.read(65536):
                got += len(chunk)
                if got > max_bytes:
                    raise FetchFailed(f"larger than {max_bytes} bytes")
                yield chunk


SENT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}\.[A-Za-z0-9_-]{16,64}")


class SentFiles:
    """Files the bot sends into a web conversation (`send_file`): kept under
    `$BUB_HOME/web-files/` and downloaded from the page behind the same token."""

    def __init__(self, settings: Settings) -> None:
        self.root = settings.home.expanduser() / "web-files"

    def keep(self, conversation: str, name: str, data: bytes) -> str:
        """Store `data`; returns its id (`<conversation>.<random>`)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        file_id = f"{conversation}.{secrets.token_urlsafe(18)}"
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(file_id, flags, 0o600, dir_fd=dir_fd), "wb") as out:
                out.write(data)
            with os.fdopen(os.open(file_id + ".name", flags, 0o600, dir_fd=dir_fd), "w") as out:
                out.write(name)
        finally:
            os.close(dir_fd)
        return file_id

    async def download(self, request: web.Request) -> web.StreamResponse:
        """`GET /api/files/<id>`: the file as a download (never shown inline by the page)."""
        file_id = request.match_info["file"]
        if not SENT_ID_RE.fullmatch(file_id):
            return _error(404, "no such file")
        path = self.root / file_id
        try:
            data = path.read_bytes() if not path.is_symlink() else None
            name = (self.root / f"{file_id}.name").read_text()[:255]
        except OSError:
            data = None
        if data is None:
            return _error(404, "no such file")
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "file"
        return web.Response(
            body=data,
            content_type="application/octet-stream",
            headers={
                "Content-Disposition": f'attachment; filename="{safe}"',
                "X-Content-Type-Options": "nosniff",
            },
        )


class _TooLarge(Exception):
    pass


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
