"""The bash tool in real sandboxes (bubblewrap and the Landlock helper): each escape attempt is
a real command, run against both backends."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from bub_bot.agent.sandbox.base import CommandSpec
from bub_bot.agent.sandbox.bwrap import BwrapBackend
from tests import sandbox_harness as harness
from tests.sandbox_harness import (
    BACKENDS,
    CONNECT,
    SECRET_BUB,
    SECRET_KEY,
    Bash,
    Listener,
    no_leftovers,
)

bash = harness.bash
make_bash = harness.make_bash
reachable_workspace = harness.reachable_workspace
secrets_in_env = harness.secrets_in_env


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
        "GIT_CONFIG_NOSYSTEM",
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


def test_bwrap_argv_keeps_the_teardown_flags(workspace: Path) -> None:
    argv = BwrapBackend("/usr/bin/bwrap").argv(CommandSpec("true", workspace))
    for flag in ("--die-with-parent", "--unshare-all", "--unshare-user", "--clearenv"):
        assert flag in argv
    assert "--share-net" not in argv
    assert argv[-3:] == ["/bin/sh", "-c", "true"]


async def test_loopback_port_is_reachable_from_the_host() -> None:
    """The network tests' premise: the listener is really reachable without a sandbox."""
    listener = Listener()
    async with listener as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await reader.readline()).startswith(b"hello")
        writer.close()


async def test_landlock_home_is_reachable(make_bash) -> None:
    bash = await make_bash("landlock")
    result = await bash.run('cd "$HOME" && echo x > "$TMPDIR/t" && cat "$TMPDIR/t"')
    assert result["exit_code"] == 0 and result["output"] == "x\n"


async def test_abstract_unix_socket_of_the_host_is_unreachable(bash: Bash) -> None:
    name = f"bub-test-{os.getpid()}-{bash.shell.availability.name}"
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    host.bind("\0" + name)
    host.listen(1)
    try:
        result = await bash.run(
            "python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX);"
            ' s.connect("\\0" + sys.argv[1]); print("REACHED")\' ' + name
        )
    finally:
        host.close()
    assert result["exit_code"] != 0 and "REACHED" not in result["output"]


async def test_two_concurrent_commands_do_not_see_each_other(make_bash, tmp_path) -> None:
    for backend in BACKENDS:
        one, two = tmp_path / f"{backend}-one", tmp_path / f"{backend}-two"
        one.mkdir()
        two.mkdir()
        first = await make_bash(backend, ws=one)
        second = await make_bash(backend, ws=two)
        cmd = 'echo {0} > "$TMPDIR/{0}"; echo {0} > {0}.txt; sleep 1; ls "$TMPDIR" /tmp; ls'
        a, b = await asyncio.gather(first.run(cmd.format("aaa")), second.run(cmd.format("bbb")))
        assert "aaa" in a["output"] and "bbb" not in a["output"], a
        assert "bbb" in b["output"] and "aaa" not in b["output"], b


async def test_a_symlink_planted_by_a_command_is_not_followed_by_the_file_tools(
    make_bash, workspace: Path, tmp_path: Path
) -> None:
    """A command may write anything in the workspace, symlinks out included: fs.write,
    fs.edit and fs.read never follow one out (issue 19 §1)."""
    from bub_bot.agent.fs_tools import register_fs_tools

    outside = tmp_path / "host-only"
    outside.mkdir()
    (outside / "target.txt").write_text("HOST-FILE", encoding="utf-8")
    for backend in BACKENDS:
        bash = await make_bash(backend)
        register_fs_tools(bash.registry)
        made = await bash.run(
            f"ln -sfn {outside} planted_dir && ln -sf {outside / 'target.txt'} planted.txt"
            " && ls -l planted_dir planted.txt"
        )
        assert made["exit_code"] == 0, made
        for tool, args in (
            ("fs_write", {"path": "planted_dir/target.txt", "content": "pwned"}),
            ("fs_write", {"path": "planted.txt", "content": "pwned"}),
            ("fs_write", {"path": "planted_dir/new.txt", "content": "pwned"}),
            ("fs_edit", {"path": "planted.txt", "old": "HOST", "new": "pwned"}),
            ("fs_read", {"path": "planted.txt"}),
        ):
            ok, body = await bash.call(tool, **args)
            assert not ok and "outside the workspace" in body, (backend, tool, body)
        assert (outside / "target.txt").read_text() == "HOST-FILE"
        assert sorted(p.name for p in outside.iterdir()) == ["target.txt"]
