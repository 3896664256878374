"""Host services behind a pathname Unix socket are unreachable from a sandboxed command
(Landlock does not cover connect(); bwrap shows no host socket), while the socketpairs
ordinary programs use for themselves keep working."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import sandbox_harness as harness
from tests.pg import USER, PostgresCluster
from tests.sandbox_harness import BACKENDS

make_bash = harness.make_bash
reachable_workspace = harness.reachable_workspace

SECRET = "HOST-SERVICE-SECRET"
STREAM_CONNECT = (
    "python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
    ' print("REACHED", s.recv(100))\' {path}'
)
DGRAM_SEND = (
    "python3 -c 'import socket,sys\n"
    "for make in (lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM),\n"
    "             lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[0],\n"
    "             lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW)[0]):\n"
    '    try: make().sendto(b"PLANTED", sys.argv[1]); print("SENT")\n'
    '    except OSError as exc: print("refused", exc)\' {path}'
)


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A host directory anyone may traverse, as /run/postgresql or /var/run are."""
    path = Path(tempfile.mkdtemp(prefix="bub-svc-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def stream_service(host_dir: Path) -> Iterator[tuple[str, list[int]]]:
    """A world-connectable stream socket that tells a secret to whoever connects."""
    path = str(host_dir / "svc.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    hits: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            hits.append(1)
            conn.sendall(f"{SECRET}\n".encode())
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield path, hits
    server.close()


def test_the_host_service_is_reachable_without_a_sandbox(stream_service) -> None:
    """The premise: the socket really answers a plain client."""
    path, _ = stream_service
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(path)
        assert SECRET.encode() in client.recv(100)


@pytest.mark.parametrize("network", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_host_unix_socket_is_unreachable(
    make_bash, stream_service, backend: str, network: bool
) -> None:
    path, hits = stream_service
    sandboxed = await make_bash(backend, network=network)
    result = await sandboxed.run(STREAM_CONNECT.format(path=path))
    assert result["exit_code"] != 0 and SECRET not in result["output"], result
    assert "REACHED" not in result["output"]
    assert hits == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_host_datagram_socket_gets_nothing(make_bash, host_dir: Path, backend) -> None:
    """Not through a datagram socket, and not through a datagram socketpair either (a
    connected one may still sendto() another address)."""
    path = str(host_dir / "log.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(path)
        os.chmod(path, 0o777)
        sink.setblocking(False)
        sandboxed = await make_bash(backend)
        result = await sandboxed.run(DGRAM_SEND.format(path=path))
        assert "SENT" not in result["output"], result
        assert result["output"].count("refused") == 3, result
        with pytest.raises(BlockingIOError):
            sink.recv(100)


async def test_the_tape_postgresql_is_unreachable_over_its_socket(
    make_bash, pg_cluster: PostgresCluster
) -> None:
    """Local trust auth on the test server's socket: reaching it is a superuser login."""
    psql = pg_cluster.bindir / "psql"
    mode = pg_cluster.root.stat().st_mode
    pg_cluster.root.chmod(0o755)  # reachable by path, as /run/postgresql is
    try:
        sql = "select 'LOGGED-IN-' || current_user"
        cmd = f'{psql} -h {pg_cluster.root} -p {pg_cluster.port} -U {USER} -d postgres -Atc "{sql}"'
        plain = await asyncio.create_subprocess_shell(cmd, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(plain.communicate(), 30)
        assert b"LOGGED-IN-" in out  # the premise: the same command, unsandboxed
        for backend in BACKENDS:
            sandboxed = await make_bash(backend)
            result = await sandboxed.run(cmd)
            assert result["exit_code"] != 0, (backend, result)
            assert "LOGGED-IN-" not in result["output"], (backend, result)
    finally:
        pg_cluster.root.chmod(mode & 0o7777)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_ordinary_commands_and_socketpairs_still_work(
    make_bash, reachable_workspace: Path, backend: str
) -> None:
    cmd = (
        "printf 'b\\na\\nc\\n' | sort | tr '\\n' ' '; echo;"
        ' python3 -c \'import socket; a, b = socket.socketpair(); a.sendall(b"pair-ok");'
        " print(b.recv(7).decode())';"
        " python3 -c 'import socket; a, b = socket.socketpair(socket.AF_UNIX,"
        ' socket.SOCK_SEQPACKET); a.send(b"seq-ok"); print(b.recv(6).decode())\';'
        " python3 -c 'import asyncio; asyncio.run(asyncio.sleep(0)); print(\"asyncio-ok\")';"
        " git init -q repo && cd repo && echo x > f && git status --short && id -u"
    )
    sandboxed = await make_bash(backend, ws=reachable_workspace)
    result = await sandboxed.run(cmd)
    assert result["exit_code"] == 0, result
    lines = result["output"].splitlines()
    assert lines[:5] == ["a b c ", "pair-ok", "seq-ok", "asyncio-ok", "?? f"], result


@pytest.mark.parametrize("network", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_host_abstract_socket_is_unreachable_also_with_the_network_on(
    make_bash, backend: str, network: bool
) -> None:
    """bubblewrap's --share-net shares the host's network namespace, where abstract sockets
    live (X11, D-Bus, container shims): they must stay out of reach."""
    name = f"bub-test-abs-{os.getpid()}-{backend}-{network}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as host:
        host.bind("\0" + name)
        host.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plain:
            plain.connect("\0" + name)  # the premise: it answers here
        sandboxed = await make_bash(backend, network=network)
        result = await sandboxed.run(
            "python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX);"
            ' s.connect("\\0" + sys.argv[1]); print("REACHED")\' ' + name
        )
    assert result["exit_code"] != 0 and "REACHED" not in result["output"], result
