"""Confine one shell command on Linux: rlimits, no capabilities, Landlock and seccomp, then exec.

``exec_command`` runs ``python3 -I -S confine.py [options] -- /bin/sh -c COMMAND``. This file
applies, in order:

1. rlimits: CPU seconds, file size, address space, processes, open files, no core dumps;
2. no capabilities when started as root (an empty bounding set, then none effective or
   permitted): root with CAP_SYS_PTRACE would otherwise read ``/proc/<daemon>/environ``
   past Landlock, and CAP_DAC_OVERRIDE would defeat file modes;
3. ``no_new_privs``: no setuid binary or file capability gives any of that back;
4. Landlock at the best ABI the kernel has: read and execute the system directories and
   ``--ro`` paths, read and write the ``--rw`` paths, nothing else on the file system; from
   ABI 4 no TCP bind or connect; from ABI 6 no signals to, or abstract unix sockets of,
   processes outside the sandbox (the daemon);
5. a seccomp filter: no ``socket()`` of any family (unless ``--network``), no ptrace or
   other processes' memory, no io_uring, no ``setsid``/``setpgid`` (so every descendant stays
   in the process group that is killed after the command), no foreign syscall ABIs;

then execs the command. If any step fails it prints why and exits 126 without running the
command: a command never runs less confined than asked.

It runs with ``-I -S`` (about 10 ms to start) and so may import only the standard library;
the daemon imports the same file for ``probe()``. Everything is ctypes: no dependency.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import sys

SIGKILL = 9  # not signal.SIGKILL: the signal module imports enum, ~5 ms per command
EXIT_REFUSED = 126  # the launcher refused to run the command; the reason is on stderr
MARK = "nanobot-confine:"

SYSTEM_READ_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc")
SYSTEM_WRITE_PATHS = ("/dev/null",)

# --- Landlock (include/uapi/linux/landlock.h) ---------------------------------------------
LL_CREATE_RULESET_VERSION = 1
LL_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE = 1 << 12, 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE  # what a rule on a file may grant
READ_EXEC = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

# The three Landlock syscalls have the same numbers on every architecture (unified table).
NR_LANDLOCK_CREATE_RULESET, NR_LANDLOCK_ADD_RULE, NR_LANDLOCK_RESTRICT_SELF = 444, 445, 446

# --- seccomp -------------------------------------------------------------------------------
PR_SET_PDEATHSIG, PR_GET_SECCOMP, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 21, 22, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECCOMP_MODE_FILTER = 2
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data (little endian: low word first)


# Plain classes, not dataclasses: importing dataclasses (and platform) cost this launcher ~15 ms
# on every command.
class Arch:
    def __init__(self, audit: int, denied: dict[str, int], *, socket: int, signals: dict[str, int],
                 x32_bit: int = 0) -> None:
        self.audit = audit  # AUDIT_ARCH_*: the only syscall ABI the filter lets through
        self.denied = denied  # always refused
        self.socket = socket
        self.signals = signals  # kill, tkill, tgkill: checked by target when Landlock cannot scope signals
        self.x32_bit = x32_bit  # x86_64's x32 ABI shares the arch value: refuse numbers with this bit


_X86_64 = Arch(0xC000003E, {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
    "setsid": 112, "setpgid": 109, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "unshare": 272, "setns": 308, "mount": 165, "pivot_root": 155, "chroot": 161, "kexec_load": 246,
}, socket=41, signals={"kill": 62, "tkill": 200, "tgkill": 234}, x32_bit=0x40000000)
_AARCH64 = Arch(0xC00000B7, {
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
    "setsid": 157, "setpgid": 154, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
    "unshare": 97, "setns": 268, "mount": 40, "pivot_root": 41, "chroot": 51, "kexec_load": 104,
}, socket=198, signals={"kill": 129, "tkill": 130, "tgkill": 131})
ARCHES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


class ConfineError(Exception):
    """A protection could not be applied; the command must not run."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise ConfineError(f"{what} failed: {os.strerror(err)} (errno {err})")
    return result


