"""The bash tool in real sandboxes (bubblewrap and the Landlock helper): each escape attempt is
a real command, run against both backends."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bub_bot.agent import ToolContext, ToolRegistry
from bub_bot.agent.bash import Shell, install_bash
from bub_bot.agent.sandbox.base import CommandSpec
from bub_bot.agent.sandbox.bwrap import BwrapBackend
from bub_bot.config import ConfigError, Settings
from bub_bot.tape import SQLiteTapeStore, Tape

BACKENDS = ["bwrap", "landlock"]
SECRET_KEY = "sk-SECRET-API-KEY-in-env"
SECRET_BUB = "bub-SECRET-token-in-env"


def leftovers(marker: str) -> list[int]:
    """Processes whose command line contains `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(name))
    return found


async def no_leftovers(marker: str) -> list[int]:
    """Wait a little for a killed tree to be reaped, then report what is left."""
    for _ in range(50):
        left = leftovers(marker)
        if not left:
            return []
        await asyncio.sleep(0.1)
    return leftovers(marker)


class Bash:
    """The bash tools of one backend, called as the model would (JSON arguments)."""

    def __init__(self, registry: ToolRegistry, shell: Shell, ctx: ToolContext) -> None:
        self.registry = registry
        self.shell = shell
        self.ctx = ctx

    async def call(self, tool: str, **args: Any) -> tuple[bool, Any]:
        return await self.registry.call(self.ctx, tool, json.dumps(args))

    async def run(self, cmd: str, **args: Any) -> dict[str, Any]:
        ok, result = await self.call("bash", cmd=cmd, **args)
        assert ok, result
        return result


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets in the bot's environment, as a deployment has them."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    monkeypatch.setenv("BUB_TELEGRAM_WEBHOOK_SECRET", SECRET_BUB)


@pytest.fixture
async def make_bash(
    settings: Callable[..., Settings], store: SQLiteTapeStore, workspace: Path
) -> AsyncIterator[Callable[..., Any]]:
    shells: list[Shell] = []

    async def make(
        backend: str, network: bool = False, ws: Path | None = None, **overrides: Any
    ) -> Bash:
        ws = ws or workspace
        conf = settings(shell_sandbox=backend, **overrides)
        registry = ToolRegistry()
        shell = await install_bash(registry, conf)
        assert shell is not None and shell.availability.name == backend
        shells.append(shell)
        tape = Tape.for_session(store, f"test:{backend}", ws)
        ctx = ToolContext(tape=tape, workspace=ws, settings=conf, network=network)
        return Bash(registry, shell, ctx)

    yield make
    for shell in shells:
        await shell.close()


@pytest.fixture(params=BACKENDS)
async def bash(request: pytest.FixtureRequest, make_bash: Callable[..., Any]) -> Bash:
    return await make_bash(request.param)


async def test_basics_and_exit_codes(bash: Bash, workspace: Path) -> None:
    (workspace / "in.txt").write_text("from the host\n")
    result = await bash.run("cat in.txt; echo made > out.txt; echo to-stderr >&2; id -u")
    assert result["exit_code"] == 0
    assert "from the host" in result["output"] and "to-stderr" in result["output"]
    assert result["output"].split()[-1] == "65534"  # never root inside
    assert (workspace / "out.txt").read_text() == "made\n"  # the host sees the write
    # A failing command is a result the model reads, not an error.
    ok, failed = await bash.call("bash", cmd="echo partial; exit 3")
    assert ok and failed["exit_code"] == 3 and "partial" in failed["output"]
    quoted = await bash.run("printf '%s|' \"$(echo 'a b')\" '-n' \"it's\"")
    assert quoted["output"] == "a b|-n|it's|"


async def test_output_is_capped_keeping_start_and_end(make_bash, workspace) -> None:
    for backend in BACKENDS:
        bash = await make_bash(backend, shell_max_output=4096)
        result = await bash.run("echo START; head -c 200000 /dev/zero | tr '\\0' a; echo; echo END")
        assert result["exit_code"] == 0 and result["output_truncated"] is True
        assert result["output"].startswith("START")
        assert result["output"].rstrip().endswith("END")
        assert "bytes of output cut here (BUB_SHELL_MAX_OUTPUT" in result["output"]
        assert len(result["output"]) < 4096 + 200


async def test_timeout_kills_a_tree_that_ignores_sigterm(bash: Bash) -> None:
    marker = f"3{os.getpid() % 1000:03d}1"
    cmd = f"trap '' TERM; (trap '' TERM; sleep {marker}) & sleep {marker}; echo never"
    result = await bash.run(cmd, timeout_seconds=1)
    assert result["timed_out"] is True and "never" not in result["output"]
    assert await no_leftovers(f"sleep\0{marker}") == []


async def test_setsid_double_fork_does_not_survive(bash: Bash) -> None:
    marker = f"4{os.getpid() % 1000:03d}2"
    cmd = f"setsid sh -c '(sleep {marker} &) ; nohup sleep {marker} >/dev/null 2>&1 &'; echo done"
    result = await bash.run(cmd, timeout_seconds=20)
    assert result["exit_code"] == 0 and "done" in result["output"]
    assert await no_leftovers(f"sleep\0{marker}") == []


@pytest.fixture
def reachable_workspace() -> Iterator[Path]:
    """A workspace whose parents the sandbox uid can traverse (as root, bwrap then runs as
    that uid and RLIMIT_NPROC applies; under a 0700 directory it runs as root-in-userns)."""
    top = Path(tempfile.mkdtemp(prefix="bub-test-ws-"))
    top.chmod(0o711)
    (top / "ws").mkdir()
    yield top / "ws"
    shutil.rmtree(top, ignore_errors=True)


async def test_fork_bomb_is_contained(make_bash, reachable_workspace: Path) -> None:
    workspace = reachable_workspace
    for backend in BACKENDS:
        bash = await make_bash(backend, ws=workspace, shell_nproc=24)
        marker = f"bomb-{backend}-{os.getpid()}.sh"
        (workspace / marker).write_text(f"sh {marker} & sh {marker} & wait\n")
        result = await bash.run(f"sh {marker}", timeout_seconds=3)
        # The process limit stops it (the tree collapses or runs into the timeout).
        assert "Resource temporarily unavailable" in result["output"] or "fork" in result["output"]
        assert await no_leftovers(marker) == []
        after = await bash.run("echo still-works")  # the next command is not starved
        assert after["output"].strip() == "still-works"


async def test_no_secret_in_env_or_proc(bash: Bash, secrets_in_env: None) -> None:
    assert os.environ["OPENAI_API_KEY"] == SECRET_KEY
    cmd = (
        "env; cat /proc/1/environ; cat /proc/self/environ;"
        f" cat /proc/{os.getpid()}/environ; cat /proc/{os.getppid()}/environ; true"
    )
    result = await bash.run(cmd)
    assert "PATH=" in result["output"]
    assert SECRET_KEY not in result["output"] and SECRET_BUB not in result["output"]
    assert "BUB_" not in result["output"] and "OPENAI" not in result["output"]
    env = await bash.run("env | cut -d= -f1 | sort | tr '\\n' ' '")
    assert set(env["output"].split()) <= {
        "HOME",
        "LANG",
        "PATH",
        "PWD",
        "SHLVL",
        "TMPDIR",
        "USER",
        "_",
    }


async def test_other_workspace_bub_home_and_tape_db_unreadable(
    bash: Bash, tmp_path: Path, workspace: Path
) -> None:
    other = tmp_path / "other-ws"
    other.mkdir()
    (other / "b.txt").write_text("SECRET-OF-B")
    home = bash.ctx.settings.home.expanduser()
    home.mkdir(parents=True, exist_ok=True)
    (home / ".env").write_text("OPENAI_API_KEY=sk-SECRET-DOTENV")
    db = Path(bash.ctx.tape.store.path)  # the tape database, real and open
    assert db.exists()
    os.symlink(other / "b.txt", workspace / "link-to-b")
    cmd = (
        f"cat {other}/b.txt; cat {home}/.env; cat {db}; ls {tmp_path}; cat link-to-b;"
        " cat /etc/shadow; ls /root; echo end"
    )
    result = await bash.run(cmd)
    out = result["output"]
    assert "SECRET-OF-B" not in out and "SECRET-DOTENV" not in out
    assert "SQLite format" not in out
    assert "other-ws" not in out.splitlines() and "ws" not in out.splitlines()  # no listing
    assert out.rstrip().endswith("end")
    # Writes outside the workspace fail; /usr is read-only.
    await bash.run(f"echo x > {other}/planted; echo x > /usr/planted; true")
    assert not (other / "planted").exists() and not Path("/usr/planted").exists()


class Listener:
    """A TCP port on the host's loopback that records whether anyone connected."""

    def __init__(self) -> None:
        self.hits = 0

    async def __aenter__(self) -> int:
        async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits += 1
            writer.write(b"hello from the host\n")
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(on, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


CONNECT = (
    "python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])),"
    ' timeout=3); print("REACHED", s.recv(100))\' {host} {port}'
)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_network_is_off_unless_the_workspace_rule_turns_it_on(make_bash, backend) -> None:
    listener = Listener()
    async with listener as port:
        off = await make_bash(backend)
        result = await off.run(CONNECT.format(host="127.0.0.1", port=port))
        assert result["exit_code"] != 0 and "REACHED" not in result["output"]
        metadata = await off.run(CONNECT.format(host="169.254.169.254", port=80))
        assert metadata["exit_code"] != 0 and "REACHED" not in metadata["output"]
        dns = await off.run(
            "python3 -c 'import socket; print(socket.getaddrinfo(\"example.com\", 80))'"
        )
        assert dns["exit_code"] != 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp_in:
            udp_in.bind(("127.0.0.1", 0))
            udp_in.setblocking(False)
            udp_port = udp_in.getsockname()[1]
            await off.run(
                "python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
                f' s.sendto(b"x", ("127.0.0.1", {udp_port}))\''
            )
            with pytest.raises(BlockingIOError):
                udp_in.recv(10)  # nothing reached the host
        assert listener.hits == 0
        on = await make_bash(backend, network=True)
        reached = await on.run(CONNECT.format(host="127.0.0.1", port=port))
        assert "REACHED" in reached["output"], reached
        assert listener.hits == 1


async def test_cpu_time_limit(make_bash) -> None:
    for backend in BACKENDS:
        bash = await make_bash(backend, shell_cpu_seconds=1)
        result = await bash.run("python3 -c 'while True: pass'", timeout_seconds=20)
        assert not result.get("timed_out")
        assert result["exit_code"] in (128 + 24, 128 + 9)  # SIGXCPU, then SIGKILL
        assert "signal" in result["note"]


FSTAT_FDS = (
    'python3 -c \'import os\nfor fd in range(3, 1024):\n try: os.fstat(fd); print("OPEN", fd)\n'
    " except OSError: pass'"
)


async def test_no_fds_inherited_and_privileges_dropped(bash: Bash) -> None:
    keep = os.open(bash.ctx.tape.store.path, os.O_RDONLY)  # inheritable on purpose
    os.set_inheritable(keep, True)
    try:
        result = await bash.run(FSTAT_FDS)
        status = await bash.run("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; true")
    finally:
        os.close(keep)
    assert result["exit_code"] == 0 and "OPEN" not in result["output"], result
    if bash.shell.availability.name == "bwrap":
        assert "CapEff:\t0000000000000000" in status["output"]
    else:  # no /proc at all under Landlock
        assert "Permission denied" in status["output"]


async def test_background_job_lifecycle(bash: Bash, store: SQLiteTapeStore, workspace) -> None:
    ok, started = await bash.call("bash", cmd="echo first; sleep 0.5; echo second", background=True)
    assert ok and started["state"] == "running"
    job = started["job_id"]
    for _ in range(100):
        ok, seen = await bash.call("bash.output", job_id=job)
        if seen["state"] != "running":
            break
        await asyncio.sleep(0.1)
    assert seen["state"] == "exited" and seen["exit_code"] == 0
    assert seen["output"] == "first\nsecond\n"
    ok, rest = await bash.call("bash.output", job_id=job, offset=6)
    assert rest["output"] == "second\n"

    marker = f"5{os.getpid() % 1000:03d}3"
    ok, long = await bash.call(
        "bash", cmd=f"setsid sleep {marker} & sleep {marker}", background=True
    )
    ok, killed = await bash.call("bash.kill", job_id=long["job_id"])
    assert ok and killed["state"] == "killed"
    assert await no_leftovers(f"sleep\0{marker}") == []

    # Shutdown: running jobs are killed and the tape says so.
    ok, last = await bash.call("bash", cmd=f"sleep {marker}", background=True)
    await bash.shell.close()
    assert await no_leftovers(f"sleep\0{marker}") == []
    states = [
        (e.payload["data"]["job_id"], e.payload["data"]["state"])
        for e in await bash.ctx.tape.query(kinds=["event"], names=["bash.job"])
    ]
    assert (job, "exited") in states and (long["job_id"], "killed") in states
    assert (last["job_id"], "stopped_by_shutdown") in states
    ok, unknown = await bash.call("bash.output", job_id="nope")
    assert not ok and "no background job 'nope'" in unknown


async def test_a_job_of_an_earlier_process_says_it_was_stopped_by_the_restart(
    make_bash, settings, store
) -> None:
    before = await make_bash("bwrap")
    ok, started = await before.call("bash", cmd="sleep 60", background=True)
    assert ok
    # A new bot process: its own job table, the same tape.
    after_registry = ToolRegistry()
    shell = await install_bash(after_registry, settings(shell_sandbox="bwrap"))
    assert shell is not None
    ok, seen = await after_registry.call(
        before.ctx, "bash.output", json.dumps({"job_id": started["job_id"]})
    )
    assert ok and seen["state"] == "stopped_by_restart" and "restarted" in seen["note"]
    await shell.close()


async def test_background_jobs_are_limited_per_session(make_bash) -> None:
    bash = await make_bash("bwrap", shell_max_jobs=1)
    ok, _ = await bash.call("bash", cmd="sleep 30", background=True)
    ok, second = await bash.call("bash", cmd="sleep 30", background=True)
    assert not ok and "BUB_SHELL_MAX_JOBS" in second


async def test_timeout_above_the_maximum_is_refused(make_bash) -> None:
    bash = await make_bash("bwrap", shell_timeout_max=5)
    ok, refused = await bash.call("bash", cmd="true", timeout_seconds=6)
    assert not ok and "BUB_SHELL_TIMEOUT_MAX=5" in refused


def test_bwrap_argv_keeps_the_teardown_flags(workspace: Path) -> None:
    argv = BwrapBackend("/usr/bin/bwrap").argv(CommandSpec("true", workspace))
    for flag in ("--die-with-parent", "--unshare-all", "--unshare-user", "--clearenv"):
        assert flag in argv
    assert "--share-net" not in argv
    assert argv[-3:] == ["/bin/sh", "-c", "true"]


# -- when a sandbox cannot work -----------------------------------------------------------------
def failing_bwrap(directory: Path) -> Path:
    """A bwrap that fails as it does in a container without user namespaces."""
    fake = directory / "bwrap-no-userns"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the"
        " kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    directory.chmod(0o711)
    return fake


async def test_no_user_namespaces_means_landlock_or_a_clear_refusal(
    settings, reachable_workspace
) -> None:
    fake = failing_bwrap(reachable_workspace.parent)  # as root it runs as the sandbox uid
    registry = ToolRegistry()
    shell = await install_bash(registry, settings(shell_bwrap=str(fake)))
    assert shell is not None and shell.availability.name == "landlock"
    assert "No permissions to create new namespace" in shell.availability.reasons["bwrap"]
    await shell.close()
    with pytest.raises(ConfigError, match="BUB_SHELL_SANDBOX=bwrap cannot work here"):
        await install_bash(ToolRegistry(), settings(shell_sandbox="bwrap", shell_bwrap=str(fake)))


async def test_sandbox_failing_mid_run_is_an_error_never_unsandboxed(
    make_bash, reachable_workspace
) -> None:
    workspace = reachable_workspace
    bash = await make_bash("bwrap", ws=workspace)
    fake = failing_bwrap(workspace.parent)
    bash.shell.availability.backend.bwrap = str(fake)  # bwrap breaks after the start
    ok, result = await bash.call("bash", cmd="echo ran > ran.txt")
    assert not ok and "could not start the command, so it did not run" in result
    assert not (workspace / "ran.txt").exists()


def test_tools_and_network_rule_keys(tmp_path: Path) -> None:
    from bub_bot.workspaces import load_workspace_map

    rules = tmp_path / "map.json"
    rules.write_text(
        json.dumps(
            {
                "workspaces": [
                    {"match": "web:*", "path": str(tmp_path), "tools": ["fs"], "network": True},
                    {"match": "x:*", "path": str(tmp_path), "tools": ["shell"]},
                ]
            }
        )
    )
    with pytest.raises(ConfigError, match="rule 2: unknown tool group 'shell'"):
        load_workspace_map(rules, tmp_path)
    rules.write_text(
        json.dumps({"workspaces": [{"match": "*", "path": str(tmp_path), "network": "yes"}]})
    )
    with pytest.raises(ConfigError, match="network must be true or false"):
        load_workspace_map(rules, tmp_path)


async def test_loopback_port_is_reachable_from_the_host() -> None:
    """The network tests' premise: the listener is really reachable without a sandbox."""
    listener = Listener()
    async with listener as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await reader.readline()).startswith(b"hello")
        writer.close()


async def test_workspace_rule_turns_the_network_on_for_its_sessions_only(
    fake_openai, agent, store, tmp_path, workspace
) -> None:
    from tests.fakes.openai_server import text, tool_calls

    rules = tmp_path / "map.json"
    rules.write_text(
        json.dumps({"workspaces": [{"match": "net:*", "path": str(workspace), "network": True}]})
    )
    registry = ToolRegistry()
    made = agent(registry, workspace_map=rules)
    shell = await install_bash(registry, made.settings)
    listener = Listener()
    try:
        async with listener as port:
            for session in ("net:1", "plain:1"):
                fake_openai.script(
                    tool_calls([("bash", {"cmd": CONNECT.format(host="127.0.0.1", port=port)})]),
                    text("ok"),
                )
                tape = Tape.for_session(store, session, workspace)
                result = await made.run_turn(tape, [{"role": "user", "content": "connect"}])
                assert result.status == "ok"
            first, second = (
                [m for m in r.body["messages"] if m["role"] == "tool"][-1]["content"]
                for r in fake_openai.completion_requests()[1::2]
            )
    finally:
        await shell.close()
    assert "REACHED" in first and "REACHED" not in second
    assert listener.hits == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_nothing_survives_a_sigkilled_bot(backend, tmp_path, workspace) -> None:
    marker = f"6{os.getpid() % 1000:03d}{BACKENDS.index(backend)}"
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("bash_kill_child.py")),
        backend, str(workspace), str(tmp_path / "home"), marker,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 30)
    assert line.strip() == b"READY"
    assert len(leftovers(f"sleep\0{marker}")) >= 3  # the job really runs
    child.kill()
    await child.wait()
    assert await no_leftovers(f"sleep\0{marker}") == []


async def test_none_runs_unsandboxed_only_when_asked_and_warns(
    make_bash, workspace, caplog
) -> None:
    with caplog.at_level("WARNING", logger="bub_bot.sandbox"):
        bash = await make_bash("none")
    assert "bash.UNSANDBOXED BUB_SHELL_SANDBOX=none" in caplog.text
    result = await bash.run("pwd; env | cut -d= -f1 | sort | tr '\\n' ' '")
    assert result["output"].splitlines()[0] == str(workspace.resolve())
    assert "OPENAI" not in result["output"] and "BUB_" not in result["output"]


async def test_landlock_home_is_reachable(make_bash) -> None:
    bash = await make_bash("landlock")
    result = await bash.run('cd "$HOME" && echo x > "$TMPDIR/t" && cat "$TMPDIR/t"')
    assert result["exit_code"] == 0 and result["output"] == "x\n"
