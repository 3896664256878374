"""A loopback TCP proxy that a test can cut, to stand for a network outage.

Why: a replica losing its database is not the database stopping. A stopped
PostgreSQL refuses at once; a cut network leaves the client's socket open and
silent, so a query hangs until some timeout fires. Code that only copes with
the first (a prompt ``ConnectionRefused``) can still hang for ever in the
second. Putting one replica's database connection through this proxy lets a
test cut exactly that replica's path to the real PostgreSQL of the tests,
while the other replicas and the database itself keep running.

``cut()`` black-holes by default: live connections stay open but no byte goes
through in either direction, and new connections are accepted and then
ignored, like packets dropped on the floor. ``cut(reset=True)`` instead
closes every connection with a TCP reset and resets new ones as soon as they
are accepted (the client sees ``ECONNRESET`` at once). ``restore()`` lets new connections through again; connections opened
during a black-hole cut are closed on restore (their handshake bytes were
thrown away, so they cannot be resumed), as are the ones alive at the cut.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from urllib.parse import urlsplit, urlunsplit

_CHUNK = 65536
# SO_LINGER on, 0 s: close() sends a RST instead of a FIN.
_RESET = struct.pack("ii", 1, 0)


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port`` until cut.

    One thread runs a selector loop over the listening socket and every
    connection pair, so ``cut`` and ``restore`` take effect between two reads
    without locking per byte.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode = "open"  # "open", "blackhole" or "reset"
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._held: list[socket.socket] = []  # accepted while black-holed
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def route(self, url: str) -> str:
        """The database `url` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        auth = parts.netloc.rsplit("@", 1)[0]
        return urlunsplit(parts._replace(netloc=f"{auth}@127.0.0.1:{self.port}"))

    def cut(self, *, reset: bool = False) -> None:
        """Cut the path: black-hole (default) or reset every connection."""
        with self._lock:
            self._mode = "reset" if reset else "blackhole"
        self._wake()

    def restore(self) -> None:
        """Let traffic through again; connections from before the cut are dropped."""
        with self._lock:
            self._mode = "restore"
        self._wake()

    def close(self) -> None:
        """Stop the proxy and close every socket."""
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _drop(self, sock: socket.socket) -> None:
        peer = self._pairs.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._pairs.pop(s, None)
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            except OSError:
                pass
            s.close()

    def _drop_all(self) -> None:
        for sock in list(self._pairs):
            self._drop(sock)
        for sock in self._held:
            sock.close()
        self._held.clear()

    def _apply_mode(self) -> str:
        with self._lock:
            mode = self._mode
            if mode == "restore":
                self._mode = "open"
        if mode == "reset":
            self._drop_all()
        elif mode == "blackhole":
            # Stop reading: bytes stay in kernel buffers, nothing moves.
            for sock in list(self._pairs):
                try:
                    self._sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
        elif mode == "restore":
            self._drop_all()
            mode = "open"
        return mode

    def _accept(self, mode: str) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, OSError):
            return
        if mode == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            client.close()
            return
        if mode == "blackhole":
            self._held.append(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pairs[client] = upstream
        self._pairs[upstream] = client
        self._sel.register(client, selectors.EVENT_READ, "data")
        self._sel.register(upstream, selectors.EVENT_READ, "data")

    def _forward(self, sock: socket.socket) -> None:
        peer = self._pairs.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        try:
            peer.setblocking(True)
            peer.sendall(data)
            peer.setblocking(False)
        except OSError:
            self._drop(sock)

    def _run(self) -> None:
        mode = "open"
        while True:
            with self._lock:
                closed = self._closed
            if closed:
                break
            for key, _ in self._sel.select(timeout=0.5):
                if key.data == "wake":
                    try:
                        self._wake_r.recv(1024)
                    except BlockingIOError:
                        pass
                    mode = self._apply_mode()
                elif key.data == "accept":
                    self._accept(mode)
                elif mode == "open":
                    self._forward(key.fileobj)  # type: ignore[arg-type]
        self._drop_all()
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