# --- probing (also used by the daemon) -----------------------------------------------------
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or it is disabled)."""
    if sys.platform != "linux":
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(NR_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LL_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def seccomp_available() -> bool:
    return sys.platform == "linux" and _libc().prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0


def machine() -> str:
    return os.uname().machine.lower()


def current_arch() -> Arch | None:
    return ARCHES.get(machine()) if sys.platform == "linux" else None


class Probe:
    def __init__(self, ok: bool, detail: str) -> None:
        self.ok = ok
        self.detail = detail  # how it confines, or why it cannot


def probe() -> Probe:
    """Whether this machine can confine a command, and how (cheap: two syscalls, no process)."""
    if sys.platform != "linux":
        return Probe(False, f"confinement needs Linux (Landlock and seccomp); this is {sys.platform}")
    if current_arch() is None:
        return Probe(False, f"no seccomp syscall table for the {machine()} architecture")
    abi = landlock_abi()
    if abi < 1:
        return Probe(False, "the kernel offers no Landlock (Linux 5.13+ with landlock in the 'lsm=' list)")
    if not seccomp_available():
        return Probe(False, "the kernel offers no seccomp filters")
    extras = [] if abi >= 6 else ["signals checked by seccomp (Landlock ABI < 6)"]
    return Probe(True, ", ".join([f"Landlock ABI {abi}", "seccomp", *extras]))


# --- the steps -----------------------------------------------------------------------------
def set_rlimits(cpu_seconds: int, max_file_bytes: int, max_memory_bytes: int) -> None:
    limits = [
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_FSIZE, max_file_bytes),
        (resource.RLIMIT_AS, max_memory_bytes),
        (resource.RLIMIT_NOFILE, 1024),
        (resource.RLIMIT_CORE, 0),
        # RLIMIT_NPROC counts every task of the user (the daemon's threads included), so the
        # cap is "what runs now" plus room for a build or a pipeline, not a small absolute.
        (resource.RLIMIT_NPROC, _tasks_now() + 512),
    ]
    for kind, value in limits:
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))


def _tasks_now() -> int:
    """Tasks on the whole machine (an upper bound for this user's), from /proc/loadavg."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return 4096


def _status_caps(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise ConfineError(f"no {field} in /proc/self/status")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """An empty bounding set and no effective, permitted, inheritable or ambient capabilities."""
    libc = _libc()
    if _status_caps("CapEff") or _status_caps("CapPrm"):
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        data = (_CapData * 2)()
        _check(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")
    if _status_caps("CapEff") or _status_caps("CapPrm") or _status_caps("CapAmb"):
        raise ConfineError("capabilities are still held after dropping them")


def set_no_new_privs() -> None:
    _check(_libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi: int) -> int:
    """ABI 1: execute .. make_sym; ABI 2 adds refer, ABI 3 truncate."""
    return ((1 << 13) - 1) | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)


def apply_landlock(abi: int, read_paths: list[str], write_paths: list[str], network: bool) -> None:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        if not network:
            attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP  # handled, and no rule allows any port
    if abi >= 6:
        size = 24
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    fd = _check(libc.syscall(ctypes.c_long(NR_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                             ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        for path in read_paths:
            _add_path_rule(libc, fd, path, READ_EXEC & handled, required=False)
        for path in write_paths:
            _add_path_rule(libc, fd, path, handled, required=True)
        _check(libc.syscall(ctypes.c_long(NR_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(fd)


def _add_path_rule(libc: ctypes.CDLL, ruleset: int, path: str, rights: int, *, required: bool) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        if required:
            raise ConfineError(f"cannot open {path}: {exc.strerror}") from None
        return  # a system directory this machine does not have (/lib32, say)
    try:
        if not os.path.isdir(f"/proc/self/fd/{target}"):
            rights &= FILE_ONLY_RIGHTS  # directory rights on a file are EINVAL
        rule = _PathBeneath(rights, target)
        _check(libc.syscall(ctypes.c_long(NR_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset),
                            ctypes.c_int(LL_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)),
               f"landlock_add_rule({path})")
    finally:
        os.close(target)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(arch: Arch, denied: dict[int, int], guarded_targets: dict[int, list[int]]) -> list[tuple]:
    """BPF: wrong arch -> kill; ``denied`` syscall -> its errno; a ``guarded_targets`` syscall
    whose first argument is one of the listed values -> EPERM; everything else allowed."""
    prog: list[tuple] = [(BPF_LD_W_ABS, 0, 0, OFF_ARCH), (BPF_JEQ_K, 1, 0, arch.audit),
                         (BPF_RET_K, 0, 0, RET_KILL_PROCESS), (BPF_LD_W_ABS, 0, 0, OFF_NR)]
    if arch.x32_bit:
        prog += [(BPF_JGE_K, 0, 1, arch.x32_bit), (BPF_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)]
    for nr, err in denied.items():
        prog += [(BPF_JEQ_K, 0, 1, nr), (BPF_RET_K, 0, 0, RET_ERRNO | err)]
    for nr, values in guarded_targets.items():
        # if nr matches: load arg0, compare with each value, reload nr to continue the chain
        block = [(BPF_LD_W_ABS, 0, 0, OFF_ARG0)]
        for value in values:
            block += [(BPF_JEQ_K, 0, 1, value & 0xFFFFFFFF), (BPF_RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
        block += [(BPF_RET_K, 0, 0, RET_ALLOW)]
        prog += [(BPF_JEQ_K, 0, len(block), nr), *block]
    prog.append((BPF_RET_K, 0, 0, RET_ALLOW))
    return prog


def install_seccomp(prog: list[tuple]) -> None:
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    _check(_libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "installing seccomp")


def shell_filter(arch: Arch, *, network: bool, abi: int, protected_pid: int) -> list[tuple]:
    denied = {nr: errno.EPERM for nr in arch.denied.values()}
    if not network:
        denied[arch.socket] = errno.EACCES
    guarded: dict[int, list[int]] = {}
    if abi < 6:  # Landlock cannot keep signals inside the sandbox: guard the daemon by pid
        pgid = os.getpgid(protected_pid)
        guarded[arch.signals["kill"]] = [protected_pid, -protected_pid, -pgid, -1]
        guarded[arch.signals["tgkill"]] = [protected_pid]
        guarded[arch.signals["tkill"]] = [protected_pid]
    return seccomp_program(arch, denied, guarded)


# --- the launcher --------------------------------------------------------------------------
class Options:
    def __init__(self, command: list[str]) -> None:
        self.read_paths: list[str] = []
        self.write_paths: list[str] = []
        self.cpu_seconds = 65
        self.max_file_bytes = 1 << 30
        self.max_memory_bytes = 4 << 30
        self.network = False
        self.abi = 0  # 0: ask the kernel; lower values pretend an older kernel (tests)
        self.command = command


NUMBER_OPTIONS = {"--cpu": "cpu_seconds", "--fsize": "max_file_bytes", "--as": "max_memory_bytes", "--abi": "abi"}


def parse(argv: list[str]) -> Options:
    if "--" not in argv:
        raise ConfineError("usage: confine.py [--ro P] [--rw P] [--cpu S] [--fsize B] [--as B] [--network] "
                           "[--abi N] -- COMMAND...")
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    options = Options(command)
    flags = iter(opts)
    for flag in flags:
        if flag == "--network":
            options.network = True
            continue
        value = next(flags, None)
        if value is None:
            raise ConfineError(f"{flag} needs a value")
        if flag in ("--ro", "--rw"):
            (options.read_paths if flag == "--ro" else options.write_paths).append(value)
        elif flag in NUMBER_OPTIONS:
            setattr(options, NUMBER_OPTIONS[flag], int(value))
        else:
            raise ConfineError(f"unknown option {flag}")
    if not command:
        raise ConfineError("no command given")
    return options


def confine(options: Options) -> None:
    """Apply every step to this process, or raise ConfineError."""
    arch = current_arch()
    if arch is None:
        raise ConfineError(f"no seccomp syscall table for {machine()}")
    kernel_abi = landlock_abi()
    abi = min(kernel_abi, options.abi) if options.abi else kernel_abi
    if abi < 1:
        raise ConfineError("the kernel offers no Landlock")
    protected = os.getppid()  # the daemon
    _libc().prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)  # the daemon gone: the command goes too
    set_rlimits(options.cpu_seconds, options.max_file_bytes, options.max_memory_bytes)
    drop_capabilities()
    set_no_new_privs()
    prog = shell_filter(arch, network=options.network, abi=abi, protected_pid=protected)
    apply_landlock(abi, [*SYSTEM_READ_PATHS, *options.read_paths], [*SYSTEM_WRITE_PATHS, *options.write_paths],
                   options.network)
    install_seccomp(prog)


def main(argv: list[str]) -> int:
    try:
        options = parse(argv)
        confine(options)
    except (ConfineError, OSError, ValueError) as exc:
        sys.stderr.write(f"{MARK} refused to run the command: {exc}\n")
        return EXIT_REFUSED
    try:
        os.execv(options.command[0], options.command)
    except OSError as exc:
        sys.stderr.write(f"{MARK} cannot run {options.command[0]}: {exc.strerror}\n")
        return 127
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
