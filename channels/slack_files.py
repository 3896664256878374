"""Files shared in Slack: the `files` of a message event as attachments, and their download
from `url_private_download` with the bot token (scope `files:read`).

The token goes only to Slack's own file hosts (or the configured BUB_SLACK_API_URL's
origin, for GovSlack and tests), never to a URL an event merely names, and never through a
redirect."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlparse

import aiohttp

from .base import Attachment, DeliveryError, DeliveryUnknown, FetchFailed

log = logging.getLogger("channels.slack")

MAX_FILES = 20
"""Files kept from one message (Slack allows 10 per message; more is not a person)."""
SLACK_FILE_HOSTS = ("files.slack.com", "files.slack-gov.com")


def clean_files(raw: Any) -> list[dict[str, Any]]:
    """The `files` of an event reduced to what we read; wrong shapes are dropped."""
    if not isinstance(raw, list):
        return []
    kept: list[dict[str, Any]] = []
    for item in raw[:MAX_FILES]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        one: dict[str, Any] = {"id": item["id"][:64]}
        for key in ("name", "title", "mimetype", "url_private_download", "mode"):
            value = item.get(key)
            if isinstance(value, str):
                one[key] = value[:2048]
        size = item.get("size")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            one["size"] = size
        kept.append(one)
    return kept


def attachments(files: list[dict[str, Any]]) -> list[Attachment]:
    """Attachments for the cleaned `files` of a message (nothing downloaded)."""
    found = []
    for f in files:
        if f.get("mode") in ("tombstone", "hidden_by_limit"):
            error = "not available: Slack hides this file (deleted, or over the plan's limit)"
        else:
            error = ""
        mime = str(f.get("mimetype") or "")
        kind = (
            "image"
            if mime.startswith("image/")
            else "audio"
            if mime.startswith("audio/")
            else "file"
        )
        ref = {"id": f["id"]}
        if f.get("url_private_download"):
            ref["url"] = f["url_private_download"]
        found.append(
            Attachment(
                kind=kind,
                ref=ref,
                name=str(f.get("name") or f.get("title") or ""),
                mime=mime,
                size=f.get("size"),
                error=error,
            )
        )
    return found


class SlackFiles:
    """Downloads shared files with the bot token."""

    def __init__(self, token: str, api_url: str, client: Any) -> None:
        self._token = token
        self._api_origin = _origin(api_url)
        self._client = client
        """The AsyncWebClient, for `files.info` when an event carried no download URL."""

    def allowed(self, url: str) -> bool:
        """The bot token may be sent to `url`: Slack's file hosts over HTTPS, or the
        configured API's own origin."""
        parsed = urlparse(url)
        if parsed.scheme == "https" and parsed.hostname in SLACK_FILE_HOSTS and not parsed.port:
            return True
        return _origin(url) == self._api_origin

    async def fetch(self, ref: dict[str, Any], max_bytes: int) -> AsyncIterator[bytes]:
        """The file's bytes (see `FetchesFiles`)."""
        url = str(ref.get("url") or "")
        if not url:
            url = await self._lookup(str(ref.get("id") or ""))
        if not self.allowed(url):
            raise FetchFailed("the file's URL is not on Slack's file host")
        headers = {"Authorization": f"Bearer {self._token}"}
        timeout = aiohttp.ClientTimeout(total=300, sock_read=60)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                async with http.get(url, headers=headers, allow_redirects=False) as resp:
                    if resp.status >= 500 or resp.status == 429:
                        raise FetchFailed(f"Slack answered {resp.status}", retry=True)
                    if resp.status != 200:
                        raise FetchFailed(f"Slack answered {resp.status}")
                    if resp.content_type == "text/html" and not url.endswith((".html", ".htm")):
                        # A sign-in page instead of the file: the token may not read files.
                        raise FetchFailed(
                            "Slack sent a sign-in page instead of the file (does the app have"
                            " the files:read scope?)"
                        )
                    got = 0
                    async for chunk in resp.content.iter_chunked(65536):
                        got += len(chunk)
                        if got > max_bytes:
                            raise FetchFailed(f"larger than {max_bytes} bytes")
                        yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise FetchFailed(f"download failed: {type(exc).__name__}", retry=True) from exc

    async def send(
        self, target: dict[str, Any], name: str, data: bytes, caption: str | None
    ) -> list[str]:
        """Upload `data` as `name` into the target's thread (the SDK's external upload)."""
        from slack_sdk.errors import SlackApiError

        kwargs: dict[str, Any] = {"channel": target["channel"], "filename": name, "content": data}
        kwargs["title"] = name
        if target.get("thread_ts"):
            kwargs["thread_ts"] = target["thread_ts"]
        if caption:
            kwargs["initial_comment"] = caption
        try:
            answer = await self._client.files_upload_v2(**kwargs)
        except SlackApiError as exc:
            data_ = getattr(exc.response, "data", None)
            error = data_.get("error") if isinstance(data_, dict) else exc.response.status_code
            raise DeliveryError(f"Slack refused the file: {error}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The upload may have completed before the connection broke: never posted twice.
            raise DeliveryUnknown(f"Slack did not confirm the file: {type(exc).__name__}") from exc
        files = answer.get("files") or [answer.get("file") or {}]
        return [str(f.get("id")) for f in files if isinstance(f, dict) and f.get("id")]

    async def _lookup(self, file_id: str) -> str:
        from slack_sdk.errors import SlackApiError

        if not file_id:
            raise FetchFailed("no Slack file id")
        try:
            answer = await self._client.files_info(file=file_id)
        except SlackApiError as exc:
            data = getattr(exc.response, "data", None)
            error = data.get("error") if isinstance(data, dict) else exc.response.status_code
            raise FetchFailed(f"files.info: {error}", retry=not isinstance(data, dict)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise FetchFailed(f"files.info: {type(exc).__name__}", retry=True) from exc
        url = (answer.get("file") or {}).get("url_private_download")
        if not isinstance(url, str) or not url:
            raise FetchFailed("Slack gave no download URL for the file")
        return url


def _origin(url: str) -> tuple[str, str, int | None]:
    parsed = urlparse(url)
    return (parsed.scheme, parsed.hostname or "", parsed.port)
