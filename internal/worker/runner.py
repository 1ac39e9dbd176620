# pynox runner: the template process and, after fork, the job child.
#
# Started by the Go host as `python3 -I -B -c <boot>`, the boot compiling
# this file from fd 0 (template.go: runnerBoot), with a clean
# environment and its channel to Go on fd 3. Standard library only; ctypes
# for the few syscalls the standard library lacks. Every frame is a 4-byte
# little-endian length and a JSON payload.
#
# Template: imports the operator's preloads, proves it holds no extra
# threads or descriptors, gives up its capabilities, sets no_new_privs,
# attaches the seccomp template layer, then forks "spare" children on
# request and reports their exits. It never runs user code. Where the
# kernel allows it, it is PID 1 of a PID namespace of its own: its pids are
# that namespace's, it reaps any orphan the namespace hands it, and its
# death kills every process in it.
#
# Spare: a forked child that does every request-independent confinement
# step ahead of time (descriptors, session, parent-death signal, the
# Landlock runtime rules, and the seccomp job layer of its kind on top of
# the template layer it inherits: "deny" spares serve jobs without the
# network, "allow" spares jobs with it), warms itself up if the machine
# is idle (see Spare.warm_up), then waits on its own control
# channel (fd 3) for one job. For the job it adds the request's
# environment, rlimits and Landlock grants, enforces Landlock, reports
# "started", runs the code and reports "done".
#
# A session job does not exit after its first code: it keeps its __main__
# and waits on its channel for "step" frames, each carrying the step's code
# and a fresh pair of output pipes, until the channel closes or a step ends
# the process (an exit, a crash, a kill).
#
# Host functions: a job that declares them gets a `pynox_host` module whose
# functions send a "call" frame and block until Go writes the "reply".
import _signal
import _socket
import _thread
import _ast
import array
import binascii
import collections
import builtins
import ctypes
import fcntl
import gc
import io
import json
import linecache
import mmap
import os
import re
import resource
import select
import signal
import socket
import struct
import sys
import traceback
import types

PROTO = 1
MIN_PYTHON = (3, 9)
FD = 3  # the template's channel to Go; in a child, the child's own channel
BELL = 4  # in a child: a pipe whose bytes tell Go to read the channel
RUNTIME_FD_BASE = 64  # the template's O_PATH descriptors of runtime paths start here
MAX_FRAME = 8 << 20
MSG_CAP = 4096
MAX_FILES = 4096  # a job's descriptor limit (RLIMIT_NOFILE)
MAX_SIGPENDING = 64  # a job's limit of queued signals (RLIMIT_SIGPENDING)
RESERVE = 1 << 20  # bytes kept back to report a MemoryError with
TB_FRAMES = 100  # innermost frames printed of a deeper traceback
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MAX_CALL = 1 << 20  # bytes of a host call's JSON arguments, and of its result
INLINE_FRAME = 32 << 10  # a frame this size fits the control socket's buffer (child.go: inlineFrame)
MAX_VALUE = 1 << 20  # bytes of the last expression's JSON value (value.go: MaxValue)
MAX_VALUE_REPR = 64 << 10  # bytes of its repr when it has no JSON value (value.go: MaxValueRepr)
MAX_VALUE_DEPTH = 256  # nesting of a JSON value (wire.go: MaxCallDepth)
MAX_VALUE_NUMBER = 4300  # characters of a number in it (wire.go: MaxCallNumber)

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LANDLOCK_RULE_PATH_BENEATH = 1
# landlock_restrict_self's flags (ABI 7): no audit record of the job's
# own denials, nor of the domains it may nest under its own.
LANDLOCK_RESTRICT_SELF_LOG_SAME_EXEC_OFF = 1 << 0
LANDLOCK_RESTRICT_SELF_LOG_SUBDOMAINS_OFF = 1 << 2
SIGKILL = int(signal.SIGKILL)  # a plain int: a spare touches no enum objects
SIGINT = int(signal.SIGINT)


# The functions and constants a spare's prepare calls, by module-level
# names: a fresh process that looks up os.dup2 writes to the page of the
# name "dup2" (its reference count) and to the interpreter's type cache; a
# global name costs it neither.
_os_open, _os_dup2, _os_close, _os_closerange = os.open, os.dup2, os.close, os.closerange
_os_setsid, _os_getppid, _os_exit = os.setsid, os.getppid, os._exit
_O_RDONLY = os.O_RDONLY
_setrlimit = resource.setrlimit
_RLIMIT_CORE, _RLIMIT_NOFILE, _RLIMIT_SIGPENDING = resource.RLIMIT_CORE, resource.RLIMIT_NOFILE, resource.RLIMIT_SIGPENDING
_RLIMIT_RTPRIO, _RLIMIT_NICE, _RLIMIT_MEMLOCK = resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE, resource.RLIMIT_MEMLOCK
_get_ident = _thread.get_ident
# os.environ's encoding and its mapping of bytes (os.environ[k] = v is
# putenv and a store in it; see Spare.confine).
_FS_ENCODING, _os_putenv, _ENVIRON_DATA = sys.getfilesystemencoding(), os.putenv, os.environ._data
_signal_signal = _signal.signal


# The same for the template's own loop (_socketpair and the names after
# it), which runs once per fork and once per exit: after each fork every
# page it writes is copied once more (the spare still shares it), and a
# module object's reference count, or an enum member's, is one more such
# page.
_socketpair = _socket.socketpair
_AF_UNIX, _SOCK_STREAM = int(socket.AF_UNIX), int(socket.SOCK_STREAM)
_SOL_SOCKET, _SCM_RIGHTS = int(socket.SOL_SOCKET), int(socket.SCM_RIGHTS)
_FIVE_FDS = struct.Struct("5i")  # a spare's five descriptors, as SCM_RIGHTS data
_os_pipe, _os_getpid, _os_fork, _os_pidfd_open = os.pipe, os.getpid, os.fork, getattr(os, "pidfd_open", None)
_os_read, _os_wait4, _os_waitid, _os_waitpid = os.read, os.wait4, getattr(os, "waitid", None), os.waitpid
_WIFSIGNALED, _WTERMSIG, _WEXITSTATUS = os.WIFSIGNALED, os.WTERMSIG, os.WEXITSTATUS
_POLLIN = select.POLLIN
_P_ALL, _WNOHANG = os.P_ALL, os.WNOHANG
_WAIT_PEEK = os.WEXITED | os.WNOHANG | os.WNOWAIT


class SetupError(Exception):
    """A confinement step could not be applied: no user code may run."""


def _check(ret, what):
    if ret < 0:
        e = ctypes.get_errno()
        raise SetupError("%s: %s" % (what, os.strerror(e)))
    return ret


# ---------------------------------------------------------------- framing

def _frame(payload):
    return struct.pack("<I", len(payload)) + payload


def _pack(obj):
    return _frame(json.dumps(obj, separators=(",", ":")).encode())


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _ring():
    try:
        os.write(BELL, b"!")
    except OSError:
        pass  # Go then learns of the frame when the bell closes at exit


def _read_exact(fd, n, buf=b""):
    chunks = [buf] if buf else []
    have = len(buf)
    while have < n:
        b = os.read(fd, n - have)
        if not b:
            return None
        chunks.append(b)
        have += len(b)
    return b"".join(chunks)


def _split(buf):
    """Returns the payload of the first whole frame in buf and the bytes
    after it; (None, buf) when buf holds no whole frame yet."""
    if len(buf) < 4:
        return None, buf
    (n,) = struct.unpack("<I", buf[:4])
    if n > MAX_FRAME:
        raise ValueError("frame too large")
    if len(buf) < 4 + n:
        return None, buf
    return buf[4:4 + n], buf[4 + n:]


# The template's own frames: the host's two fork requests, in their exact
# bytes (template.go: forkFrames; anything else is a protocol error), and
# the template's reports, formatted without the json module. After each
# fork every page the template writes is copied once more (the spare still
# shares it), and encoding or decoding JSON touches some sixty pages of the
# json module and its objects; these frames touch almost none.
_STARTED = _frame(b'{"t":"started"}')  # a spare's "started" report
_FORK_KINDS = {b'{"t":"fork","kind":"deny"}': "deny", b'{"t":"fork","kind":"allow"}': "allow"}
# The fork requests of a spare for a job with a mount namespace (see
# Spare.enter_namespace), forked for that job alone.
# The frame that hands a ready ns spare the namespace to enter before its
# job (worker/mountns.go: enterFrame; see Spare.pre_enter).
_ENTER_FRAME = _frame(b'{"t":"enter"}')
_FORK_NS_KINDS = {b'{"t":"fork","kind":"deny","ns":true}': "deny", b'{"t":"fork","kind":"allow","ns":true}': "allow"}


def _recv(fd):
    hdr = _read_exact(fd, 4)
    if hdr is None:
        return None
    (n,) = struct.unpack("<I", hdr)
    if n > MAX_FRAME:
        raise ValueError("frame too large")
    body = _read_exact(fd, n)
    if body is None:
        return None
    # By the C scanner alone (see _scan_frame): a host call's reply is
    # read here, some microseconds less per call than json.loads.
    return _scan_frame(body)


# The json module's C scanner, called directly by _scan_frame.
_SCAN = json.decoder.JSONDecoder().scan_once


def _scan_frame(body):
    """The JSON value of a frame's payload, as json.loads reads it, but by
    the C scanner alone: json.loads adds Python calls and regular
    expressions, each a few more pages that a fresh process copies."""
    return _scan_text(body.decode())


def _scan_text(text):
    """_scan_frame of a payload already decoded."""
    try:
        obj, end = _SCAN(text, 0)
    except StopIteration:
        raise ValueError("a frame is not JSON") from None
    if end != len(text):
        raise ValueError("a frame has data after its JSON value")
    return obj


# What _recv_with_fds receives into: one buffer, allocated in the template
# (a spare writes only the pages its frame fills, where a fresh 64 KiB
# bytes object would cost it the C heap's allocation and its pages), and
# room for as many descriptors as one message can carry (the kernel's
# SCM_MAX_FD): a job's 64 grants come with its scratch directory and its
# mount namespace's two, and a shorter list would be cut off.
_RECV_BUF = bytearray(64 << 10)
_RECV_BUFS = (_RECV_BUF,)
_RECV_VIEW = memoryview(_RECV_BUF)
_RECV_ANC = socket.CMSG_SPACE(253 * 4)
_FRAME_HEADER = struct.Struct("<I")


