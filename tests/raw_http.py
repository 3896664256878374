"""Raw HTTP/1.1 requests over a socket, for requests aiohttp's client will not send (header
values that are not UTF-8: it drops them)."""

from __future__ import annotations

import asyncio


async def send_raw(
    url: str, method: str, path: str, headers: list[bytes], body: bytes = b""
) -> tuple[int, bytes]:
    """Send one request to `url` (`http://host:port`) with `headers` as raw lines; returns
    the status and the whole response (the connection is closed after it)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    lines = [f"{method} {path} HTTP/1.1".encode("latin-1"), b"Host: " + host.encode(), *headers]
    if body:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    lines.append(b"Connection: close")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return int(response.split(b" ", 2)[1]), response
