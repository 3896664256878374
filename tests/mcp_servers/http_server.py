"""The test MCP server over Streamable HTTP on loopback (uvicorn), optionally behind a bearer
token. In the tests it runs in the test's event loop; `python -m tests.mcp_servers.http_server`
runs it as a process (the benchmark) and prints its URL."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from tests.mcp_servers.tools_server import build


def _require_token(app: Any, token: str) -> Any:
    """ASGI middleware: 401 unless `Authorization: Bearer <token>` (lifespan passes)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            body = json.dumps({"error": "unauthorized"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return guarded


@asynccontextmanager
async def serve_http(token: str | None = None, name: str = "remote") -> AsyncIterator[str]:
    """Serve the test server on 127.0.0.1 (a free port); yields its MCP URL."""
    app: Any = build(name).streamable_http_app(host="127.0.0.1")
    if token:
        app = _require_token(app, token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task  # raises why it could not start
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def _main(token: str | None) -> None:
    async with serve_http(token) as url:
        print(url, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else None))