def _await_input(fd):
    """Blocks until fd has something to read (or is closed). A process
    that waits for the host's next frame waits here, not in a read of the
    control socket: a reader blocked on the socket is woken each time the
    host reads what the process wrote on it (the kernel tells the socket's
    waiters that it has room again), an extra wake-up per step and per
    host call, while poll asked only for input is not."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    p.poll()


_os_umask = os.umask


def _job_umask(mask):
    """os.umask as jobs have it: a mask without 022 is refused with a
    PermissionError that says why. (seccomp refuses it anyway, but the
    kernel's umask cannot fail, so the C library returns -1 and sets no
    errno: Python would raise OSError with errno 0.)"""
    if isinstance(mask, int) and mask & 0o022 != 0o022:
        raise PermissionError(1, "a job's umask must keep 022 (the group and others never get write "
                                 "permission on what a job creates): %#o" % mask)
    return _os_umask(mask)


def _shared_writable():
    """The shared mappings of this process that are writable or could be
    made so (/proc/self/smaps), as their lines. Not only "rw-s": a shared
    mapping of a file opened for writing, mapped read-only ("r--s"),
    keeps VM_SHARED (VmFlags "sh") and mprotect, which a job may call,
    makes it writable; a shared mapping of a file opened read-only has
    neither "sh" nor "mw" and stays read-only. /proc/self/maps first:
    smaps costs ~10 ms with pandas mapped, and is read only when maps
    shows a shared mapping ("s")."""
    out = []
    with open("/proc/self/maps", "rb") as f:
        if not any(line.split(None, 2)[1][3:4] == b"s" for line in f):
            return out
    with open("/proc/self/smaps", "rb") as f:
        head = None
        for line in f:
            fields = line.split()
            if not fields:
                continue
            if not fields[0].endswith(b":"):
                head = line
                continue
            if fields[0] == b"VmFlags:" and head is not None:
                flags = fields[1:]
                perms = head.split(None, 2)[1:2]
                if b"sh" in flags or (b"ms" in flags and b"mw" in flags) or (
                        perms and perms[0][1:2] == b"w" and perms[0][3:4] == b"s"):
                    out.append(head.decode("utf-8", "replace").strip())
                head = None
    return out


def _recv_with_fds(sock, fd):
    """Reads one frame whose first bytes may carry SCM_RIGHTS descriptors."""
    got, anc, _flags, _addr = sock.recvmsg_into(_RECV_BUFS, _RECV_ANC)
    fds = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(memoryview(data)[:len(data) - len(data) % 4].cast("i"))
    if not got:
        return None, fds
    if got < 4:
        data = _read_exact(fd, 4, bytes(_RECV_VIEW[:got]))
        if data is None:
            return None, fds
        got, head = 4, data
    else:
        head = _RECV_BUF
    (n,) = _FRAME_HEADER.unpack_from(head)
    if n > MAX_FRAME:
        raise ValueError("frame too large")
    if got >= 4 + n and head is _RECV_BUF:
        # The whole frame came at once (the common case), bytes after it
        # included, which _scan_text refuses.
        return _scan_text(str(_RECV_VIEW[4:got], "utf-8")), fds
    rest = bytes(_RECV_VIEW[4:got]) if head is _RECV_BUF else b""
    body = _read_exact(fd, n, rest)
    if body is None:
        return None, fds
    return _scan_frame(body), fds


# What the template runs through the job path before it forks anything: a
# trivial job, one that fails with a traceback, and one whose last
# statement is not an expression (compiled through its syntax tree, see
# _compile_split).
_REHEARSALS = ["print(sum(range(100)))\n", "def f():\n    return 1 / 0\n\nf()\n", "x = 1\n"]


# A job frame, as the host writes one, for rehearsals of its receipt.
_REHEARSAL_FRAME = (b'{"t":"job","code":"print(1)\\n","name":"<code>","script":false,"argv":[],'
                    b'"env":{"TMPDIR":"/tmp","HOME":"/tmp"},"path":[],"network":false,"limits":'
                    b'{"memory":1,"fsize":1,"cpu":1},"session":false,"step":1,"rules":[1]}')


def _rehearse_receipt():
    """Runs a spare's receipt of its job (a socket object on the channel,
    a frame with a descriptor, its JSON) over a socket pair of its own."""
    a, b = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sock = socket.socket(fileno=b.detach())
    try:
        body = _pack({"t": "job", "code": "print(1)\n", "name": "<code>", "script": False, "argv": [], "env": {},
                      "path": [], "network": False, "rules": [1], "limits": {"memory": 1, "fsize": 1, "cpu": 1},
                      "session": False, "step": 1})
        a.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno()]))])
        _job, fds = _recv_with_fds(sock, sock.fileno())
        for fd in fds:
            os.close(fd)
    finally:
        a.close()
        sock.close()


def _bind_symbols():
    """Calls, harmlessly, the C library functions that a spare calls and
    the template otherwise does not (getppid, dup3, select and its
    __fdelt_chk): the interpreter binds them lazily, and each first call
    costs a symbol lookup and a write to its GOT, once here instead of in
    every spare. (setsid is left to the spares: the template keeps its
    session.)"""
    os.getppid()
    fd = os.dup(FD)
    try:
        os.dup2(FD, fd, inheritable=False)
    finally:
        os.close(fd)
    select.select([FD], [], [], 0)


# ---------------------------------------------------------------- template

class Template:
    def __init__(self):
        self.sock = socket.socket(fileno=FD)
        self.children = {}  # pidfd -> pid
        self.cfg = None
        self.runtime_fds = []  # [(fd, access)]
        self.runtime_range = None  # [lo, hi): runtime_fds, when consecutive
        self.seccomp = {}
        self.setup_error = None
        self.ll_args = None  # see landlock_args
        self.blocks = None  # see spare_blocks
        self.close_plan = None  # see Spare.prepare
        self.job_files = MAX_FILES  # a job's RLIMIT_NOFILE (see _raise_files_limit)
        self.plans = {}  # see spare_plan
        self.reserve = None  # see spare_plan
        self.spare_proto = None  # a fresh Spare each child starts from (see init)
        self.spare_vm = 0  # a spare's address space before its job (see init)

    def send(self, obj):
        self.sock.sendall(_pack(obj))

    def fatal(self, msg):
        try:
            self.send({"t": "fatal", "msg": msg})
        finally:
            self.shutdown(2)

    @staticmethod
    def hygiene():
        threads = len(os.listdir("/proc/self/task"))
        extra = []
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= FD:
                continue
            try:
                target = os.readlink("/proc/self/fd/" + name)
            except OSError:
                continue  # the listing's own descriptor, closed by now
            extra.append("%d -> %s" % (fd, target))
        return threads, extra

    def init(self):
        msg = _recv(FD)
        if msg is None:
            os._exit(0)
        pin_error = _pin_cpus(msg.get("cpus"))
        self.job_files = _raise_files_limit()
        if msg.get("t") != "init" or msg.get("v") != PROTO:
            self.fatal("protocol version mismatch: template speaks %d, host sent %r" % (PROTO, msg.get("v")))
        if sys.version_info < MIN_PYTHON:
            self.fatal("pynox needs CPython %d.%d or newer (socket.recv_fds, os.pidfd_open); %s is %d.%d.%d" % (
                MIN_PYTHON + (sys.executable,) + tuple(sys.version_info[:3])))
        for d in reversed(msg.get("package_dirs") or []):
            sys.path.insert(0, d)
        preloaded = []
        mpl_dir = _mpl_config_dir(msg.get("tmp")) if msg.get("preload") else None
        for mod in msg.get("preload") or []:
            try:
                __import__(mod)
            except BaseException as e:  # noqa: BLE001 - report any import failure
                self.fatal("preload %s failed: %s: %s" % (mod, type(e).__name__, e))
            threads, extra = self.hygiene()
            if threads != 1:
                self.fatal("preload %s left %d threads running (a template must be single-threaded)" % (mod, threads))
            if extra:
                self.fatal("preload %s left descriptors open: %s" % (mod, ", ".join(extra)))
            shared = _shared_writable()
            if shared:
                # Every process forked from the template would map it at
                # one address, writable: memory every job and session of
                # every tenant shares (review 22).
                self.fatal("preload %s left writable shared memory mapped (every job would share it, "
                           "and mprotect makes a read-only view of it writable): %s" % (mod, "; ".join(shared)))
            preloaded.append(mod)
        if mpl_dir is not None:
            _end_mpl_config_dir(mpl_dir)
        # Every job's umask keeps the group and others from writing what
        # it creates (the seccomp layer then refuses any umask without
        # 022): jobs cannot chmod, and a file's creation mode is its mode
        # for good (review 22). Set after the preloads, which could change
        # it; a stricter umask stays.
        os.umask(os.umask(0o022) | 0o022)
        os.umask = _job_umask
        threads, extra = self.hygiene() if not preloaded else (1, [])  # each preload was checked
        if threads != 1 or extra:
            self.fatal("runner started with %d threads and stray descriptors %s" % (threads, extra))
        paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
        paths += [p for p in sys.path if p]
        for mod in preloaded:
            m = sys.modules.get(mod)
            f = getattr(m, "__file__", None)
            if f:
                paths.append(os.path.dirname(f) if os.path.basename(f).startswith("__init__.") else f)
        self.send({
            "t": "hello", "v": PROTO, "pid": os.getpid(),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": os.path.realpath(sys.executable),
            "paths": paths, "preloaded": preloaded,
            "cpus": sorted(os.sched_getaffinity(0)), "pin_error": pin_error,
        })
        cfg = _recv(FD)
        if cfg is None:
            os._exit(0)
        if cfg.get("t") != "policy":
            self.fatal("expected policy, got %r" % cfg.get("t"))
        self.cfg = cfg
        # Runtime rule paths are opened once here; each spare adds them to its
        # own fresh rulesets and closes them before any user code runs.
        # They live at high descriptor numbers, clear of the 0-4 a spare
        # gives its own channels.
        for path, access in cfg["runtime_rules"]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path that does not exist grants nothing
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, RUNTIME_FD_BASE)
            os.close(fd)
            self.runtime_fds.append((high, access))
        # Consecutive, as they are opened one after another above the
        # template's own: a spare then closes them with one close_range.
        fds = sorted(fd for fd, _ in self.runtime_fds)
        if fds and fds == list(range(fds[0], fds[-1] + 1)):
            self.runtime_range = (fds[0], fds[-1] + 1)
        for key, b in cfg["seccomp"].items():
            raw = bytes.fromhex(b)
            buf = ctypes.create_string_buffer(raw, len(raw))
            prog = SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
            self.seccomp[key] = (prog, buf)
        # Capabilities, no_new_privs and the SIGXFSZ disposition are not
        # request-dependent: the template, which needs none of what it gives
        # up, does it once and checks it, and every child inherits it across
        # fork (none of it can come back without an execve). A failure here,
        # or a policy the host could not build, is not fatal to the template
        # but to every job: each spare reports it as a setup error.
        try:
            drop_capabilities(cfg["cap_last"], cfg["syscalls"])
            _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
            if _prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
                raise SetupError("no_new_privs is not set")
            # Not dumpable: a crash (SIGSEGV, SIGABRT, seccomp's SIGSYS)
            # must not reach the host's core handler. RLIMIT_CORE=0 stops
            # core files only; a core_pattern that pipes to a program
            # (systemd-coredump, apport) ignores it, and the kernel runs
            # that program as root outside every sandbox, reading the
            # crashed job's memory. Inherited by every spare across fork;
            # seccomp denies PR_SET_DUMPABLE, so no job can undo it.
            _check(_prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
            if _prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
                raise SetupError("the process is still dumpable")
            # A write beyond RLIMIT_FSIZE must fail with EFBIG, not kill the
            # job (CPython ignores SIGXFSZ already; this does not rely on it).
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            for err in (cfg["landlock"].get("error"), cfg.get("seccomp_error")):
                if err:
                    raise SetupError(err)
            # The long, policy-independent seccomp layer, attached once here
            # and inherited by every spare, which adds only the short job
            # layer of its kind: attaching costs the kernel time in
            # proportion to a filter's length. It is an allow list: what
            # the template itself does (fork, pidfd_open, socketpair,
            # sendmsg with SCM_RIGHTS, waitpid, poll) and what a spare does
            # before its job layer goes on (PR_SET_PDEATHSIG,
            # PR_SET_SECCOMP) are on it; everything else fails for the
            # template too.
            prog, _buf = self.seccomp["template"]
            _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp (template layer)")
        except SetupError as e:
            self.setup_error = str(e)
        except BaseException as e:  # noqa: BLE001 - reported per job
            self.setup_error = "%s: %s" % (type(e).__name__, e)
        # The job's standard streams, line-buffered like a terminal's. They
        # name descriptors 0-2, which in a spare are its own.
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="strict", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        # Rehearse the job path here once, a failing job's included: the
        # state CPython builds lazily on a first compile, print, traceback
        # or JSON round trip is then built before the fork, shared by every
        # spare, instead of being built (and its pages copied) in each. It
        # halves what a spare's own warm-up costs (~230 page faults and
        # 2.4 ms of CPU down to ~120 and 0.8 ms here).
        # First, the functions of a plain job's path laid out together,
        # from fresh pools (see _relayout), so that the rehearsals below
        # specialise the new ones.
        _fill_pools()
        _relayout(_SPARE_PATH)
        self.close_plan = _close_ranges({0, 1, 2, FD, BELL} | {fd for fd, _ in self.runtime_fds})
        rehearsal = Spare(self, "deny", os.getpid(), -1, -1, -1, -1)
        self.spare_blocks()
        rehearsal.rehearse(_REHEARSALS)
        if not self.setup_error:
            # The same for the ctypes calls that build a spare's ruleset.
            try:
                for kind in self.seccomp:
                    if kind != "template":
                        self.spare_plan(kind)
                os.close(rehearsal.new_ruleset())
            except BaseException:  # noqa: BLE001 - each spare reports its own failure
                pass
        # And for the receipt of a job frame, descriptors and all.
        try:
            _rehearse_receipt()
            _bind_symbols()
            # A spare's fresh numpy state (see new_main): numpy's lazily
            # built state of set_state and frombuffer, built here.
            for _ in range(10):
                _reseed_numpy()
        except BaseException:  # noqa: BLE001 - an optimisation only
            pass
        # The Spare object every child starts from, built once here (each
        # child sets its own descriptors on its own copy, see fork_spare):
        # the template never uses it, so its pages stay as built.
        self.spare_proto = Spare(self, "deny", 0, -1, -1, -1, -1)
        gc.collect()
        gc.freeze()
        _trim_heap()
        # Every template forks for jobs and sessions alike (~40 ms once
        # for a pandas heap, before "ready").
        _collapse_huge_pages()
        err = _copy_file_ptes_at_fork(_RUNTIME_FILES)
        if err and not self.setup_error:
            self.setup_error = err
        # The last before the first fork: a spare's new objects from fresh
        # pools.
        _fill_pools()
        # Last, as the template forks from here on: no shared memory a job
        # could write, whoever mapped it after the preloads' own checks
        # (the runner's MemoryError reserve was MAP_SHARED, review 22; a
        # preload may map lazily, on a first collection or call).
        shared = _shared_writable()
        if shared:
            self.fatal("the template has writable shared memory mapped (every job would share it): %s" % "; ".join(shared))
        # The address space every spare starts from: the template's, as it
        # forks (a spare maps nothing of its own before its job; see
        # Spare.prepare).
        self.spare_vm = _address_space()
        self.send({"t": "ready"})

    def loop(self):
        poller = select.poll()
        poller.register(FD, select.POLLIN)
        buf = b""
        while True:
            for fd, _ev in poller.poll():
                if fd == FD:
                    try:
                        chunk = _os_read(FD, 65536)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        self.shutdown()
                    buf += chunk
                    while True:
                        payload, buf = _split(buf)
                        if payload is None:
                            break
                        kind, ns = _FORK_KINDS.get(payload), False
                        if kind is None:
                            kind, ns = _FORK_NS_KINDS.get(payload), True
                        if kind is None:
                            self.fatal("unexpected frame from the host: %r" % payload[:200])
                        pidfd = self.fork_spare(kind, ns)
                        if pidfd is not None:
                            poller.register(pidfd, _POLLIN)
                else:
                    pid = self.children.pop(fd)
                    poller.unregister(fd)
                    # wait4: the process's rusage, as the kernel counted
                    # it, goes to the host with its exit (a job's result
                    # "usage"; never the job's own word).
                    usage = b""
                    try:
                        _, status, ru = _os_wait4(pid, 0)
                        usage = b',"cpu_us":%d,"maxrss_kb":%d,"minflt":%d' % (
                            round((ru.ru_utime + ru.ru_stime) * 1e6), ru.ru_maxrss, ru.ru_minflt)
                    except ChildProcessError:
                        status = 0
                    _os_close(fd)
                    if _WIFSIGNALED(status):
                        rep = b'{"t":"exit","pid":%d,"signal":%d%s}' % (pid, _WTERMSIG(status), usage)
                    else:
                        rep = b'{"t":"exit","pid":%d,"code":%d%s}' % (pid, _WEXITSTATUS(status), usage)
                    self.sock.sendall(_FRAME_HEADER.pack(len(rep)) + rep)
            self.reap_orphans()

    def reap_orphans(self):
        """Reaps exited children that are not spares of ours. As PID 1 of
        its own PID namespace the template inherits every orphan in it; no
        spare can fork, so there should be none, but a zombie must never
        pile up. Spares are left to their pidfds (their status is
        reported), so the first zombie is only looked at (WNOWAIT) and the
        search stops at one of ours: its pidfd is readable, and the next
        pass, right after it is reaped, goes on."""
        ours = None
        while True:
            try:
                info = _os_waitid(_P_ALL, 0, _WAIT_PEEK)
            except OSError:  # ECHILD: no child at all
                return
            if info is None or info.si_pid == 0:
                return
            if ours is None:
                ours = set(self.children.values())
            if info.si_pid in ours:
                return
            try:
                _os_waitpid(info.si_pid, _WNOHANG)
            except OSError:
                return

    def shutdown(self, code=0):
        """Kills every child and waits for each before exiting, so that none
        is left a zombie for whoever inherits it. (As PID 1 of its own
        namespace, its exit then makes the kernel kill and reap anything
        else in the namespace.)"""
        pids = list(self.children.values())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except OSError:
                break
        os._exit(code)

    def landlock_args(self):
        """The ctypes argument blocks of a spare's Landlock calls, built
        once, before the first fork: the syscall numbers, each kind's
        ruleset attributes (by reference) and their size, and one
        path-beneath rule (by reference) per runtime descriptor. A spare
        then makes its ruleset without building a ctypes object."""
        if self.ll_args is None:
            ll = self.cfg["landlock"]
            attrs = {}
            for kind in ("deny", "allow"):
                net = ll["handled_net_deny"] if kind == "deny" else 0
                attr = RulesetAttr(ll["handled_fs"], net, ll["scoped"])
                attrs[kind] = ctypes.byref(attr)  # holds attr
            size = 24 if ll["abi"] >= 6 else (16 if ll["abi"] >= 4 else 8)
            rules = tuple(ctypes.byref(PathBeneath(access, rfd)) for rfd, access in self.runtime_fds)
            nr = self.cfg["syscalls"]
            self.ll_args = (nr["landlock_create_ruleset"], attrs, size, nr["landlock_add_rule"], rules)
        return self.ll_args

    def spare_plan(self, kind):
        """What a spare of kind takes from the template in its prepare, in
        one tuple (built once per kind, before the first fork): the runtime
        descriptors' range (or None) and list, a job's descriptor limit,
        the address of the kind's seccomp job layer, the parent-death
        signal's block and its address, the Landlock calls' arguments
        (see landlock_args), and the address space a spare keeps back to
        report a MemoryError with (see Spare.prepare; mapped once here,
        never touched, and each spare's own once forked). A spare unpacks it into local variables: each
        attribute it would look up instead costs a fresh process a write
        to the attribute name's page and to the interpreter's type cache."""
        plan = self.plans.get(kind)
        if plan is None:
            prog, _buf = self.seccomp[kind]
            _rule, _ref, sig, addr = self.spare_blocks()
            create, attrs, size, add, rules = self.landlock_args()
            if self.reserve is None:
                # Private: mmap.mmap(-1, n) is MAP_SHARED by default, one
                # region of memory the template and every process forked
                # from it (jobs and sessions of every tenant) would share,
                # writable, at one address (review 22).
                self.reserve = mmap.mmap(-1, RESERVE, flags=mmap.MAP_PRIVATE)
            plan = (self.runtime_range, [fd for fd, _ in self.runtime_fds], self.job_files,
                    ctypes.addressof(prog), sig, addr, create, attrs[kind], size, add, rules, self.reserve)
            self.plans[kind] = plan
        return plan

    def spare_blocks(self):
        """The ctypes blocks a spare fills in rather than builds (see
        landlock_args): a path-beneath rule for a job's grants and its
        reference, and the int PR_GET_PDEATHSIG writes and its address.
        Built once, before the first fork; a spare writes its own copy."""
        if self.blocks is None:
            rule, sig = PathBeneath(0, -1), ctypes.c_int(0)
            self.blocks = (rule, ctypes.byref(rule), sig, ctypes.addressof(sig))
        return self.blocks

    def fork_spare(self, kind, ns=False):
        # (Functions and constants by module-level names: see _socketpair.)
        a, b = _socketpair(_AF_UNIX, _SOCK_STREAM)  # no socket.socket objects
        ctl_parent, ctl_child = a.detach(), b.detach()
        out_r, out_w = _os_pipe()
        err_r, err_w = _os_pipe()
        bell_r, bell_w = _os_pipe()
        parent = _os_getpid()
        pid = _os_fork()
        if pid == 0:
            # The child must never return into the template's loop, not
            # even when printing what went wrong raises (a job's exception
            # may define __notes__ or its class's names as properties).
            try:
                try:
                    # The spare object the template built before its first
                    # fork (see spare_proto), given this fork's values: a
                    # fresh one would cost some sixty page faults of new
                    # objects and their dictionary.
                    spare = self.spare_proto
                    if spare is None:
                        spare = Spare(self, kind, parent, ctl_child, out_w, err_w, bell_w, ns)
                    else:
                        spare.kind, spare.ns, spare.parent = kind, ns, parent
                        spare.ctl, spare.out_w, spare.err_w, spare.bell_w = ctl_child, out_w, err_w, bell_w
                    spare.main()
                except BaseException:  # noqa: BLE001
                    traceback.print_exc()
            finally:
                os._exit(70)
        for fd in (ctl_child, out_w, err_w, bell_w):
            _os_close(fd)
        try:
            pidfd = _os_pidfd_open(pid)
        except OSError as e:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            for fd in (ctl_parent, out_r, err_r, bell_r):
                os.close(fd)
            self.send({"t": "spare_error", "msg": "pidfd_open: %s" % e})
            return None
        spare = b'{"t":"spare","pid":%d,"kind":"%s"}' % (pid, kind.encode())
        self.sock.sendmsg([_FRAME_HEADER.pack(len(spare)) + spare],
                          [(_SOL_SOCKET, _SCM_RIGHTS, _FIVE_FDS.pack(ctl_parent, out_r, err_r, pidfd, bell_r))])
        for fd in (ctl_parent, out_r, err_r, bell_r):
            _os_close(fd)
        self.children[pidfd] = pid
        return pidfd


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("access", ctypes.c_uint64), ("fd", ctypes.c_int32)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# ---------------------------------------------------------------- job child

class Spare:
    def __init__(self, tpl, kind, parent, ctl, out_w, err_w, bell_w, ns=False):
        self.tpl = tpl
        self.kind = kind
        # A spare forked for a job with a mount namespace: it enters the
        # namespace when the job arrives, and attaches its job layer only
        # then (the job layer denies setns and capset).
        self.ns = ns
        self.parent = parent
        self.vm = 0
        self.nr = tpl.cfg["syscalls"]
        self.ctl, self.out_w, self.err_w, self.bell_w = ctl, out_w, err_w, bell_w
        self.error = None
        # An ns spare that entered a leased namespace before its job (see
        # pre_enter): the working directory to return to once the job's
        # mounts are attached, else None.
        self.entered_cwd = None
        self.ruleset = -1
        self.sock = None
        self.step = 0
        self.globals = None
        self.exited = False
        self.value = None  # the last expression's report: ("value", JSON bytes) or ("value_repr", str)
        self.null_w = -1
        self.reserve = None
        self.started_frame = b""
        self.done_extra = {}  # fields a dump adds to its report
        # Held by a host call until its reply arrives, and by the runner
        # from a step's report until the next step begins: frames on the
        # channel never interleave, and no thread reads another's answer.
        self.host_lock = _thread.allocate_lock()
        self.channels = False  # descriptors 0-4 are the spare's own
        # SIGINT (the pool's interrupt) raises KeyboardInterrupt only while
        # the job's code runs on the main thread (int_mode 1); anywhere
        # else (the runner's own code, a host call waiting for its answer)
        # it is kept pending, and raised when the job's code resumes.
        self.int_mode = 0
        self.int_pending = False
        self.main_ident = 0
        self.calls = None  # the job's _HostCalls, once it has host functions
        self.one_shot = False  # a job that is not a session: see run

    def hold_interrupt(self):
        """Keeps an interrupt pending while the runner talks to the host on
        the main thread; returns what release_interrupt restores."""
        on_main = _thread.get_ident() == self.main_ident
        mode = self.int_mode
        if on_main:
            self.int_mode = 2
        return on_main, mode

    def release_interrupt(self, held, deliver):
        """Restores what hold_interrupt kept; with deliver, raises the
        interrupt that came meanwhile if the job's code was running."""
        on_main, mode = held
        if on_main:
            self.int_mode = mode
        if deliver and _thread.get_ident() == self.main_ident and self.int_mode == 1 and self.int_pending:
            self.int_pending = False
            self.int_mode = 0
            raise KeyboardInterrupt

    def on_sigint(self, signum, frame):
        """The SIGINT handler: KeyboardInterrupt in the job's code, once;
        elsewhere the interrupt waits for the job's code to resume."""
        if self.int_mode == 1:
            self.int_mode = 0  # the runner's report that follows is never hit
            raise KeyboardInterrupt
        self.int_pending = True

    def send(self, obj):
        """Writes a frame to the control channel and rings the bell so that
        Go reads it now. ("started" is written without a ring: Go reads it
        with the frame that follows, and a job that finishes fast wakes the
        host once instead of twice.)"""
        _write_all(FD, _pack(obj))
        _ring()

    def main(self):
        try:
            self.prepare()
        except BaseException as e:  # noqa: BLE001 - reported as SandboxSetupError
            self.error = "%s: %s" % (type(e).__name__, e)
        if not self.channels:
            # Descriptor 3 may still be the template's channel: say nothing
            # on it. The host sees the spare die before its job started.
            os._exit(72)
        # The template's socket object names descriptor 3, which is now the
        # spare's own channel: a new object would cost its allocation and
        # the template's would still have to be detached.
        sock = self.sock = self.tpl.sock
        if self.error is None:
            try:
                self.warm_up()
            except BaseException as e:  # noqa: BLE001 - reported as SandboxSetupError
                self.error = "%s: %s" % (type(e).__name__, e)
        job, fds = _recv_with_fds(sock, FD)
        if job is not None and job.get("t") == "enter":
            job, fds = self.pre_enter(sock, fds)
        if job is None:
            os._exit(0)
        restore_fd = -1
        if job.get("restore") and fds:
            restore_fd = fds.pop()  # the dump to restore, after the grants (child.go: Run)
        if self.error is None:
            try:
                self.confine(job, fds)
            except BaseException as e:  # noqa: BLE001 - reported as SandboxSetupError
                self.error = "%s: %s" % (type(e).__name__, e)
        if self.error is not None:
            self.send({"t": "setup_error", "msg": self.error})
            os._exit(71)
        _write_all(FD, self.started_frame)  # no ring: see send
        self.step = int(job.get("step") or 1)
        self.one_shot = not job.get("session")
        _DISPLAY.spare = self
        if job.get("script"):
            self.globals["__file__"] = job["name"]
        for p in reversed(job.get("path") or []):
            sys.path.insert(0, p)
        code, err = self.restore(restore_fd, job["name"]) if restore_fd >= 0 else (0, None)
        if err is None:
            code, err = self.run(job)
        if not job.get("session") or self.exited:
            self.finish(code, err)
        self.session_loop(code, err)

    def session_loop(self, code, err):
        """Reports each step and waits for the next, keeping __main__."""
        while True:
            self.end_step()
            self.host_lock.acquire()
            if self.calls is not None:
                self.calls.drain()
            try:
                extra = self.pop_done_extra()
                if err is None and self.value is None and not extra:
                    # The common report, formatted without the json module
                    # (some 10 µs of a trivial step's Python).
                    _write_all(FD, _frame(b'{"t":"done","step":%d,"exit":%d,"error":null}' % (self.step, code)))
                    _ring()
                else:
                    _send_report(dict({"t": "done", "step": self.step, "exit": code, "error": err}, **extra), self.value)
            except BaseException:  # noqa: BLE001 - the channel is gone
                os._exit(code & 0xFF)
            _await_input(FD)
            msg, fds = _recv_with_fds(self.sock, FD)
            if msg is None or msg.get("t") not in ("step", "dump") or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                os._exit(0)
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            os.close(fds[0])
            os.close(fds[1])
            self.step = int(msg.get("step") or 0)
            # An interrupt of an earlier step that arrived after it ended
            # is not this step's.
            self.int_pending = False
            self.host_lock.release()
            cpu = int(msg.get("cpu") or 0)
            if cpu > 0:
                used = int(sum(os.times()[:2]))
                hard = self.cpu_hard
                soft = min(used + cpu, hard)
                try:
                    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
                except (OSError, ValueError):
                    pass
            code, err = self.dump(msg) if msg["t"] == "dump" else self.run(msg)
            if self.exited:
                self.finish(code, err)

    def pop_done_extra(self):
        """Fields a dump adds to its "done" report (see dump)."""
        extra = getattr(self, "done_extra", None) or {}
        self.done_extra = {}
        return extra

    def dump(self, msg):
        """Answers a "dump" frame between steps: writes the session's
        picklable __main__ globals to descriptor 1 (the dump's own pipe),
        and names those that do not pickle in the report's "skipped". The
        session's own code may run (a __reduce__, a __getstate__), here, in
        its own process and sandbox, under the step's limits; what it
        prints is dropped."""
        self.value = None  # a dump reports no value, whatever the last step had
        self.exited = False
        limit = int(msg.get("max") or 0)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            data, skipped = _dump_globals(self.globals, limit)
        except BaseException as e:  # noqa: BLE001 - the dump failed; the session lives on
            return 1, _describe(e, "<dump>")
        finally:
            sys.stdout, sys.stderr = saved
        self.done_extra = {"skipped": skipped[:MAX_SKIPPED]}
        try:
            _write_all(1, data)
        except OSError as e:
            return 1, _describe(e, "<dump>")
        return 0, None

    def restore(self, fd, name):
        """Loads a dump into the fresh __main__ before the first step of a
        restored session runs: inside the sandbox, with the session's own
        grants and limits, as the session's own code would. A dump that
        fails to load leaves __main__ empty, and its exception is the
        step's (the step's code does not run)."""
        try:
            try:
                chunks = []
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    chunks.append(b)
            finally:
                os.close(fd)
            _restore_globals(b"".join(chunks), self.globals)
        except BaseException as e:  # noqa: BLE001 - a tampered dump is the session's own failure
            self.new_main()
            print("pynox: the session's dump could not be restored", file=sys.stderr)
            _print_traceback(e)
            return 1, _describe(e, name)
        return 0, None

    def end_step(self):
        """Flushes the step's output and lets go of its pipes: descriptors 1
        and 2 name /dev/null until the next step brings its own."""
        _flush_std()
        for fd in (1, 2):
            try:
                os.dup2(self.null_w, fd)
            except OSError:
                pass

    # Request-independent steps, done before the job arrives.
    def prepare(self):
        # 1. descriptors: 0 = /dev/null, 1/2 = the job's pipes, 3 = control,
        # 4 = the bell.
        # The ranges to close are the template's, computed once: all but
        # 0-4 and the runtime descriptors.
        plan = self.tpl.close_plan
        if plan is None:
            plan = self.tpl.close_plan = _close_ranges({0, 1, 2, FD, BELL} | {fd for fd, _ in self.tpl.runtime_fds})
        # (The os and resource functions by their module-level names, see
        # _os_open, and the template's values from its spare plan.)
        null = _os_open("/dev/null", _O_RDONLY)
        _os_dup2(null, 0)
        _os_dup2(self.out_w, 1)
        _os_dup2(self.err_w, 2)
        _os_dup2(self.ctl, FD, False)
        _os_dup2(self.bell_w, BELL, False)
        for lo, hi in plan:
            _os_closerange(lo, hi)
        self.channels = True
        # own session and process group; die with the template.
        _os_setsid()
        _check(_prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        if _os_getppid() != self.parent:
            _os_exit(0)
        # 3. capabilities, no_new_privs, SIGXFSZ: given up and checked by the
        # template; anything that failed there (or in building the policy)
        # fails every spare.
        if self.tpl.setup_error:
            raise SetupError(self.tpl.setup_error)
        # 4. Landlock: a fresh ruleset holding the runtime rules; the job's
        # grants are added and it is enforced when the job arrives.
        self.ruleset = self.new_ruleset()
        runtime_range, runtime_fds, files = self.tpl.spare_plan(self.kind)[:3]
        if runtime_range is not None:
            _os_closerange(*runtime_range)
        else:
            for rfd in runtime_fds:
                _os_close(rfd)
        # rlimits that do not depend on the request: no core dumps, the
        # job's descriptor limit, and few queued signals: the count is the
        # uid's, machine-wide, and timer_create (and a timer's signals) may
        # only add to it while it is under the caller's limit. (kill and
        # tgkill of real-time signals are denied by seccomp.)
        _setrlimit(_RLIMIT_CORE, (0, 0))
        _setrlimit(_RLIMIT_NOFILE, (files, files))
        _setrlimit(_RLIMIT_SIGPENDING, (MAX_SIGPENDING, MAX_SIGPENDING))
        # No real-time policy and no nice value below the default, whatever
        # the pool inherited (systemd's LimitRTPRIO=, docker's --ulimit
        # rtprio=): seccomp lets a job change its own scheduling, and these
        # limits are all that stands between a job and SCHED_FIFO or
        # nice -20 without CAP_SYS_NICE.
        _setrlimit(_RLIMIT_RTPRIO, (0, 0))
        _setrlimit(_RLIMIT_NICE, (0, 0))
        # No locked memory: seccomp denies mlock, mlock2 and mlockall, but
        # mmap with MAP_LOCKED (and mremap of such a mapping) locks pages
        # up to RLIMIT_MEMLOCK.
        _setrlimit(_RLIMIT_MEMLOCK, (0, 0))
        # The pool's interrupt: see on_sigint.
        self.main_ident = _get_ident()
        # (_signal's own function: signal.signal converts the old handler
        # to an enum member, a failing lookup and an exception each time.)
        _signal_signal(SIGINT, self.on_sigint)
        # Address space set aside to report a MemoryError with when the job
        # used up its allowance (RLIMIT_AS counts address space, so an
        # untouched mapping is enough, and costs no page faults).
        # (Mapped by the template: see Template.spare_plan.)
        self.reserve = self.tpl.spare_plan(self.kind)[11]
        # The address space the job starts from; its allowance goes on top.
        # The template's, measured once it was ready: a spare has mapped
        # nothing since its fork (its reserve is the template's), and
        # reading its own would cost it some twenty page faults. (A spare
        # that rehearses measures its own again, see warm_up.)
        self.vm = self.tpl.spare_vm or _address_space()
        # 5. seccomp: the job layer of the spare's kind, on top of the
        # template layer it inherited; installed now, as attaching a filter
        # costs hundreds of microseconds (the kernel compiles it), too much
        # to pay per job. Everything the spare still does for its job
        # (reading the frame, rlimits, Landlock, writing frames) is allowed.
        # It comes after PR_SET_PDEATHSIG above and denies it (and
        # PR_SET_SECCOMP): from here on nothing in this process can clear
        # the parent-death signal, which is checked once more.
        if not self.ns:
            self.job_layer()

    def job_layer(self):
        prog, sig, addr = self.tpl.spare_plan(self.kind)[3:6]
        _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0), "seccomp (job layer)")
        sig.value = 0
        _check(_prctl(PR_GET_PDEATHSIG, addr, 0, 0, 0), "prctl(PR_GET_PDEATHSIG)")
        if sig.value != SIGKILL:
            raise SetupError("parent-death signal is %d, not SIGKILL" % sig.value)

    def new_ruleset(self):
        """A Landlock ruleset of the spare's kind holding the runtime rules,
        made from the argument blocks the template built (see
        Template.landlock_args)."""
        create, attr, size, add, rules = self.tpl.spare_plan(self.kind)[6:11]
        ruleset = _check(_syscall(create, attr, size, 0), "landlock_create_ruleset")
        try:
            for rule in rules:
                _check(_syscall(add, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0), "landlock_add_rule")
        except BaseException:
            os.close(ruleset)
            raise
        return ruleset

    def add_rule(self, ruleset, fd, access):
        rule, ref, _sig, _addr = self.tpl.spare_blocks()
        rule.access, rule.fd = access, fd
        _check(_syscall(self.nr["landlock_add_rule"], ruleset, LANDLOCK_RULE_PATH_BENEATH, ref, 0), "landlock_add_rule")

    def warm_up(self):
        """Takes the page faults of a typical job now, not on the clock: in
        a process just forked, the first write to each page the template
        shares costs a copy (several microseconds each on a VM). It runs a
        job's whole path on a dummy job (see rehearse), then prepares the
        real __main__ and fresh random seeds: a spare serves exactly one job
        (or session).

        It runs last, after every confinement step of the spare, and the
        rehearsal only when the machine has a CPU to spare for it: when no
        job waits on the channel yet and the spare has not waited for a CPU
        (see _cpu_contended). A rehearsal costs a job ~0.5 ms of CPU in
        all (the job saves little of it: most of what it touches, the job
        would not) and takes ~0.3 ms off an idle worker's next job: worth
        it only on a CPU that would otherwise idle; a job that already
        waits would only wait longer for it."""
        if (not select.select([FD], [], [], 0)[0] or self.enter_pending()) and not _cpu_contended():
            self.rehearse(["print(sum(range(100)))\n"], reports=False)
            # What the rehearsal mapped is the spare's, not the job's.
            self.vm = _address_space()
        self.exited = False
        self.started_frame = _STARTED
        self.new_main()

    def rehearse(self, codes, reports=True):
        """Runs each piece of code through the job's own path (compile,
        exec, output, a traceback if it raises, the job frame's JSON and,
        with reports, a report's), with descriptors 1 and 2 pointing at
        /dev/null. (A spare's warm-up leaves reports out: the common one,
        a trivial job's "done", is formatted without the json module.)"""
        saved = [os.dup(1), os.dup(2)]
        null = os.open("/dev/null", os.O_WRONLY)
        try:
            os.dup2(null, 1)
            os.dup2(null, 2)
            for code in codes:
                self.globals = {"__name__": "__main__", "__builtins__": builtins}
                _code, err = self.run({"name": "<warm-up>", "code": code, "argv": []})
                sys.stdout.flush()
                sys.stderr.flush()
                linecache.cache.pop("<warm-up>", None)
                _scan_frame(_REHEARSAL_FRAME)
                if reports:
                    _pack({"t": "done", "step": 1, "exit": 0, "error": err, "final": True})
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved + [null]:
                os.close(fd)
        self.globals = None

    def enter_namespace(self, user_fd, mnt_fd, ahead=False):
        """Enters the job's user and then mount namespace (built by the
        pool's mounter, internal/mountns), drops the capabilities the user
        namespace gave (its owner holds them all there; it maps no id a
        host file has), proves them gone, and attaches the job layer, which
        denies setns and capset from then on. The working directory stays
        the template's where the namespace shows it, else /. With
        ahead (a leased namespace entered before its job: see pre_enter)
        it stays the namespace's root, where setns puts it, until entered
        returns to the working directory, which it returns."""
        cwd = os.getcwd()
        _check(_syscall(self.nr["setns"], user_fd, CLONE_NEWUSER), "setns(user namespace)")
        _check(_syscall(self.nr["setns"], mnt_fd, CLONE_NEWNS), "setns(mount namespace)")
        os.close(user_fd)
        os.close(mnt_fd)
        if not ahead:
            try:
                os.chdir(cwd)
            except OSError:
                os.chdir("/")
        drop_capabilities(self.tpl.cfg["cap_last"], self.nr)
        self.job_layer()
        return cwd

    def pre_enter(self, sock, fds):
        """Serves an "enter" frame, the first an ns spare may get: enters
        the leased namespace whose descriptors come with it (the pool's
        mounter attaches the job's mounts to it later, and the host sends
        the job only once they are), drops the capabilities and attaches
        the job layer, all before the job, off its path. A failure is the
        job's setup error: no code runs. Returns the next frame (the
        job's)."""
        if self.error is None:
            try:
                if not self.ns or self.entered_cwd is not None or len(fds) != 2:
                    raise SetupError("unexpected enter frame (%d descriptors)" % len(fds))
                user, mnt = fds
                fds = []
                try:
                    cwd = self.enter_namespace(user, mnt, ahead=True)
                except BaseException:
                    for fd in (user, mnt):
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                    raise
                self.entered_cwd = cwd
            except BaseException as e:  # noqa: BLE001 - reported as SandboxSetupError
                self.error = "%s: %s" % (type(e).__name__, e)
        for fd in fds:
            os.close(fd)
        return _recv_with_fds(sock, FD)

    def await_attached(self):
        """Waits for the host's word that the job's mounts are attached to
        the namespace this spare entered (it attaches them while the spare
        confines itself). End of file (the host ended the job: the attach
        failed) exits without running anything; any other frame is a
        setup error."""
        msg, fds = _recv_with_fds(self.sock, FD)
        for fd in fds:
            os.close(fd)
        if msg is None:
            os._exit(0)
        if msg.get("t") != "attached" or fds:
            raise SetupError("expected the host's word that the job's mounts are attached")

    def enter_pending(self):
        """Whether the frame waiting is an ns spare's "enter" frame (not a
        job: the warm-up may run before it is served)."""
        if not self.ns:
            return False
        try:
            return self.sock.recv(len(_ENTER_FRAME), socket.MSG_PEEK | socket.MSG_DONTWAIT) == _ENTER_FRAME
        except OSError:
            return False

    def entered(self):
        """The job's side of pre_enter, once its mounts are attached: the
        namespace's root must be read-only (the attach makes it so last,
        so a root still writable means no attach finished), and the
        working directory is entered again, as a job mount may now cover
        it."""
        if self.entered_cwd is None:
            raise SetupError("the job's namespace was not entered before it")
        if not os.statvfs("/").f_flag & os.ST_RDONLY:
            raise SetupError("the mount namespace's root is writable: its job's mounts were not attached")
        try:
            os.chdir(self.entered_cwd)
        except OSError:
            os.chdir("/")

    # Request-dependent steps, done when the job arrives.
    def confine(self, job, fds):
        # 1. descriptors: the grants' O_PATH descriptors stay only until the
        # rules hold them.
        # 2. environment and argv.
        # The template started with exactly the base environment, so only
        # the request's additions need setting.
        # (Set as os.environ's own __setitem__ sets them, without its two
        # Python functions, each a code object a fresh process writes.)
        env = job.get("env")
        if env:
            for k, v in env.items():
                kb = k.encode(_FS_ENCODING, "surrogateescape")
                vb = v.encode(_FS_ENCODING, "surrogateescape")
                _os_putenv(kb, vb)
                _ENVIRON_DATA[kb] = vb
        # tempfile caches its directory on first use: a preload (or the
        # template) that used it cached the template's, not the job's
        # TMPDIR (its scratch directory).
        tf = sys.modules.get("tempfile")
        if tf is not None:
            tf.tempdir = None
        lim = job["limits"]
        # rlimits: address space = what the spare already maps + the job's
        # allowance; file size; no core dumps; a CPU-time backstop.
        vm = self.vm + lim["memory"]
        resource.setrlimit(resource.RLIMIT_AS, (vm, vm))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
        if job.get("session"):
            # A session's soft limit is renewed per step; its hard limit is
            # the CPU time of its whole life, as the session's code could
            # raise its soft limit (and ignore SIGXCPU) up to it. The pool
            # holds each step to its own allowance from outside.
            self.cpu_hard = lim["session_cpu"]
            resource.setrlimit(resource.RLIMIT_CPU, (min(lim["cpu"], self.cpu_hard), self.cpu_hard))
        else:
            resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
        # 4. Landlock: add the request's grants and enforce.
        if bool(job.get("network")) != (self.kind == "allow"):
            raise SetupError("a %s spare cannot serve a job with network=%r" % (self.kind, job.get("network")))
        if bool(job.get("ns")) != self.ns:
            raise SetupError("a spare %s a mount namespace cannot serve a job %s one" % (
                ("for", "without") if self.ns else ("without", "with")))
        if bool(job.get("ns_entered")) != (self.entered_cwd is not None):
            raise SetupError("the job's namespace and the spare's disagree (entered before: %r)" % (self.entered_cwd is not None))
        if self.entered_cwd is not None:
            pass  # the job's mounts: see below, before the namespace's own rules
        elif self.ns:
            if len(fds) < 2:
                raise SetupError("mount namespace descriptors missing")
            self.enter_namespace(fds[-2], fds[-1])
            fds = fds[:-2]
        ruleset = self.ruleset
        rules = job.get("rules") or []
        if len(rules) != len(fds):
            raise SetupError("grant descriptors missing: %d rules, %d descriptors" % (len(rules), len(fds)))
        for fd, access in zip(fds, rules):
            self.add_rule(ruleset, fd, access)
        if self.entered_cwd is not None:
            if job.get("ns_wait"):
                self.await_attached()
            self.entered()
        # The namespace's own mounts (overlays), whose file systems no
        # descriptor of the host names: opened here, after entering.
        for path, access in job.get("ns_rules") or []:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self.add_rule(ruleset, fd, access)
            finally:
                os.close(fd)
        if job.get("session"):
            # Where descriptors 1 and 2 point between steps.
            self.null_w = os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
        # Where the kernel audits Landlock (ABI 7) and the host runs with
        # audit enabled, every access a job is denied would be an audit
        # record of the host, as many as the job likes (a loop of denied
        # opens floods the audit log, overflows its backlog and drops
        # the host's own records). A job's denials are its own business.
        flags = 0
        if self.tpl.cfg["landlock"].get("abi", 0) >= 7:
            flags = LANDLOCK_RESTRICT_SELF_LOG_SAME_EXEC_OFF | LANDLOCK_RESTRICT_SELF_LOG_SUBDOMAINS_OFF
        _check(_syscall(self.nr["landlock_restrict_self"], ruleset, flags), "landlock_restrict_self")
        for fd in [ruleset] + list(fds):
            os.close(fd)
        if job.get("functions"):
            sys.modules["pynox_host"] = self.host_module(job["functions"], job.get("tools") or ())

    def host_module(self, names, tools=()):
        """The pynox_host module: one function per declared name. A call
        sends a "call" frame, rings the bell and blocks until Go answers;
        calls from several threads take turns."""
        mod = types.ModuleType("pynox_host", "Functions of the application running this code.")

        class HostError(Exception):
            """The host function failed; the message is the host's."""

        HostError.__module__ = "pynox_host"
        HostError.__qualname__ = "HostError"
        mod.HostError = HostError
        host_error = _typed_host_errors(HostError)
        calls = self.calls = _HostCalls(self)
        aio = types.ModuleType("pynox_host.aio", "Awaitable forms of the host functions: `await aio.f(...)`; "
                               "concurrent awaits (asyncio.gather) have their calls in flight together.")

        described = {t["name"]: t for t in tools}
        # One encoder for every call: json.dumps with these options builds
        # a new one per call (some 3 µs each, twice per call).
        enc = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

        def make(name):
            quoted = json.dumps(name)
            tool = described.get(name)
            sig = _tool_signature(tool["signature"]) if tool and tool.get("signature") else None

            def encode(args, kwargs):
                if sig is not None:
                    try:
                        sig.bind(*args, **kwargs)
                    except TypeError as e:
                        raise TypeError("%s(): %s" % (name, e)) from None
                try:
                    a = enc.encode(args)
                    k = enc.encode(kwargs) if kwargs else "{}"
                except (TypeError, ValueError) as e:
                    raise TypeError("arguments to %s must be JSON values: %s" % (name, e)) from None
                if len(a) + len(k) > MAX_CALL:
                    raise ValueError("arguments to %s are %d bytes of JSON; the limit is %d" % (name, len(a) + len(k), MAX_CALL))
                return a, k

            def result(reply):
                if "error" in reply:
                    raise host_error(reply.get("error_type"))(reply["error"])
                return reply.get("result")

            def call(*args, **kwargs):
                a, k = encode(args, kwargs)
                return result(calls.call(quoted, a, k))

            async def acall(*args, **kwargs):
                a, k = encode(args, kwargs)
                return result(await calls.acall(quoted, a, k))

            for f in (call, acall):
                f.__name__ = f.__qualname__ = name
                f.__module__ = "pynox_host"
                if tool and tool.get("doc"):
                    f.__doc__ = tool["doc"]
                if sig is not None:
                    f.__signature__ = sig
            acall.__module__ = "pynox_host.aio"
            if not (tool and tool.get("doc")):
                acall.__doc__ = "Awaits the host function %s; raises pynox_host.HostError when it fails." % name
            setattr(aio, name, acall)

            if not (tool and tool.get("doc")):
                call.__doc__ = "Calls the host function %s; raises pynox_host.HostError when it fails." % name
            return call

        for name in names:
            setattr(mod, name, make(name))
        mod.__all__ = list(names)
        aio.__all__ = list(names)
        mod.aio = aio
        sys.modules["pynox_host.aio"] = aio
        return mod

    def new_main(self):
        """The job's __main__ (a session keeps it across steps), and fresh
        random seeds for it."""
        main = types.ModuleType("__main__")
        self.globals = main.__dict__
        sys.modules["__main__"] = main
        if "random" in sys.modules:
            sys.modules["random"].seed()
        _reseed_numpy()

    def run(self, job):
        """Runs one piece of code in __main__ and returns (exit code, error).
        self.exited tells whether the code ended the process's life (an
        exit, or memory exhausted)."""
        name = job["name"]
        src = job["code"]
        d = self.globals
        self.exited = False
        self.value = None
        sys.argv = [name] + list(job.get("argv") or [])
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        inputs = job.get("inputs")
        if isinstance(inputs, dict):
            # Checked by the pool: identifiers, not keywords, JSON values.
            d.update(inputs)
        try:
            # A one-shot job's code is compiled once: only a session's
            # steps go through the cache (see _COMPILED).
            code, last = _compile_split(src, name) if self.one_shot else _compile_cached(src, name)
        except BaseException as e:  # noqa: BLE001 - a SyntaxError is the job's
            traceback.print_exception(type(e), e, None)
            return 1, _describe(e, name)
        try:
            self.int_mode = 1
            if self.int_pending:  # interrupted before its code began
                self.int_pending = False
                self.int_mode = 0
                raise KeyboardInterrupt
            if code is not None:  # None: nothing before the last expression (see _split_at_last_line)
                exec(code, d)
            if last is not None:
                value = eval(last, d)
                self.int_mode = 0
                if value is not None:
                    self.value = _encode_value(value)
                    if _DISPLAY.spare is not None and _has_rich_repr(value):
                        display(value)  # a DataFrame's HTML table, say
                value = None
            self.int_mode = 0
        except SystemExit as e:
            self.int_mode = 0
            self.exited = True
            self.end_figures()
            return _exit_code(e), None
        except BaseException as e:  # noqa: BLE001 - every exception is the job's
            self.int_mode = 0
            if issubclass(type(e), MemoryError):  # not e.__class__, which the job may define
                # The job is over: drop its data so the report can be made.
                self.exited = True
                if self.reserve is not None:
                    self.reserve.close()
                    self.reserve = None
                d.clear()
                traceback.clear_frames(e.__traceback__)
                gc.collect()
            info = _describe(e, name)
            if not self.exited:
                self.end_figures()
            _print_traceback(e)
            return 1, info
        self.end_figures()
        return 0, None

    def end_figures(self):
        """Shows the figures still open at the end of the code (see
        _show_figures); what fails here is printed, not the step's error."""
        if _DISPLAY.spare is None or "matplotlib._pylab_helpers" not in sys.modules:
            return
        try:
            _show_figures()
        except BaseException as e:  # noqa: BLE001 - an interrupt or a MemoryError here
            _print_traceback(e)

    def finish(self, code, err):
        _flush_std()
        for fd in (1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
        self.host_lock.acquire()  # no call starts now
        if self.calls is not None:
            self.calls.drain()  # calls in flight are answered first
        try:
            if err is None and self.value is None:
                # The common report, formatted without the json module
                # (whose first use in a fresh process costs page faults).
                _write_all(FD, _frame(b'{"t":"done","step":%d,"exit":%d,"error":null,"final":true}' % (self.step, code)))
                _ring()
            else:
                _send_report({"t": "done", "step": self.step, "exit": code, "error": err, "final": True}, self.value)
            # The host reads this process's counters (its usage) and kills
            # it on this report: it waits for that, alive, rather than
            # tear itself down first; if no kill comes (the host is gone),
            # it exits on its own.
            select.select([FD], [], [], 5)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code & 0xFF)


