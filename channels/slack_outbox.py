"""Slack outbound: posting reply pieces (paced per channel, 429s waited out, an unknown
outcome never re-posted), ephemeral command replies, streams, and the working indicator
(thread status, or reactions where the status is refused).

Answers first: a stream's calls are *partial* requests (`partial=<the stream>`, see
channels/pacing.py): in a channel's `chat.postMessage` window they go only when no answer's
post could, a stream's partial call still waiting when its answer is ready is dropped
(`drop`), and a partial call that gets a 429 is not repeated (`Dropped`; the 429 still holds
every call of the method for its Retry-After)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from bub_bot.config import Settings

from .base import DeliveryError, DeliveryUnknown, request_leaving, request_refused
from .pacing import Dropped, Pacer, Rate
from .slack_format import format_and_split
from .slack_stream import NativeStreams, SlackStream

log = logging.getLogger("channels.slack")

STATUS_TEXT = "is thinking…"
WORKING_REACTION = "eyes"
DONE_REACTION = "white_check_mark"
INDICATOR_TIMEOUT = 5.0
MAX_RATE_LIMIT_WAITS = 5
MAX_RETRY_AFTER = 300.0
CONNECT_RETRIES = 2


class SlackOutbox:
    """Everything the Slack channel sends through the Web API."""

    def __init__(self, settings: Settings, client: AsyncWebClient) -> None:
        self.settings = settings
        self.client = client
        self.team_id = ""
        """The workspace the bot token belongs to (set once `auth.test` answered)."""
        self._status_ok: dict[str, bool] = {}
        self._channel_rate = Rate.parse(settings.slack_rate_channel)
        self._pacers: dict[str, Pacer] = {}
        self._native_streams = NativeStreams()

    def split(self, text: str) -> list[str]:
        return format_and_split(text)

    async def send(
        self, target: dict[str, Any], piece: str, *, metadata: dict[str, Any] | None = None
    ) -> list[str]:
        """Post one piece; `metadata`: the message metadata (its delivery key)."""
        if target.get("ephemeral"):
            return await self._send_ephemeral(target, piece)
        params: dict[str, Any] = {"channel": target["channel"], "text": piece}
        if target.get("thread_ts"):
            params["thread_ts"] = target["thread_ts"]
        if metadata:
            params["metadata"] = metadata
        response = await self.call("chat.postMessage", params)
        return [str(response.get("ts") or "")]

    def stream(
        self, target: dict[str, Any], shown: Sequence[str | None] = ()
    ) -> SlackStream | None:
        """The reply shown while it is written (channels/slack_stream.py); none for the
        ephemeral replies of slash commands."""
        if target.get("ephemeral") or not target.get("channel"):
            return None
        team = str(target.get("team") or self.team_id)
        mode = self.settings.slack_working_indicator

        async def set_status(text: str) -> bool:
            """The thread's status names what the bot does, where the status is in use."""
            if mode not in ("status", "auto") or not self._status_ok.get(team, False):
                return False
            return await self._set_status(target, text, team, remember=False)

        return SlackStream(
            target,
            shown,
            call=self.call,
            drop=self.drop,
            native=self._native_streams,
            team=team,
            set_status=set_status,
        )

    async def _send_ephemeral(self, target: dict[str, Any], piece: str) -> list[str]:
        url = target.get("response_url")
        if url:
            hook = AsyncWebhookClient(url, retry_handlers=[])
            for attempt in range(MAX_RATE_LIMIT_WAITS + 1):
                request_leaving()
                try:
                    answer = await hook.send(
                        text=piece, response_type="ephemeral", replace_original=False
                    )
                except aiohttp.ClientConnectorError as exc:
                    request_refused()
                    log.warning("slack.response_url unreachable: %s", exc)
                    break
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise DeliveryUnknown(f"response_url: connection lost: {exc}") from exc
                if answer.status_code == 200:
                    return []
                if answer.status_code < 500:
                    request_refused()  # answered: nothing posted
                if answer.status_code == 429 and attempt < MAX_RATE_LIMIT_WAITS:
                    await asyncio.sleep(_retry_after(answer.headers))
                    continue
                log.info("slack.response_url failed status=%s: %s", answer.status_code, answer.body)
                break
        # No usable response_url (expired after 30 minutes, or 5 uses): post ephemerally.
        params = {"channel": target["channel"], "user": target["user"], "text": piece}
        response = await self.call("chat.postEphemeral", params)
        return [str(response.get("message_ts") or "")]

    async def call(
        self, method: str, params: dict[str, Any], *, partial: Hashable | None = None
    ) -> dict[str, Any]:
        """One Web API call that posts something: waits out 429s, retries only failures that
        provably never reached Slack, and reports an unknown outcome as DeliveryUnknown.
        `partial`: a stream's update (see the module; `Dropped` instead of waiting)."""
        waits = 0
        connect_failures = 0
        pacer = self.pacer(method)
        while True:
            try:
                async with pacer.turn(str(params.get("channel") or ""), partial=partial):
                    request_leaving()  # from here Slack may have it (channels.base.watch_send)
                    try:
                        response = await self.client.api_call(method, json=params)
                    except SlackApiError as exc:
                        if exc.response.status_code == 429:
                            # Every call of this method waits, this one included (re-queued).
                            pacer.pause_all(_retry_after(exc.response.headers))
                        raise
                return dict(response.data) if isinstance(response.data, dict) else {}
            except SlackApiError as exc:
                status = exc.response.status_code
                error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
                if status < 500:
                    request_refused()  # Slack answered (a 429, a 4xx): it posted nothing
                if status == 429 and partial is not None:
                    raise Dropped from None  # not shown; the next update brings newer text
                if status == 429 and waits < MAX_RATE_LIMIT_WAITS:
                    waits += 1
                    delay = _retry_after(exc.response.headers)
                    log.warning("slack.rate_limited method=%s retry_after=%.1fs", method, delay)
                    continue
                if status >= 500:
                    raise DeliveryUnknown(f"{method}: HTTP {status} {error or ''}".strip()) from exc
                raise DeliveryError(f"{method}: {error or f'HTTP {status}'}") from exc
            except aiohttp.ClientConnectorError as exc:
                # The connection was never made: nothing was posted, trying again is safe.
                request_refused()
                if connect_failures < CONNECT_RETRIES:
                    connect_failures += 1
                    await asyncio.sleep(0.5 * connect_failures)
                    continue
                raise DeliveryError(f"{method}: cannot connect: {exc}") from exc
            except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                raise DeliveryUnknown(f"{method}: connection lost, outcome unknown: {exc}") from exc

    def drop(self, owner: Hashable) -> int:
        """Take `owner`'s partial calls that still wait out of every method's queue."""
        return sum(pacer.drop(owner) for pacer in self._pacers.values())

    def pacer(self, method: str) -> Pacer:
        """The turns of one Web API method: `chat.postMessage` paced per channel, the others
        only held by a 429."""
        pacer = self._pacers.get(method)
        if pacer is None:
            per_channel = self._channel_rate if method == "chat.postMessage" else None
            pacer = self._pacers[method] = Pacer(per_key=per_channel, name=f"slack.{method}")
        return pacer

    # -- working indicator -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def working(self, target: dict[str, Any]) -> AsyncIterator[None]:
        mode = self.settings.slack_working_indicator
        if mode == "none" or target.get("ephemeral") or not target.get("channel"):
            yield
            return
        team = str(target.get("team") or self.team_id)
        status_on = False
        if mode in ("status", "auto") and target.get("thread_ts"):
            if mode == "status" or self._status_ok.get(team, True):
                status_on = await self._set_status(target, STATUS_TEXT, team, remember=True)
        reacted = False
        if not status_on and mode in ("auto", "reaction") and target.get("ts"):
            reacted = await self._indicator_call(
                "reactions.add",
                {"channel": target["channel"], "timestamp": target["ts"], "name": WORKING_REACTION},
            )
        try:
            yield
        finally:
            if status_on:
                await self._set_status(target, "", team, remember=False)
            if reacted:
                ref = {"channel": target["channel"], "timestamp": target["ts"]}
                await self._indicator_call("reactions.remove", {**ref, "name": WORKING_REACTION})
                await self._indicator_call("reactions.add", {**ref, "name": DONE_REACTION})

    async def _set_status(
        self, target: dict[str, Any], status: str, team: str, *, remember: bool
    ) -> bool:
        params = {
            "channel_id": target["channel"],
            "thread_ts": target["thread_ts"],
            "status": status,
        }
        try:
            await asyncio.wait_for(
                self.client.api_call("assistant.threads.setStatus", json=params),
                INDICATOR_TIMEOUT,
            )
        except SlackApiError as exc:
            error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
            if remember and exc.response.status_code != 429:
                # Not an assistant/agent app here (or no scope): use reactions from now on.
                log.info("slack.status_unavailable team=%s error=%s", team, error)
                self._status_ok[team] = False
            return False
        except Exception as exc:
            log.debug("slack.status_failed: %s", exc)
            return False
        if remember:
            self._status_ok[team] = True
        return True

    async def _indicator_call(self, method: str, params: dict[str, Any]) -> bool:
        try:
            await asyncio.wait_for(self.client.api_call(method, json=params), INDICATOR_TIMEOUT)
        except SlackApiError as exc:
            error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
            log.debug("slack.indicator %s failed: %s", method, error)
            return error == "already_reacted"
        except Exception as exc:
            log.debug("slack.indicator %s failed: %s", method, exc)
            return False
        return True


def _retry_after(headers: Any) -> float:
    """Seconds to wait from a Retry-After header (1 s when missing or unreadable)."""
    value: Any = None
    if headers is not None:
        value = headers.get("Retry-After") or headers.get("retry-after")
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER)
    except (TypeError, ValueError):
        return 1.0
