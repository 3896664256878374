"""A throwaway PostgreSQL cluster for the tests: initdb in a temp dir, a free port, gone at exit.

PostgreSQL refuses to run as root, so as root the cluster runs as the `postgres` user Debian's
package creates (through `setpriv`); as anyone else it runs as that user. The server is a child
of this process with a parent-death signal: a test run that is killed leaves no server behind.

Binaries: `BUB_TEST_PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin` (Debian keeps them
off PATH), else `pg_ctl` on PATH. Nothing here is skipped: without PostgreSQL it raises, naming
how to install it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from tests.serve_process import free_port

USER = "bub"
PASSWORD = "pg-test-secret-7f3a"
MISSING = (
    "PostgreSQL is needed for these tests and was not found: install it (Debian/Ubuntu:"
    " `apt-get install -y postgresql`; .ci/run does this) or set BUB_TEST_PG_BINDIR to the"
    " directory holding initdb and postgres"
)


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bindir() -> Path:
    """The directory holding `initdb` and `postgres`."""
    configured = os.environ.get("BUB_TEST_PG_BINDIR")
    if configured:
        if not (Path(configured) / "initdb").is_file():
            raise PostgresMissing(f"BUB_TEST_PG_BINDIR={configured} holds no initdb")
        return Path(configured)

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.parent.name)
        except ValueError:
            return 0.0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise PostgresMissing(MISSING)


class PostgresCluster:
    """One PostgreSQL server on 127.0.0.1:<port> with password auth over TCP.

    `url(db)` is a postgresql:// URL for database `db`; `create_database()` makes a fresh one.
    """

    def __init__(self, *, durable: bool = False) -> None:
        """`durable`: keep PostgreSQL's fsync and synchronous commit (for benchmarks); tests
        turn them off, their data is thrown away."""
        self.durable = durable
        self.bindir = find_bindir()
        self._as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        # As root, under /tmp: the `postgres` user must be able to reach the directory.
        self.root = Path(tempfile.mkdtemp(prefix="bub-pg-", dir="/tmp" if self._as_root else None))
        self.data = self.root / "data"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self._counter = 0
        self._shared = ""
        if self._as_root:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresMissing(
                    "running as root and there is no `postgres` user to run the server as"
                    " (Debian's postgresql package creates it)"
                ) from None
            os.chown(self.root, account.pw_uid, account.pw_gid)

    def _cmd(self, *args: str) -> list[str]:
        """`args` run as the unprivileged user, dying with this process."""
        prefix = ["setpriv", "--pdeathsig", "SIGQUIT"] if shutil.which("setpriv") else []
        if self._as_root:
            prefix = [
                "setpriv",
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--pdeathsig",
                "SIGQUIT",
            ]
        return [*prefix, *args]

    def start(self) -> PostgresCluster:
        """initdb, then start the server and wait until it accepts connections."""
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_root:
            account = pwd.getpwnam("postgres")
            os.chown(pwfile, account.pw_uid, account.pw_gid)
        # C.UTF-8 (not C): lower() folds non-ASCII here as on real servers, so a query that
        # forgets its COLLATE "C" fails a test instead of passing by luck. Systems without
        # that locale (macOS) fall back to C.
        for locale in ("C.UTF-8", "C"):
            shutil.rmtree(self.data, ignore_errors=True)
            made = subprocess.run(
                self._cmd(
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    USER,
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=trust",
                    "-E",
                    "UTF8",
                    f"--locale={locale}",
                    "--no-sync",
                ),
                capture_output=True,
                text=True,
            )
            if made.returncode == 0:
                break
        else:
            raise RuntimeError(f"initdb failed in {self.root}:\n{made.stderr[-2000:]}")
        self._log = open(self.root / "server.log", "ab")
        speed = (
            [] if self.durable else ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
        )
        options = [arg for name in [*speed, "max_connections=200"] for arg in ("-c", name)]
        for attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                self._cmd(
                    str(self.bindir / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(self.root),
                    # Throwaway data: no fsync; enough connections for replica tests.
                    *options,
                ),
                stdout=subprocess.DEVNULL,
                stderr=self._log,
            )
            if self._wait_ready():
                return self
            self.proc.kill()
            self.proc.wait()
            if attempt == 4:
                log = (self.root / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"PostgreSQL did not start:\n{log}")
        return self

    def shut_down(self) -> None:
        """Stop the server as an operator's restart does (fast shutdown: every connection is
        closed), keeping its data for `start_again`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: fast shutdown
            self.proc.wait(timeout=20)

    def start_again(self) -> None:
        """Start the server stopped by `shut_down` on the same port and data."""
        assert self.proc is not None and self.proc.poll() is not None and self.port
        speed = (
            [] if self.durable else ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
        )
        options = [arg for name in [*speed, "max_connections=200"] for arg in ("-c", name)]
        self.proc = subprocess.Popen(
            self._cmd(
                str(self.bindir / "postgres"),
                *("-D", str(self.data), "-p", str(self.port), "-h", "127.0.0.1"),
                *("-k", str(self.root), *options),
            ),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        if not self._wait_ready():
            raise RuntimeError("PostgreSQL did not start again")

    def _wait_ready(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False  # exited: port taken, most likely
            ready = subprocess.run(
                [
                    str(self.bindir / "pg_isready"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-U",
                    USER,
                    "-d",
                    "postgres",
                ],
                capture_output=True,
            )
            if ready.returncode == 0:
                return True
            time.sleep(0.05)
        return False

    def url(self, database: str = "postgres", *, password: str | None = PASSWORD) -> str:
        auth = f"{USER}:{password}" if password is not None else USER
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL through psql over the Unix socket (trust auth); returns stdout."""
        out = subprocess.run(
            self._cmd(
                str(self.bindir / "psql"),
                "-h",
                str(self.root),
                "-p",
                str(self.port),
                "-U",
                USER,
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-qAtc",
                sql,
            ),
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout

    def create_database(self, prefix: str = "t") -> str:
        """A fresh empty database; returns its name. Costs ~0.3 s (a checkpoint): tests that
        only need isolation take `fresh_url()`."""
        self._counter += 1
        name = f"{prefix}_{self._counter}"
        self.psql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return name

    def fresh_url(self) -> str:
        """The URL of a new, empty schema in the shared test database, as its search path.

        As isolated as a new database for everything bub-bot does (unqualified table names,
        `to_regclass`), in ~10 ms instead of ~300 ms.
        """
        if not self._shared:
            self._shared = self.create_database("bub_test")
        self._counter += 1
        schema = f"s_{self._counter}"
        self.psql(f"CREATE SCHEMA {schema}", self._shared)
        return f"{self.url(self._shared)}?search_path={schema}"

    def stop(self) -> None:
        """Fast shutdown, then remove the data directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: fast shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)
