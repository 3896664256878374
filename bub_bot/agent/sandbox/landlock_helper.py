"""The Landlock sandbox helper: run as `python3 -I -S landlock_helper.py CONFIG -- ARGV...`
(CONFIG: a dict in `marshal` form, hex: the bot starts it with its own interpreter, and
marshal loads without the imports json needs, which would cost ~8 ms a command).

Stdlib only (it runs without the bot's packages). It supervises one command:

- the parent becomes a child subreaper and, when the command exits or on SIGTERM (also the
  one the kernel sends when the bot dies: PR_SET_PDEATHSIG), SIGKILLs every descendant left
  (a `setsid` double-fork re-parents to it and dies too), then exits with the command's code;
- the child drops to the sandbox uid (when started as root), sets rlimits and no-new-privs,
  installs a seccomp filter (no AF_INET/AF_INET6/netlink/packet sockets unless the network is
  on: Landlock does not cover UDP; never an AF_UNIX socket from socket(), which could connect
  to any host service listening on a pathname socket — Landlock does not cover connect() —
  only connected socketpair()s; no io_uring, which would bypass both), restricts itself with
  Landlock (read-only
  system directories, the workspace and a private tmp read-write, nothing else; TCP bind and
  connect denied on ABI >= 4; signals and abstract unix sockets scoped on ABI >= 6) and execs
  the command with a minimal environment.

Exit code 126 with a line on stderr: the sandbox could not be set up (never run unconfined).
"""

from __future__ import annotations

import ctypes
import marshal
import os
import signal
import struct
import sys

NR_CREATE, NR_ADD, NR_RESTRICT = 444, 445, 446  # the same on x86_64 and aarch64
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER = 1, 38, 22, 36
SECCOMP_MODE_FILTER = 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | (1 << 14) | (1 << 15)  # + TRUNCATE, IOCTL_DEV
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11

# Syscall numbers that differ per architecture (seccomp filters see raw numbers).
ARCHES = {
    "x86_64": {"audit": 0xC000003E, "socket": 41, "socketpair": 53, "unshare": 272, "clone": 56},
    "aarch64": {
        "audit": 0xC00000B7,
        "socket": 198,
        "socketpair": 199,
        "unshare": 97,
        "clone": 220,
    },
}
NR_IO_URING_SETUP, NR_CLONE3 = 425, 435
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
ENOSYS, EPERM, EAFNOSUPPORT = 38, 1, 97
AF_UNIX = 1
SOCK_STREAM_BIT, SOCK_NOT_STREAM_OR_SEQPACKET = 0b0001, 0b1010
"""socketpair types allowed: SOCK_STREAM (1) and SOCK_SEQPACKET (5), the only ones with bit 0
set and bits 1 and 3 clear (low 4 bits: the type; SOCK_NONBLOCK/SOCK_CLOEXEC are above).
A datagram pair (SOCK_DGRAM, or SOCK_RAW which AF_UNIX turns into one) could sendto() any
host datagram socket by path (syslog, journald) despite being connected."""


class RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneath(ctypes.Structure):
    _pack_ = 1  # u64 + s32 = 12 bytes, as the kernel reads it
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    abi = _libc.syscall(NR_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(abi, 0)


# -- seccomp ---------------------------------------------------------------------------------
def bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One classic BPF instruction."""
    return struct.pack("HBBI", code, jt, jf, k)


LD_W_ABS, JEQ_K, JSET_K, JGE_K, RET_K, AND_K = 0x20, 0x15, 0x45, 0x35, 0x06, 0x54
Rule = tuple  # (nr, errno, mask, value[, arg index, op])


def filter_program(deny: list[Rule]) -> bytes:
    """A seccomp program: for each (syscall nr, errno, mask, value[, arg, op]) the call fails
    with errno — always when mask is None; else, on the low 32 bits of argument `arg` (0 when
    not given), by `op`: "any" (default when value is None): when `arg & mask` is non-zero;
    "ne" (default otherwise): unless `arg & mask == value`; "eq": when `arg & mask == value`.
    Rules are tried in order. Everything else is allowed; another architecture or the x32 ABI
    is refused outright."""
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        raise OSError(f"seccomp: unsupported architecture {os.uname().machine}")
    prog = [
        bpf(LD_W_ABS, 4),
        bpf(JEQ_K, arch["audit"], 1, 0),
        bpf(RET_K, SECCOMP_RET_ERRNO | EPERM),
        bpf(LD_W_ABS, 0),
        bpf(JGE_K, 0x40000000, 0, 1),
        bpf(RET_K, SECCOMP_RET_ERRNO | ENOSYS),
    ]
    for rule in deny:
        nr, errno, mask, value = rule[:4]
        arg = rule[4] if len(rule) > 4 else 0
        op = rule[5] if len(rule) > 5 else ("any" if value is None else "ne")
        ret_errno = bpf(RET_K, SECCOMP_RET_ERRNO | errno)
        if mask is None:
            prog += [bpf(JEQ_K, nr, 0, 1), ret_errno]
            continue
        load = bpf(LD_W_ABS, 16 + 8 * arg)  # the low word of the argument (little-endian)
        if op == "any":
            body = [load, bpf(JSET_K, mask, 0, 1)]
        elif op in ("eq", "ne"):
            hit = bpf(JEQ_K, value, 0, 1) if op == "eq" else bpf(JEQ_K, value, 1, 0)
            body = [load, bpf(AND_K, mask), hit]
        else:
            raise ValueError(f"seccomp: unknown rule op {op!r}")
        # Not this syscall: skip the test, the errno and the reload (A still holds nr).
        prog += [bpf(JEQ_K, nr, 0, len(body) + 2), *body, ret_errno, bpf(LD_W_ABS, 0)]
    prog.append(bpf(RET_K, SECCOMP_RET_ALLOW))
    return b"".join(prog)


def install_filter(program: bytes) -> None:
    """Load a seccomp program into this process (no-new-privs first, as the kernel asks)."""
    buf = ctypes.create_string_buffer(program)
    fprog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(SECCOMP)")


def network_filter(net: bool = False) -> bytes:
    """No AF_UNIX socket() (pathname sockets of the host would be reachable: Landlock does
    not cover connect(); abstract ones are also scoped on ABI >= 6), socketpair() only of
    stream or seqpacket type, no io_uring (it would bypass the socket checks), and without
    `net` no socket() at all."""
    arch = ARCHES[os.uname().machine]
    rules: list[Rule] = [
        (arch["socket"], EPERM, 0xFFFFFFFF, AF_UNIX, 0, "eq"),
        (arch["socketpair"], EPERM, SOCK_NOT_STREAM_OR_SEQPACKET, None, 1, "any"),
        (arch["socketpair"], EPERM, SOCK_STREAM_BIT, 0, 1, "eq"),
        (NR_IO_URING_SETUP, EPERM, None, None),
    ]
    if not net:
        rules.append((arch["socket"], EAFNOSUPPORT, None, None))
    return filter_program(rules)


# -- Landlock ----------------------------------------------------------------------------------
def restrict(cfg: dict, abi: int, ws_fd: int, tmp_fd: int | None) -> None:
    """Apply the Landlock ruleset to this process."""
    all_fs = (1 << 13) - 1
    all_fs |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    all_fs |= 1 << 15 if abi >= 5 else 0
    net = 0b11 if abi >= 4 and not cfg["net"] else 0
    scoped = 0b11 if abi >= 6 else 0
    attr = RulesetAttr(all_fs, net, scoped)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    rs = _libc.syscall(NR_CREATE, ctypes.byref(attr), size, 0)
    if rs < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    def allow_fd(fd: int, access: int, is_dir: bool) -> None:
        access &= all_fs if is_dir else (all_fs & FILE_RIGHTS)
        rule = PathBeneath(access, fd)
        if _libc.syscall(NR_ADD, rs, 1, ctypes.byref(rule), 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_add_rule")

    for path in cfg["ro"]:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a curated path this system lacks
        allow_fd(fd, EXECUTE | READ_FILE | READ_DIR, os.path.isdir(path))
        os.close(fd)
    for path in cfg["dev"]:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        allow_fd(fd, READ_FILE | WRITE_FILE, False)
        os.close(fd)
    rw = all_fs & ~(MAKE_CHAR | MAKE_BLOCK)
    allow_fd(ws_fd, rw, True)
    if tmp_fd is not None:
        allow_fd(tmp_fd, rw, True)
    if _libc.syscall(NR_RESTRICT, rs, 0) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(rs)


def uid_processes(uid: int) -> int:
    """How many processes `uid` runs now (RLIMIT_NPROC counts them all)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def child(cfg: dict, argv: list[str]) -> None:
    """Confine this process and exec the command (never returns)."""
    import resource

    try:
        abi = landlock_abi()
        if abi < 1:
            raise OSError("the kernel has no Landlock")
        ws_fd = os.open(cfg["workspace"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        ws_dir = os.open(cfg["workspace"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        tmp_fd = None
        if cfg.get("tmp"):
            tmp_fd = os.open(cfg["tmp"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        uid, gid = cfg.get("uid"), cfg.get("gid")
        if os.geteuid() == 0 and uid is not None:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        me = os.geteuid()
        limits = cfg["limits"]
        for name, value in (
            ("RLIMIT_CPU", limits.get("cpu")),
            ("RLIMIT_AS", limits.get("as")),
            ("RLIMIT_FSIZE", limits.get("fsize")),
            ("RLIMIT_NOFILE", limits.get("nofile")),
            ("RLIMIT_CORE", 0),
        ):
            if value is not None:
                resource.setrlimit(getattr(resource, name), (value, value))
        if limits.get("nproc") and me != 0:
            # No user namespace here: the limit counts every process of the uid.
            budget = uid_processes(me) + limits["nproc"]
            resource.setrlimit(resource.RLIMIT_NPROC, (budget, budget))
        os.fchdir(ws_dir)
        os.close(ws_dir)
        install_filter(network_filter(bool(cfg["net"])))
        restrict(cfg, abi, ws_fd, tmp_fd)
        os.close(ws_fd)
        if tmp_fd is not None:
            os.close(tmp_fd)
    except Exception as exc:  # fail closed: never exec unconfined
        os.write(2, f"sandbox: landlock setup failed: {exc}\n".encode())
        os._exit(126)
    try:
        os.execve(argv[0], argv, cfg["env"])
    except OSError as exc:
        os.write(2, f"sandbox: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)


def my_children() -> list[int]:
    """Processes whose parent is this one (orphans re-parent here: we are a subreaper)."""
    me, kids = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) == me:
                kids.append(int(name))
        except (OSError, ValueError, IndexError):
            pass
    return kids


def kill_tree() -> None:
    """SIGKILL every descendant until none is left (each kill may orphan grandchildren)."""
    for _ in range(1000):
        kids = my_children()
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        os.write(2, b"usage: landlock_helper.py CONFIG -- ARGV...\n")
        return 126
    cfg, argv = marshal.loads(bytes.fromhex(sys.argv[1])), sys.argv[3:]
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:
        return 126  # the bot died before the pdeath signal was armed
    stop = []

    def on_signal(signum: int, frame: object) -> None:
        stop.append(signum)
        kill_tree()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    pid = os.fork()
    if pid == 0:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        child(cfg, argv)
    status = 1
    while True:
        try:
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status = -signal.SIGKILL
            break
    kill_tree()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