def _reseed_numpy():
    """Gives numpy's global generator (numpy.random's legacy RandomState,
    when numpy.random is imported) a fresh state: 624 words from os.urandom
    as its Mersenne Twister key, through its public set_state. Its seed()
    would derive a state from 128 bits of entropy through a SeedSequence
    and numpy's ufuncs: some 130 page faults in a fresh process, where
    this costs some 50. Falls back to seed() if the state is refused."""
    npr = sys.modules.get("numpy.random")
    if npr is None:
        return
    try:
        try:
            npr.set_state(("MT19937", sys.modules["numpy"].frombuffer(os.urandom(2496), "<u4"), 624, 0, 0.0))
        except Exception:  # noqa: BLE001 - not the legacy MT19937 generator: numpy's own way
            npr.seed()
    except Exception:  # noqa: BLE001 - best effort
        pass


# Compiled steps by (source, name): a session that runs the same code
# again (a polling loop, a retry, a benchmark) skips its parse and compile,
# some 50 µs of a trivial step's 100 µs in Python. Code objects are
# immutable; each run still executes afresh. Bounded: sources up to
# _COMPILED_SRC bytes, at most _COMPILED_MAX entries (then emptied).
_COMPILED = {}
_COMPILED_MAX = 32
_COMPILED_SRC = 4096


def _compile_cached(src, name):
    """_compile_split, through _COMPILED."""
    key = (src, name)
    hit = _COMPILED.get(key)
    if hit is None:
        hit = _compile_split(src, name)
        if len(src) <= _COMPILED_SRC:
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.clear()
            _COMPILED[key] = hit
    return hit


def _compile_split(src, name):
    """Compiles a job's code REPL style: when its last statement is an
    expression, that expression is compiled apart (mode "eval") so that its
    value can be reported. Returns (the code of the rest, or None when
    nothing comes before the last expression; the code of the last
    expression or None). The syntax tree keeps every node's line and
    column, so tracebacks and error locations are those of the whole."""
    split = _split_at_last_line(src, name)
    if split is not None:
        return split
    tree = compile(src, name, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        expr = tree.body[-1].value
        last = _ast.Expression(expr)
        if len(tree.body) > 1 or not (isinstance(expr, _ast.Constant) and isinstance(expr.value, str)):
            tree.body.pop()
        # else: a lone string is also the module's docstring, which sets
        # __doc__; evaluating it once more has no effect.
    code = compile(tree, name, "exec", dont_inherit=True)
    if last is not None:
        last = compile(last, name, "eval", dont_inherit=True)
    return code, last


def _split_at_last_line(src, name):
    """_compile_split without a syntax tree (whose Python objects cost a
    fresh process some twenty page faults and ~0.1 ms), for code whose
    last line starting at column 0 (not blank, not a comment) begins an
    expression that runs to the end of the code: when the code before
    that line compiles on its own, its statements are complete, so that
    line begins the last top-level statement. The expression is compiled
    at its own line numbers and columns. Returns None when that does not
    hold, or when the expression could be a lone string (which would be
    the module's docstring): the syntax tree decides then."""
    end = len(src)
    while True:
        nl = src.rfind("\n", 0, end)
        c = src[nl + 1:nl + 2]
        if c and c not in " \t\f\r\n#":
            break
        if nl < 0:
            return None
        end = nl
    head = src[:nl + 1]
    try:
        last = compile("\n" * head.count("\n") + src[nl + 1:], name, "eval", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    if not last.co_names:
        for c in last.co_consts:
            if type(c) is str:
                return None
    if not head or head.isspace():
        # Nothing before the expression (a one-line job): no code to run
        # but it, and no second compile. (eval adds __builtins__ to the
        # globals as exec would.)
        return None, last
    try:
        code = compile(head, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return code, last


# For _value_json's checks of an encoded value (bytes): its strings; a
# table that turns the bytes of numbers into "n" and any other into " ";
# the bytes that are not brackets; and empty arrays and objects.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NUMBER_BYTES = bytes(ord("n") if chr(b) in "-+.eE0123456789" else ord(" ") for b in range(256))
_NOT_BRACKETS = bytes(b for b in range(256) if chr(b) not in "[]{}")
_JSON_EMPTY = re.compile(rb"\[\]|\{\}")


def _no_repeated_key(pairs):
    if len(set(k for k, _ in pairs)) != len(pairs):
        raise ValueError("an object repeats a key")
    return None


def _value_json(v):
    """v's JSON encoding (UTF-8 bytes) when json.dumps accepts it within
    MAX_VALUE bytes and every client can read it back the same, else None.
    The checks are the pool's (wire.go: checkCallJSON): valid UTF-8 (a lone
    surrogate is not), at most MAX_VALUE_DEPTH levels, numbers of at most
    MAX_VALUE_NUMBER characters, no object that repeats a key ({1: 0, "1":
    0}, or a dict subclass's own items())."""
    try:
        text = json.dumps(v, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        if type(text) is not str or len(text) > MAX_VALUE:
            return None
        data = text.encode("utf-8")
        if len(data) > MAX_VALUE:
            return None
        # Outside its strings the text is ASCII: numbers, literals, brackets.
        bare = _JSON_STRING.sub(b'""', data)
        if b"n" * (MAX_VALUE_NUMBER + 1) in bare.translate(_NUMBER_BYTES):
            return None
        # Each pass removes the innermost arrays and objects: one level.
        brackets = bare.translate(None, _NOT_BRACKETS)
        has_object = b"{" in brackets
        for _ in range(MAX_VALUE_DEPTH):
            brackets, n = _JSON_EMPTY.subn(b"", brackets)
            if not n:
                break
        if brackets:
            return None
        if has_object:
            json.loads(text, object_pairs_hook=_no_repeated_key)
        return data
    except BaseException:  # noqa: BLE001 - the value's own code may raise anything
        return None


def _value_repr(v):
    """v's repr, cut to at most MAX_VALUE_REPR bytes of UTF-8."""
    try:
        r = str.__str__(repr(v))  # an exact str, whatever __repr__ returned
        data = r[:MAX_VALUE_REPR].encode("utf-8", "backslashreplace")
        return data[:MAX_VALUE_REPR].decode("utf-8", "ignore")
    except BaseException:  # noqa: BLE001
        try:
            return "<%s object: repr() failed>" % str.__str__(_TYPE_NAME(type(v)))
        except BaseException:  # noqa: BLE001
            return "<object: repr() failed>"


def _encode_value(v):
    """The report of the last expression's value v (not None)."""
    data = _value_json(v)
    if data is not None:
        return ("value", data)
    return ("value_repr", _value_repr(v))


def _send_report(obj, value):
    """Writes a "done" report, with the last expression's value if any,
    and rings the bell. A report larger than the socket's buffer may hold
    (a value of up to MAX_VALUE bytes) goes as its header and a ring first,
    so that Go reads the rest as it comes."""
    if value is not None and value[0] == "value_repr":
        obj["value_repr"] = value[1]
    payload = json.dumps(obj, separators=(",", ":")).encode()
    if value is not None and value[0] == "value":
        payload = payload[:-1] + b',"value":' + value[1] + b"}"
    framed = _frame(payload)
    if len(payload) > INLINE_FRAME:
        _write_all(FD, framed[:4])
        _ring()
        _write_all(FD, memoryview(framed)[4:])
    else:
        _write_all(FD, framed)
    _ring()


MAX_IN_FLIGHT = 64  # host calls a job may have in flight at once (host.go: MaxInFlight)


class _HostCalls:
    """The host calls of a job: each call frame carries an id, and Go
    answers each with a reply frame carrying it back, in any order.

    Whoever waits reads: a sync call waiting for its reply (or for a free
    slot) reads the next frame itself unless another thread is reading,
    and an event loop with calls in flight watches the channel with
    add_reader. Each reply goes to its caller: a sync caller's is kept for
    it, an awaiting caller's future is resolved in its loop. At most
    MAX_IN_FLIGHT calls are in flight; a further sync call waits for a
    slot, a further awaited one awaits one. A step reports only once every
    call it sent is answered (drain), so no reply is ever left behind on
    the channel for the next step."""

    def __init__(self, spare):
        import threading

        self.spare = spare
        self.send_lock = spare.host_lock
        self.cv = threading.Condition(threading.Lock())
        self.seq = 0
        self.slots = 0  # calls holding a slot: sent, or about to be
        self.out = 0  # calls sent whose reply has not been read
        self.reading = False
        self.sync_ids = set()
        self.sync_replies = {}
        self.futures = {}  # id -> (loop, future)
        self.slot_waiters = []  # (loop, future) of awaiting calls waiting for a slot
        self.loops = {}  # loop -> its calls in flight; it watches the channel while > 0
        self.rest = b""  # the start of a reply frame read with the one before it (_recv_replies)

    def send(self, cid, quoted, a, k):
        with self.send_lock:
            # The step is read under the lock: a thread that calls between
            # steps waits for the next one, and its call is that step's.
            data = ('{"t":"call","id":%d,"step":%d,"function":%s,"args":%s,"kwargs":%s}' % (
                cid, self.spare.step, quoted, a, k)).encode()
            framed = _frame(data)
            with self.cv:
                self.out += 1
            if len(data) > INLINE_FRAME:
                # More than the socket may hold: the header and a ring
                # first, so that Go reads the rest as it comes.
                _write_all(FD, framed[:4])
                _ring()
                _write_all(FD, memoryview(framed)[4:])
            else:
                _write_all(FD, framed)
            _ring()

    def call(self, quoted, a, k):
        # An interrupt while the call waits (for a slot or its answer) is
        # raised once the answer is in: the channel stays in step.
        held = self.spare.hold_interrupt()
        try:
            with self.cv:
                self._wait(lambda: self.slots < MAX_IN_FLIGHT)
                self.slots += 1
                self.seq += 1
                cid = self.seq
                self.sync_ids.add(cid)
            self.send(cid, quoted, a, k)
            with self.cv:
                self._wait(lambda: cid in self.sync_replies)
                self.sync_ids.discard(cid)
                reply = self.sync_replies.pop(cid)
        except BaseException:
            self.spare.release_interrupt(held, False)
            raise
        self.spare.release_interrupt(held, True)
        return reply

    async def acall(self, quoted, a, k):
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            with self.cv:
                if self.slots < MAX_IN_FLIGHT:
                    self.slots += 1
                    self.seq += 1
                    cid = self.seq
                    fut = loop.create_future()
                    self.futures[cid] = (loop, fut)
                    n = self.loops.get(loop, 0)
                    if n == 0:
                        loop.add_reader(FD, self._pump)
                    self.loops[loop] = n + 1
                    break
                w = loop.create_future()
                self.slot_waiters.append((loop, w))
            await w
        try:
            self.send(cid, quoted, a, k)
            return await fut
        finally:
            with self.cv:
                n = self.loops.get(loop, 1) - 1
                if n <= 0:
                    self.loops.pop(loop, None)
                    loop.remove_reader(FD)
                else:
                    self.loops[loop] = n

    def drain(self):
        """Waits until every call sent has its reply (the caller holds the
        send lock, so that no call starts meanwhile)."""
        with self.cv:
            self._wait(lambda: self.out == 0)

    def _wait(self, pred):
        # self.cv is held.
        while not pred():
            if self.reading or self.out == 0:
                # Another thread reads, or nothing is to be read (a reply
                # can only follow a call sent): a read now could take the
                # next step's frame.
                self.cv.wait()
                continue
            self._read()

    def _pump(self):
        """An event loop's reader callback: reads one frame if no one else
        is reading and one is there."""
        held = self.spare.hold_interrupt()  # never in the middle of a frame
        try:
            with self.cv:
                if self.reading or not select.select([FD], [], [], 0)[0]:
                    return
                self._read()
        finally:
            self.spare.release_interrupt(held, False)
        self.spare.release_interrupt((False, 0), True)

    def _read(self):
        # self.cv is held and no one else is reading.
        self.reading = True
        self.cv.release()
        try:
            _await_input(FD)
            msgs = self._recv_replies()
        finally:
            self.cv.acquire()
            self.reading = False
        for msg in msgs:
            self._take(msg)
        if self.rest and self.out <= 0:
            os._exit(75)  # bytes beyond the replies owed: the host spoke out of turn
        self.cv.notify_all()

    def _recv_replies(self):
        """Reads what the channel holds and returns the messages of the
        whole frames in it, at least one (None when the channel ended);
        the start of a frame still arriving is kept in self.rest for the
        next read. One read per reply, where reading its header and then
        its body took two (issue 12). Only replies come while calls are in
        flight, and a frame after the last reply owed is the host's fault
        (see _read): nothing of the next step can be read here."""
        data = os.read(FD, _REPLY_READ)
        if not data:
            return [None]
        buf = self.rest + data
        msgs = []
        while True:
            if len(buf) < 4:
                if msgs:
                    break
                buf = _read_exact(FD, 4, buf)
                if buf is None:
                    return [None]
            (n,) = _FRAME_HEADER.unpack_from(buf)
            if n > MAX_FRAME:
                raise ValueError("frame too large")
            if len(buf) < 4 + n:
                if msgs:
                    break
                buf = _read_exact(FD, 4 + n, buf)
                if buf is None:
                    return [None]
            msgs.append(_scan_frame(buf[4:4 + n]))
            buf = buf[4 + n:]
        self.rest = buf
        return msgs

    def _take(self, msg):
        """Hands one reply to its caller (self.cv is held)."""
        if msg is None or msg.get("t") != "reply" or self.out <= 0:
            os._exit(75)  # the host is gone, or spoke out of turn
        cid = msg.get("id")
        if cid in self.sync_ids:
            self.sync_replies[cid] = msg
        elif cid in self.futures:
            loop, fut = self.futures.pop(cid)
            try:
                loop.call_soon_threadsafe(_settle, fut, msg)
            except RuntimeError:
                pass  # its loop is closed: nobody awaits it
        else:
            os._exit(75)
        self.out -= 1
        self.slots -= 1
        waiters, self.slot_waiters = self.slot_waiters, []
        for loop, w in waiters:
            try:
                loop.call_soon_threadsafe(_settle, w, None)
            except RuntimeError:
                pass


# How much _HostCalls reads at once: replies are small, and many fit.
_REPLY_READ = 64 << 10


def _settle(fut, value):
    if not fut.done():
        fut.set_result(value)


# The builtin exception types a host may raise in a job (pynox.RaiseAs;
# a reply's "error_type"). Only these names are looked up, as attributes
# of builtins: a type name from the wire is never evaluated. host.go's
# hostErrorTypes is the same list.
HOST_ERROR_TYPES = (
    "ValueError", "TypeError", "KeyError", "IndexError", "LookupError", "AttributeError",
    "PermissionError", "FileNotFoundError", "FileExistsError", "IsADirectoryError",
    "NotADirectoryError", "OSError", "TimeoutError", "ConnectionError",
    "ConnectionRefusedError", "ConnectionResetError", "RuntimeError",
    "NotImplementedError", "ZeroDivisionError", "OverflowError",
)


def _typed_host_errors(host_error):
    """Returns a function from a reply's error_type to the class the job
    sees: for an allowed name, a class named like the builtin that derives
    from both it and pynox_host.HostError (so `except KeyError` and
    `except HostError` both catch it), made once per name on first use;
    HostError itself for anything else."""
    made = {}
    # Read now, before user code runs: a job that rebinds builtins.KeyError
    # does not change what its host errors derive from.
    bases = {name: getattr(builtins, name) for name in HOST_ERROR_TYPES}

    def get(name):
        base = bases.get(name) if name.__class__ is str else None
        if base is None:
            return host_error
        cls = made.get(name)
        if cls is None:
            cls = type(name, (base, host_error), {
                "__module__": "pynox_host",
                "__doc__": "%s raised by the host function; also a pynox_host.HostError." % name,
            })
            made[name] = cls
        return cls

    return get


# Names an annotation of a declared tool may use without typing: builtin
# types, read before user code runs.
_ANNOTATION_BUILTINS = {n: getattr(builtins, n) for n in (
    "str", "int", "float", "bool", "bytes", "bytearray", "complex", "list", "dict", "tuple", "set",
    "frozenset", "object", "type")}


class _DefaultText:
    """A tool parameter's default that is not a literal: shown as its
    text, never evaluated."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _tool_signature(desc):
    """Builds the inspect.Signature of a declared tool from the pool's
    parsed form (pynox.Signature). Nothing in it is evaluated:
    annotations go through _annotation, defaults through
    ast.literal_eval, and what neither takes shows as its text."""
    import ast
    import inspect

    def default(text):
        try:
            return ast.literal_eval(text)
        except Exception:  # noqa: BLE001 - not a literal: shown as text
            return _DefaultText(text)

    params = []
    for p in desc.get("params") or ():
        kw = {}
        if p.get("annotation"):
            kw["annotation"] = _annotation(p["annotation"])
        if p.get("has_default"):
            kw["default"] = default(p.get("default") or "None")
        params.append(inspect.Parameter(p["name"], getattr(inspect.Parameter, p["kind"]), **kw))
    kw = {}
    if desc.get("returns"):
        kw["return_annotation"] = _annotation(desc["returns"])
    return inspect.Signature(params, **kw)


def _annotation(text):
    """Turns an annotation's text into the type it names, looking up only
    builtin types and typing's public names, and subscripting and joining
    them with |; anything else (a call, an attribute of another module, a
    name it does not know) keeps the text. No code from the text runs."""
    import ast

    typing = []

    def look(name, typing_only=False):
        if name in _ANNOTATION_BUILTINS and not typing_only:
            return _ANNOTATION_BUILTINS[name]
        if not typing:
            import typing as t
            typing.append(t)
        if name in typing[0].__all__:
            return getattr(typing[0], name)
        raise ValueError(name)

    def ev(node):
        if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in (str, int, bool, float, bytes)):
            return node.value
        if isinstance(node, ast.Name):
            return look(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "typing":
            return look(node.attr, typing_only=True)
        if isinstance(node, ast.Subscript):
            base = ev(node.value)
            sl = node.slice
            if sl.__class__.__name__ == "Index":  # Python 3.8's wrapper
                sl = sl.value
            arg = tuple(ev(e) for e in sl.elts) if isinstance(sl, ast.Tuple) else ev(sl)
            return base[arg]
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return ev(node.left) | ev(node.right)
        raise ValueError(type(node).__name__)

    try:
        return ev(ast.parse(text, mode="eval").body)
    except Exception:  # noqa: BLE001 - an annotation it cannot take shows as text
        return text


# ---------------------------------------------------------------- dump and restore
#
# A dump is two pickles: a header ("pynox-dump", 1, "MAJOR.MINOR" of the
# Python that made it) and a dict of the session's __main__ globals. A
# function defined in the session (its globals are __main__'s) is pickled
# by value: its code object (marshal, so a dump restores only under the
# same Python version), defaults, closure values, names, doc and
# attributes. A module is pickled by name and imported again. Everything
# else pickles as pickle does; a name whose value does not pickle, or that
# refers to a class defined in the session (pickled by reference, it could
# not be found when loading), is skipped. Dumps are made and loaded only
# by confined session processes: the pool never unpickles one.

MAX_SKIPPED = 1000  # names listed in a dump's report at most
DUMP_FORMAT = 1


class _DumpTooLarge(Exception):
    pass


class _CountingSink:
    """A file that keeps nothing and counts what is written, up to limit."""

    def __init__(self, limit):
        self.n = 0
        self.limit = limit

    def write(self, b):
        n = memoryview(b).nbytes  # a large buffer comes as a PickleBuffer, which has no len()
        self.n += n
        if self.limit and self.n > self.limit:
            raise _DumpTooLarge()
        return n


class _LimitedBytes(io.BytesIO):
    """A BytesIO that refuses to grow beyond limit bytes."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def write(self, b):
        if self.limit and self.tell() + memoryview(b).nbytes > self.limit:
            raise _DumpTooLarge()
        return super().write(b)


def _dump_function(code, name, qualname, defaults, kwdefaults, closure, doc, attrs):
    """Rebuilds a function a session defined, in the restoring session's
    __main__ (pickled by reference as pynox_dump.function)."""
    import marshal
    g = sys.modules["__main__"].__dict__
    cells = None if closure is None else tuple(types.CellType(v) for v in closure)
    f = types.FunctionType(marshal.loads(code), g, name, defaults, cells)
    f.__qualname__ = qualname
    f.__kwdefaults__ = kwdefaults
    f.__doc__ = doc
    f.__dict__.update(attrs)
    return f


def _dump_module(name):
    """Imports a module a session had bound to a name."""
    import importlib
    return importlib.import_module(name)


def _dump_helpers():
    """The pynox_dump module that a dump's pickle names."""
    mod = types.ModuleType("pynox_dump", "Helpers of pynox session dumps.")
    for attr, fn in (("function", _dump_function), ("module", _dump_module)):
        fn.__module__, fn.__qualname__ = "pynox_dump", attr
        setattr(mod, attr, fn)
    sys.modules["pynox_dump"] = mod
    return mod


def _dump_pickler(main, file):
    import marshal
    import pickle
    helpers = _dump_helpers()

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            t = type(obj)
            if t is types.FunctionType and obj.__globals__ is main:
                closure = None
                if obj.__closure__ is not None:
                    closure = tuple(c.cell_contents for c in obj.__closure__)  # ValueError for an empty cell
                return helpers.function, (marshal.dumps(obj.__code__), obj.__name__, obj.__qualname__,
                                          obj.__defaults__, obj.__kwdefaults__, closure, obj.__doc__,
                                          dict(obj.__dict__))
            if t is types.ModuleType:
                name = obj.__name__
                if not isinstance(name, str) or sys.modules.get(name) is not obj:
                    raise pickle.PicklingError("module %r cannot be imported by its name" % (name,))
                return helpers.module, (str.__str__(name),)
            if isinstance(obj, type) and _TYPE_MODULE(obj) == "__main__":
                raise pickle.PicklingError("class %s is defined in the session" % str(_TYPE_QUALNAME(obj)))
            return NotImplemented

    return Pickler(file, protocol=pickle.HIGHEST_PROTOCOL)


def _dump_globals(main, limit):
    """Returns the dump of main (a session's __main__ globals) and the
    names left out because they did not pickle. Fails with ValueError when
    the dump would exceed limit bytes."""
    keep, skipped = {}, []
    for k in list(main):
        if not isinstance(k, str):
            skipped.append(repr(k)[:200])
            continue
        if k.startswith("__") and k.endswith("__"):
            continue  # the module's own attributes (__name__, __builtins__, ...)
        v = main[k]
        try:
            _dump_pickler(main, _CountingSink(limit)).dump(v)
        except _DumpTooLarge:
            raise ValueError("the session's dump exceeds %d bytes (the value of %s alone does)" % (limit, k)) from None
        except BaseException:  # noqa: BLE001 - it does not pickle: skipped, never a failure
            skipped.append(k[:200])
            continue
        keep[k] = v
    out = _LimitedBytes(limit)
    import pickle
    pickle.dump(("pynox-dump", DUMP_FORMAT, "%d.%d" % sys.version_info[:2]), out, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        _dump_pickler(main, out).dump(keep)
    except _DumpTooLarge:
        raise ValueError("the session's dump exceeds %d bytes" % limit) from None
    return out.getvalue(), skipped


def _restore_globals(data, main):
    """Loads a dump made by _dump_globals into main."""
    if not data:
        return  # the dump of a session that had run nothing
    import pickle
    _dump_helpers()
    f = io.BytesIO(data)
    head = pickle.load(f)  # two pickles, each with its own memo
    if type(head) is not tuple or len(head) != 3 or head[0] != "pynox-dump" or head[1] != DUMP_FORMAT:
        raise ValueError("this is not a pynox session dump")
    here = "%d.%d" % sys.version_info[:2]
    if head[2] != here:
        raise ValueError("the dump was made by Python %s; this session runs Python %s" % (head[2], here))
    names = pickle.load(f)
    if type(names) is not dict or any(type(k) is not str for k in names):
        raise ValueError("the dump's globals are not a dict of names")
    main.update(names)


def _pin_cpus(cpus):
    """Sets the template's CPU affinity to cpus (when the host sent any)
    before it imports a preload or could start a thread, so that every
    spare, job and session it forks inherits it. The host picks them from
    its own allowed set; a refusal (a cpuset changed since) leaves the
    inherited affinity and is returned, for the host to report: pinning is
    a performance setting, not a confinement step."""
    if not cpus:
        return ""
    try:
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError, TypeError) as e:
        return "sched_setaffinity(%r): %s" % (cpus, e)
    return ""


def _raise_files_limit():
    """Raises the template's soft RLIMIT_NOFILE to its hard limit and
    returns a job's descriptor limit: MAX_FILES, or half the hard limit
    when that is lower.

    Descriptors in flight on unix sockets (sent with SCM_RIGHTS, not yet
    received) are counted per user, machine-wide, and a process without
    CAP_SYS_RESOURCE may send more only while that count is within its own
    RLIMIT_NOFILE. A job may put up to its own limit (and one message more)
    in flight and keep them there; the template sends every spare to the
    pool with SCM_RIGHTS, so its limit must stay well above any job's, or
    its next send fails and it dies with every job and session it holds.
    The soft limit it was started with (1024 under a shell's or systemd's
    default: Go restores it for the processes it starts) is below a job's
    4096."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # not on Linux (nr_open bounds it)
        return MAX_FILES
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return max(64, min(MAX_FILES, hard // 2))


def drop_capabilities(cap_last, nr):
    """Empties every capability set, the bounding set included."""
    for cap in range(cap_last + 1):
        if _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (1, 22):
            raise SetupError("prctl(PR_CAPBSET_DROP, %d): %s" % (cap, os.strerror(ctypes.get_errno())))
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _CAP_HDR.version, _CAP_HDR.pid = 0x20080522, 0
    # (The sets as one memset and one comparison of their bytes, not six
    # ctypes attributes each way: an ns spare runs this once per job, in a
    # process that has just forked, where every object it touches costs.)
    _ctypes_memset(_CAP_DATA_REF, 0, _CAP_DATA_SIZE)
    _check(_syscall(nr["capset"], _CAP_HDR_REF, _CAP_DATA_REF), "capset")
    check_no_capabilities(nr)
    # The ambient and bounding sets, from /proc/self/status read as bytes
    # (the io module's text file and a line loop cost an ns spare some
    # 200 us of CPU per job). A field that is missing fails, as one that
    # is not empty does.
    fd = _os_open("/proc/self/status", _O_RDONLY | _O_CLOEXEC)
    try:
        chunks = []
        while True:
            b = _os_read(fd, 8192)
            if not b:
                break
            chunks.append(b)
    finally:
        _os_close(fd)
    status = b"".join(chunks)
    for key in (b"\nCapAmb:", b"\nCapBnd:"):
        i = status.find(key)
        end = status.find(b"\n", i + 1)
        if i < 0 or end < 0:
            raise SetupError("/proc/self/status has no %s line" % key[1:-1].decode())
        line = status[i + 1:end]
        if int(line[len(key) - 1:], 16) != 0:
            # Without CAP_SETPCAP (not root) the bounding set cannot be
            # emptied, but with nothing permitted it grants nothing.
            if key == b"\nCapAmb:" or os.getuid() == 0:
                raise SetupError("capability set not empty: " + line.decode().strip())


_CAP_HDR = CapHeader(0x20080522, 0)
_CAP_DATA = (CapData * 2)()
_CAP_HDR_REF, _CAP_DATA_REF = ctypes.byref(_CAP_HDR), ctypes.byref(_CAP_DATA)
_CAP_DATA_SIZE = ctypes.sizeof(_CAP_DATA)
_CAP_DATA_EMPTY = bytes(_CAP_DATA_SIZE)
_ctypes_memset = ctypes.memset
_O_CLOEXEC = os.O_CLOEXEC


def check_no_capabilities(nr):
    """Fails unless the effective, permitted and inheritable sets are empty."""
    _CAP_HDR.version, _CAP_HDR.pid = 0x20080522, 0
    _ctypes_memset(_CAP_DATA_REF, 0xFF, _CAP_DATA_SIZE)  # proven empty only by capget
    _check(_syscall(nr["capget"], _CAP_HDR_REF, _CAP_DATA_REF), "capget")
    if bytes(_CAP_DATA) != _CAP_DATA_EMPTY:
        raise SetupError("capabilities still held")


def _address_space():
    """This process's address space in bytes (/proc/self/statm)."""
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(os.read(fd, 256).split()[0]) * PAGE_SIZE
    finally:
        os.close(fd)


# A spare that waited longer than this (ns) for a CPU since its fork finds
# the machine busy, and skips its rehearsal (see Spare.warm_up).
IDLE_RUN_DELAY = 500000


def _cpu_contended():
    """Whether this process has waited on a run queue, since its fork,
    longer than IDLE_RUN_DELAY: the CPUs are busy, and CPU it spends is
    taken from others' jobs. The second field of /proc/self/schedstat is
    that wait in nanoseconds; a kernel without it counts as idle."""
    try:
        fd = os.open("/proc/self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 128).split()[1]) > IDLE_RUN_DELAY
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return False


def _flush_std():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed stream loses nothing more
            pass


def _exit_code(e):
    try:
        c = e.code  # a SystemExit subclass may make code a property
    except BaseException:  # noqa: BLE001
        return 1
    if c is None:
        return 0
    if isinstance(c, int):
        return int.__and__(c, 0xFF)  # not an int subclass's own __and__
    try:
        print(c, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass
    return 1


def _print_traceback(e):
    """Prints the job's traceback to stderr, without the runner's own frames
    (see _strip_runner). A very deep one (runaway recursion) is cut to its
    innermost frames: formatting a million frames would take longer than
    most timeouts."""
    try:
        if _strip_runner(e):
            print("[traceback cut to its innermost %d frames]" % TB_FRAMES, file=sys.stderr)
        traceback.print_exception(type(e), e, e.__traceback__)
    except BaseException:  # noqa: BLE001 - the report must not fail
        try:
            os.write(2, ("%s: %s\n" % (type(e).__name__, e)).encode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001
            pass


# The error types of the pool's own verdicts (the Kind names of errors.go
# that results carry). A job's exception of one of these names is reported
# module-qualified ("__main__.RequestError", "builtins.TimeoutError"): a
# type the pool reports itself never has a dot, so no job passes its
# exception off as the pool's verdict. Every other type stays bare.
POOL_ERROR_TYPES = frozenset(("RequestError", "TimeoutError", "SignalError", "SandboxSetupError", "PoolWorkerError"))


_TYPE_NAME = type.__dict__["__name__"].__get__
_TYPE_QUALNAME = type.__dict__["__qualname__"].__get__
_TYPE_MODULE = type.__dict__["__module__"].__get__


def _type_name(e):
    """The name of e's class as the report gives it. It runs none of the
    job's code: the names are read with type's own descriptors (a
    metaclass may define __name__ as a property) and copied to exact str
    (a str subclass may redefine __hash__, __eq__ or __add__)."""
    t = type(e)
    name = str.__str__(_TYPE_NAME(t))
    if name not in POOL_ERROR_TYPES:
        return name
    try:
        module = _TYPE_MODULE(t)
        if isinstance(module, str):
            return str.__str__(module) + "." + str.__str__(_TYPE_QUALNAME(t))
    except BaseException:  # noqa: BLE001 - a class may define anything
        pass
    return "__main__." + name


_RUNNER_GLOBALS = globals()


def _is_runner(frame):
    """Whether frame runs the runner's own code (the exec in Spare.run, a
    pynox_host function), which means nothing to the job's author: the
    runner is `python -c` source, so its frames would show as
    File "<string>", line 811, in call. Recognised by the globals the code
    runs in, not by file name: a job's own exec("...") is "<string>" too."""
    return frame.f_globals is _RUNNER_GLOBALS


def _strip_runner(e):
    """Rebuilds the tracebacks of e and of the exceptions it chains
    (__cause__, __context__) without the runner's frames, keeping at most
    the innermost TB_FRAMES of a longer one (2 * TB_FRAMES at most are held
    while walking). Returns whether e's own traceback was cut."""
    cut = False
    seen = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen or len(seen) > 64:
            continue
        seen.add(id(x))
        kept = collections.deque(maxlen=2 * TB_FRAMES + 1)
        tb = x.__traceback__
        while tb is not None:
            if not _is_runner(tb.tb_frame):
                kept.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
            tb = tb.tb_next
        if len(kept) > 2 * TB_FRAMES:
            kept = list(kept)[-TB_FRAMES:]
            cut = cut or x is e
        new = None
        for frame, lasti, lineno in reversed(kept):
            new = types.TracebackType(new, frame, lasti, lineno)
        x.__traceback__ = new
        todo += [x.__cause__, x.__context__]
    return cut


def _describe(e, name):
    try:
        return _describe_unsafe(e, name)
    except BaseException:  # noqa: BLE001 - out of memory while describing
        return {"type": _type_name(e), "message": "", "file": None, "line": None}


def _describe_unsafe(e, name):
    file = line = None
    tb = e.__traceback__
    last = None
    for frame, lineno in traceback.walk_tb(tb):
        if _is_runner(frame):
            continue
        last = (frame.f_code.co_filename, lineno)
        if frame.f_code.co_filename == name:
            file, line = name, lineno
    if isinstance(e, SyntaxError) and e.filename == name:
        file, line = name, e.lineno
    if file is None and last is not None:
        file, line = last
    try:
        msg = str(e)
    except BaseException:  # noqa: BLE001
        msg = "<unprintable %s>" % type(e).__name__
    info = {"type": _type_name(e), "message": msg[:MSG_CAP], "file": file, "line": line}
    if isinstance(e, OSError):
        info["errno"] = e.errno
        fn = e.filename
        if isinstance(fn, bytes):
            fn = fn.decode("utf-8", "surrogateescape")
        if isinstance(fn, str):
            info["filename"] = fn[:MSG_CAP]
    return info


MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20


def _collapse_huge_pages():
    """Best effort, once, in the template: backs its densely populated
    anonymous memory (a preload's heap is tens of megabytes) with
    transparent huge pages. A fork copies, and a child's exit tears down,
    one page-table entry per 2 MiB instead of 512 and takes one reference
    per huge page instead of 512; a child that writes into one splits just
    that one. It cuts the CPU a job costs with pandas preloaded by about a
    fifth. MADV_COLLAPSE (Linux 6.1) works whatever the system's THP
    setting says ("never" aside), and leaves the regions' own flags alone,
    so a job's new memory is still faulted in 4 KiB pages. Only regions
    at least 7/8 populated are collapsed, so that it adds little memory."""
    try:
        madvise = _libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        ranges = []
        with open("/proc/self/smaps") as f:
            region = None
            for line in f:
                fields = line.split()
                if fields and not fields[0].endswith(":"):
                    region = None
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    name = fields[5] if len(fields) > 5 else ""
                    if fields[1] == "rw-p" and name in ("", "[heap]"):
                        region = (lo, hi)
                elif region is not None and fields[0] == "Anonymous:":
                    lo, hi = region
                    if int(fields[1]) * 1024 * 8 >= (hi - lo) * 7:
                        start = (lo + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
                        end = hi & ~(HUGE_PAGE - 1)
                        if end - start >= HUGE_PAGE:
                            ranges.append((start, end - start))
                    region = None
        for start, length in ranges:
            madvise(start, length, MADV_COLLAPSE)  # EINVAL on older kernels: nothing changes
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


# The files mapped before any preload is imported: the interpreter, the C
# library and the extension modules the runner itself imports (see
# _copy_file_ptes_at_fork). Set by main.
_RUNTIME_FILES = frozenset()


def _mapped_files():
    """The paths of the files this process maps (/proc/self/maps)."""
    files = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/"):
                    files.add(fields[5])
    except OSError:
        pass
    return frozenset(files)


def _copy_file_ptes_at_fork(files):
    """Best effort, once, in the template: makes every fork copy the
    template's page-table entries of its read-only mappings of files (the
    interpreter's code and constants, the C library's, the runner's own
    extension modules'), so that a spare finds them mapped rather than
    faulting each in again.

    Linux copies a mapping's entries at fork only when the mapping holds
    anonymous pages (has an anon_vma); a read-only file mapping holds none,
    and a fresh process takes a page fault for every 64 KiB of code it
    runs that its parent mapped long ago: some 85 per spare, a fifth of
    its page faults. Writing one byte of such a mapping back onto itself
    through /proc/self/mem (as a debugger sets a breakpoint) makes the
    kernel give that page a private copy and the mapping an anon_vma; the
    byte's value does not change, and neither does the mapping's
    protection (never writable, never writable and executable at once).
    The fork then copies the mapping's entries (about 60 ns each, for a
    fault's ~3 us on a VM). Only the files mapped before any preload
    (files): a preload's libraries are large and a trivial job's spare
    touches little of them.

    Where /proc/self/mem cannot be written (a pool that confines itself
    with Landlock gives its templates /proc read-only; a kernel booted
    with proc_mem.force_override=never), the byte is stored through the
    mapping itself, made writable for that one store and then given its
    protection back (code stays executable throughout, as the template
    runs it; no job exists yet, and a job may mprotect its own memory
    anyway). If a protection cannot be given back, the template says so:
    every spare then fails its setup. Returns that error, or None."""
    try:
        mem = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        mem = -1
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
        for line in lines:
            fields = line.split()
            # Private, readable and not writable: "r-xp", "r--p".
            if len(fields) < 6 or fields[5] not in files or fields[1][0] != "r" or fields[1][1] != "-" or fields[1][3] != "p":
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-", 1))
            try:
                if mem < 0:
                    raise OSError("no /proc/self/mem")
                os.pwrite(mem, os.pread(mem, 1, lo), lo)
            except OSError:
                err = _store_byte_in_place(lo, hi, fields[1][2] == "x")
                if err:
                    return err
    except Exception:  # noqa: BLE001 - an optimisation only
        pass
    finally:
        if mem >= 0:
            os.close(mem)
    return None


PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4


def _store_byte_in_place(lo, hi, executable):
    """_copy_file_ptes_at_fork's way without /proc/self/mem: the mapping
    [lo, hi) made writable (mprotect over all of it, so that it stays one
    mapping), its first byte stored back onto itself, its protection
    given back. Returns an error when the protection could not be given
    back, else None (a refused mprotect changes nothing)."""
    prot = PROT_READ | (PROT_EXEC if executable else 0)
    mprotect = _libc.mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    mprotect.restype = ctypes.c_int
    if mprotect(lo, hi - lo, prot | PROT_WRITE) != 0:
        return None
    try:
        b = ctypes.c_ubyte.from_address(lo)
        b.value = b.value
    finally:
        restored = mprotect(lo, hi - lo, prot) == 0
    if not restored:
        return "mprotect: cannot make %x-%x read-only again: %s" % (lo, hi, os.strerror(ctypes.get_errno()))
    return None


def _close_all_but(keep):
    for lo, hi in _close_ranges(keep):
        os.closerange(lo, hi)


def _close_ranges(keep):
    """The [lo, hi) ranges of descriptors that are not in keep."""
    ranges = []
    lo = 0
    for fd in sorted(keep) + [None]:
        hi = fd if fd is not None else 1 << 20
        if hi > lo:
            ranges.append((lo, hi))
        if fd is not None:
            lo = fd + 1
    return tuple(ranges)


# ---------------------------------------------------------------- display
#
# Rich outputs: pynox_display.display(obj) and matplotlib figures become
# "display" frames, {"t": "display", "step", "mime", "data"}, written like
# host calls (under host_lock, never halfway through when SIGINT comes).
# Binary data (PNG, JPEG) goes as base64, text as itself. What the runner
# will not send (past the caps below, or too large) goes as a notice,
# {"t": "display", "step", "mime", "dropped": true}, which the pool
# counts; the pool checks every frame again (display.go).

MAX_OUTPUTS = 64  # display outputs kept per job or step (display.go: MaxOutputs)
MAX_OUTPUTS_BYTES = 8 << 20  # bytes of their data in all (display.go: MaxOutputsBytes)
MAX_OUTPUT_BYTES = 1 << 20  # bytes of one output's data (display.go: MaxOutputBytes)
MAX_DISPLAY_FRAME = MAX_CALL + (32 << 10)  # a display frame, escapes included (ctl.go: maxCtlFrame)
MPL_BACKEND = "pynox_mpl"  # the matplotlib backend a job gets (MPLBACKEND=module://pynox_mpl)

# The representations display() looks for, richest first: (method, MIME
# type, binary). IPython sends them all and lets the front end choose;
# pynox chooses, and sends the first the object has.
_REPR_METHODS = (
    ("_repr_png_", "image/png", True), ("_repr_jpeg_", "image/jpeg", True),
    ("_repr_svg_", "image/svg+xml", False), ("_repr_html_", "text/html", False),
    ("_repr_markdown_", "text/markdown", False), ("_repr_json_", "application/json", False),
)
_RAW_MIMES = {mime: binary for _m, mime, binary in _REPR_METHODS}
_RAW_MIMES["text/plain"] = False


class _Display:
    """The job's display channel: counts what a step sent, and writes the
    frames. Before a job (in the template, a spare) nothing is sent."""

    def __init__(self):
        self.spare = None
        self.step = 0
        self.count = 0
        self.size = 0

    def send(self, mime, data):
        spare = self.spare
        if spare is None:
            return
        if isinstance(data, (bytes, bytearray, memoryview)):
            body = binascii.b2a_base64(bytes(data), newline=False)
        else:
            body = str.__str__(data).encode("utf-8", "replace")
        held = spare.hold_interrupt()
        try:
            with spare.host_lock:
                if self.step != spare.step:
                    self.step, self.count, self.size = spare.step, 0, 0
                quoted = json.dumps(mime)
                payload = None
                if self.count < MAX_OUTPUTS and len(body) <= MAX_OUTPUT_BYTES and self.size + len(body) <= MAX_OUTPUTS_BYTES:
                    text = json.dumps(body.decode("utf-8"), ensure_ascii=False).encode("utf-8")
                    payload = b'{"t":"display","step":%d,"mime":%s,"data":%s}' % (spare.step, quoted.encode(), text)
                    if len(payload) > MAX_DISPLAY_FRAME:
                        payload = None
                if payload is None:
                    payload = b'{"t":"display","step":%d,"mime":%s,"dropped":true}' % (spare.step, quoted.encode())
                else:
                    self.count += 1
                    self.size += len(body)
                framed = _frame(payload)
                if len(payload) > INLINE_FRAME:
                    _write_all(FD, framed[:4])
                    _ring()
                    _write_all(FD, memoryview(framed)[4:])
                else:
                    _write_all(FD, framed)
                _ring()
        finally:
            spare.release_interrupt(held, True)


_DISPLAY = _Display()


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _represent(obj):
    """The (MIME type, data) display() sends for obj: a matplotlib figure's
    PNG, else the first rich representation obj's type defines, else its
    repr as text/plain."""
    mf = sys.modules.get("matplotlib.figure")
    if mf is not None and isinstance(obj, mf.Figure):
        return "image/png", _figure_png(obj)
    for meth, mime, binary in _REPR_METHODS:
        r = _rich_repr(obj, meth, mime, binary)
        if r is not None:
            return mime, r
    return "text/plain", _value_repr(obj)


def _rich_repr(obj, meth, mime, binary):
    """obj's representation by its type's method meth, or None: methods
    looked up on the type (an object whose __getattr__ answers anything
    has none), a (data, metadata) pair taken as its data, and a method that
    raises printed to stderr and skipped, as IPython does."""
    m = getattr(type(obj), meth, None)
    if m is None or not callable(m):
        return None
    try:
        r = m(obj)
        if isinstance(r, tuple) and len(r) == 2:
            r = r[0]
        if r is None:
            return None
        if binary:
            return bytes(r) if isinstance(r, (bytes, bytearray)) else None
        if mime == "application/json":
            return json.dumps(r, allow_nan=False)
        if isinstance(r, (bytes, bytearray)):
            return bytes(r).decode("utf-8", "replace")
        return str.__str__(r) if isinstance(r, str) else None
    except Exception:  # noqa: BLE001 - the object's own code failed
        traceback.print_exc()
        return None


def _has_rich_repr(obj):
    t = type(obj)
    return any(callable(getattr(t, meth, None)) for meth, _mime, _b in _REPR_METHODS if meth != "_repr_json_")


def display(*objs, raw=False):
    """Shows each object as a rich output of the job's result: a matplotlib
    figure as PNG; an object whose type has _repr_png_, _repr_jpeg_,
    _repr_svg_, _repr_html_, _repr_markdown_ or _repr_json_ by the first
    of those (in that order); anything else by its repr (text/plain).
    With raw=True each object is a dict of MIME type to data, and the
    first of the types above (or text/plain) that it holds is sent as it
    is (bytes for images)."""
    for obj in objs:
        if raw:
            if not isinstance(obj, dict):
                raise TypeError("display(raw=True) takes dicts of MIME type to data, not %s" % _TYPE_NAME(type(obj)))
            for mime, binary in _RAW_MIMES.items():
                data = obj.get(mime)
                if data is None:
                    continue
                if binary and not isinstance(data, (bytes, bytearray)):
                    raise TypeError("display(raw=True): %s data must be bytes" % mime)
                if not binary and not isinstance(data, str):
                    data = json.dumps(data) if mime == "application/json" else str(data)
                _DISPLAY.send(mime, data)
                break
            continue
        mime, data = _represent(obj)
        _DISPLAY.send(mime, data)


def _show_figures(*_args, **_kwargs):
    """matplotlib's show() in a job, and what ends each job and step: every
    open figure becomes a PNG output, and is closed."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    if helpers is None:
        return
    managers = helpers.Gcf.get_all_fig_managers()
    if not managers:
        return
    try:
        for m in managers:
            try:
                png = _figure_png(m.canvas.figure)
            except Exception:  # noqa: BLE001 - the figure's own drawing failed
                traceback.print_exc()
                continue
            _DISPLAY.send("image/png", png)
    finally:
        helpers.Gcf.destroy_all()


class _RichObject:
    def __init__(self, data):
        self.data = data

    def __repr__(self):
        return "<%s object>" % _TYPE_NAME(type(self))


class HTML(_RichObject):
    """HTML text, shown as text/html."""

    def _repr_html_(self):
        return self.data


class Markdown(_RichObject):
    """Markdown text, shown as text/markdown."""

    def _repr_markdown_(self):
        return self.data


class SVG(_RichObject):
    """An SVG document, shown as image/svg+xml."""

    def _repr_svg_(self):
        return self.data


class Image(_RichObject):
    """PNG bytes, shown as image/png."""

    def _repr_png_(self):
        return self.data


class _MplBackendFinder:
    """Finds the matplotlib backend module pynox_mpl (last on sys.meta_path,
    so no other import pays for it): the Agg canvas, whose show() turns the
    open figures into outputs. MPLBACKEND names it, so that matplotlib
    loads it when it first needs a backend, in the template or in a job."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != MPL_BACKEND:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, cls)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        from matplotlib.backend_bases import FigureManagerBase
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        module.__doc__ = "pynox's matplotlib backend: Agg, with show() making each open figure a PNG output."
        module.FigureCanvas = FigureCanvasAgg
        module.FigureManager = FigureManagerBase
        module.show = _show_figures


def _mpl_config_dir(parent):
    """A fresh private directory for matplotlib's configuration and font
    cache while the template imports its preloads (MPLCONFIGDIR), beneath
    parent (the pool's scratch directory, which a self-confined pool's
    template may write), or None when the environment names one or it
    cannot be made. Without it matplotlib, run as root
    with HOME=/nonexistent, would create /nonexistent/.config and .cache."""
    if os.environ.get("MPLCONFIGDIR"):
        return None
    d = os.path.join(parent or os.environ.get("TMPDIR") or "/tmp", "pynox-mpl-" + os.urandom(8).hex())
    try:
        os.mkdir(d, 0o700)
    except OSError:
        return None  # a self-confined pool's template cannot write there (nor to HOME)
    os.environ["MPLCONFIGDIR"] = d
    return d


def _end_mpl_config_dir(d):
    """Removes the directory of _mpl_config_dir once the preloads are in:
    matplotlib holds its font cache in memory, and jobs get no variable
    naming a directory they cannot write."""
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    if os.environ.get("MPLCONFIGDIR") == d:
        del os.environ["MPLCONFIGDIR"]


def _install_display():
    """The pynox_display module and the matplotlib backend, for every job
    of the template (a module object and a finder: nothing is imported)."""
    mod = types.ModuleType("pynox_display", "Rich outputs of a pynox job: display(obj) and the classes HTML, "
                           "Markdown, SVG and Image. matplotlib figures are shown as PNG at plt.show() and at "
                           "the end of the job or step.")
    mod.display = display
    for cls in (HTML, Markdown, SVG, Image):
        cls.__module__ = "pynox_display"
        setattr(mod, cls.__name__, cls)
    display.__module__ = "pynox_display"
    mod.__all__ = ["display", "HTML", "Markdown", "SVG", "Image"]
    sys.modules["pynox_display"] = mod
    sys.meta_path.append(_MplBackendFinder)
    os.environ.setdefault("MPLBACKEND", "module://" + MPL_BACKEND)


# The functions a spare runs for a plain one-shot job, in about the order
# it runs them (see _relayout): module-level names, and Class.method.
_SPARE_PATH = (
    "Spare.main", "Spare.prepare", "_check", "Template.spare_plan", "Spare.new_ruleset", "Spare.job_layer",
    "Spare.warm_up", "_cpu_contended", "Spare.new_main", "_reseed_numpy", "_recv_with_fds", "_scan_text",
    "Spare.confine", "Spare.add_rule", "Template.spare_blocks", "Spare.run", "_split_at_last_line",
    "_compile_split", "Spare.end_figures", "Spare.finish", "_flush_std", "_frame", "_write_all", "_ring",
    "Spare.rehearse", "_scan_frame", "_address_space", "Spare.on_sigint",
)


def _fresh_const(obj):
    """A new object equal to the constant obj, where one can be made (a
    string, bytes, a number, a tuple or frozenset of them, a code object);
    obj itself otherwise (None, True, a cached small int or character)."""
    t = type(obj)
    if t is str or t is bytes:
        return (obj + obj[:1])[:len(obj)] if len(obj) > 1 else obj
    if t is int:
        return obj + 0
    if t is tuple:
        return tuple([_fresh_const(x) for x in obj])
    if t is frozenset:
        return frozenset([_fresh_const(x) for x in obj])
    if t is types.CodeType:
        return obj.replace(co_consts=tuple([_fresh_const(x) for x in obj.co_consts]))
    return obj


def _relayout(names):
    """Best effort, once, in the template before its rehearsals: gives
    each function named (see _SPARE_PATH) a new function object and code
    object with new copies of its constants, made one after another, so
    that they lie together on a few pages rather than where the runner's
    compile left them, scattered among the template's other objects. A
    spare writes to each object it uses (its reference count), and copies
    each page it writes: the fewer pages these lie on, the fewer copies."""
    g = globals()
    for qual in names:
        try:
            owner, _, name = qual.rpartition(".")
            holder = g[owner] if owner else None
            f = holder.__dict__[name] if holder is not None else g[name]
            nf = types.FunctionType(_fresh_const(f.__code__), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
            nf.__qualname__, nf.__kwdefaults__, nf.__doc__, nf.__module__ = f.__qualname__, f.__kwdefaults__, f.__doc__, f.__module__
            nf.__annotations__ = f.__annotations__
            nf.__dict__.update(f.__dict__)
            if holder is not None:
                setattr(holder, name, nf)
            else:
                g[name] = nf
        except Exception:  # noqa: BLE001 - an optimisation only
            pass


# The objects that fill the template's partly used obmalloc pools (see
# _fill_pools): kept for the template's life, never touched again.
_POOL_FILL = []
# The most the fill may hold; a heap whose pools have more room than this
# to fill is left as it is.
POOL_FILL_MAX = 16 << 20


def _pool_vacancies():
    """The free blocks in the obmalloc pools in use, by block size: a list
    of (size, free blocks), read from sys._debugmallocstats (the only
    place CPython reports them), which writes them on C stderr, here
    descriptor 2 pointed at a pipe for the call (its report is some 4 KiB,
    far less than a pipe holds)."""
    r, w = os.pipe()
    saved = os.dup(2)
    try:
        _flush_std()
        os.dup2(w, 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
        os.close(w)
        w = -1
        chunks = []
        while True:
            b = os.read(r, 65536)
            if not b:
                break
            chunks.append(b)
    finally:
        for fd in (r, w, saved):
            if fd >= 0:
                os.close(fd)
    out, table = [], False
    for line in b"".join(chunks).decode("ascii", "replace").splitlines():
        f = line.split()
        if f[:2] == ["class", "size"]:
            table = True
        elif table and f and f[0].startswith("-"):
            continue
        elif table:
            if len(f) != 5 or not all(x.isdigit() for x in f):
                break
            out.append((int(f[1]), int(f[4])))
    return out


def _fill_pools():
    """Best effort, in the template, last before its first fork (and once
    before _relayout, whose new objects then lie together): fills every
    free block of the obmalloc pools in use with an object of its size,
    kept for the template's life. A spare's new objects (its
    job frame's dictionary and strings, its __main__, its compile's) then
    come from fresh pools, a few pages per block size, rather than from
    the free blocks scattered over the template's partly used pools, each
    on a page the spare copies on its first write (and, when a pool fills,
    a write to the next one's header too). Its cost is the memory of
    those free blocks (a few hundred KiB in a template without preloads),
    shared by every spare, never copied. Filled twice: the first fill's
    own bookkeeping frees blocks again."""
    try:
        filled = 0
        for _ in range(2):
            vacancies = _pool_vacancies()
            filled += sum(size * free for size, free in vacancies)
            if filled > POOL_FILL_MAX:
                return
            fill = [None] * sum(free for _size, free in vacancies)
            i = 0
            for size, free in vacancies:
                for n in range(free):
                    if size <= 16:
                        obj = object()  # 16 bytes
                    elif size <= 32:
                        obj = (1 << 20) + n  # a one-digit int: 28 bytes
                    else:
                        obj = b"\0" * (size - 33)  # bytes: 33 + its length
                    fill[i] = obj
                    i += 1
            _POOL_FILL.append(fill)
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


def _trim_heap():
    """Gives the C heap's free pages back to the kernel (glibc's
    malloc_trim; best effort): memory freed in the template but left
    resident would be copied into every fork's page tables and torn down
    at every child's exit."""
    try:
        _libc.malloc_trim(0)
    except Exception:  # noqa: BLE001 - not glibc: an optimisation only
        pass


def main():
    # The host wrote this program to descriptor 0 (template.go: runnerBoot),
    # now at its end: /dev/null from here on, as a spare's is.
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _trim_heap()  # what the compile of this program freed
    # Descriptors the host's own parent leaked to it without close-on-exec
    # end here: the template holds only 0-2 and its channel.
    _close_all_but({0, 1, 2, FD})
    global _RUNTIME_FILES
    _RUNTIME_FILES = _mapped_files()
    _install_display()
    tpl = Template()
    try:
        tpl.init()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - anything here is a fatal start-up error
        tpl.fatal("template start failed: %s: %s" % (type(e).__name__, e))
    tpl.loop()


main()
