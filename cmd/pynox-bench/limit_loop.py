# limit_loop.py: the limit of pynox's design, the yardstick pynox-bench
# measures pynox against.
#
# A minimal confined fork-per-job loop with pynox's process layout and
# nothing else: a front process reads job lines and passes each to a
# worker with room (one job running, one waiting at most); each worker is
# a warm template (forked from the front once the preloads are imported)
# that keeps one pre-forked, pre-confined child (a "spare"), hands it the
# job's code, writes the job's result line itself and then forks the next
# spare (at once when another job waits). A spare reports its exit status
# on a pipe before it exits, as a pynox job reports "done". It
# applies the same confinement as a pynox job, from the same sources:
#
#   - the front and the templates: empty capability sets (bounding set included),
#     no_new_privs, SIGXFSZ ignored, and pynox's seccomp template layer;
#   - a spare, before its job: descriptors 0 = /dev/null, 1 and 2 = the
#     job's pipes, 3 = the pipe its job arrives on, 4 = its status pipe,
#     nothing else; its own session, SIGKILL on the template's death; a Landlock ruleset with
#     pynox's handled rights and runtime rules; RLIMIT_CORE, NOFILE,
#     SIGPENDING, RTPRIO, NICE and MEMLOCK as a job's; pynox's seccomp job
#     layer (the variant without the network) on top of the template layer;
#   - a spare, with its job: RLIMIT_AS (what it maps + the allowance),
#     RLIMIT_FSIZE, RLIMIT_CPU, then landlock_restrict_self.
#
# The seccomp programs, Landlock rights and rules, limits and syscall
# numbers are not written here: pynox-bench takes them from pynox's own Go
# packages (internal/worker.Policy, the frame a pynox template is sent) and
# passes them in a JSON file. If any step fails, the spare exits with status
# 71 before it reads its job: no code runs unconfined.
#
# What it leaves out of pynox on purpose: the protocol (a job is its code
# on a pipe, closed; its result is its output pipes and a status byte),
# per-job cgroups, PID namespaces, timeouts, output caps, sessions, host
# functions, grants and a job's environment. What makes a pynox fork cheap
# it keeps: the template runs the job's path once, freezes its objects out
# of the garbage collector, backs its heap with huge pages and gives its
# runtime's read-only file mappings an anonymous page (so that a fork
# copies their page-table entries) before any fork, and a spare warms up
# (runs a trivial job's path with its output to /dev/null) before its
# seccomp layer, unless --no-warm.
#
# It speaks the same minimal JSON Lines as naive_server.py: a ready line,
# then {"id", "code"} in and {"id", "exit", "stdout", "stderr",
# "duration_us"} out, in completion order.
#
# Usage (started like pynox's runner, python3 -I -B -c <this file>):
#   python3 -I -B -c <src> --paths [--preload=mod,...]
#       prints the paths the runtime reads, as a pynox template reports them
#   python3 -I -B -c <src> --policy=FILE [--workers=N] [--preload=mod,...] [--no-warm]
#       runs the loop (--no-warm: spares skip their warm-up)
import builtins
import collections
import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import sys
import time
import traceback

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
LANDLOCK_RULE_PATH_BENEATH = 1
JOB_FD = 3  # in a spare: the pipe its job's code arrives on
STATUS_FD = 4  # in a spare: the pipe it writes its exit status on
STATUS_SETUP = 71
WARM = "print(sum(range(100)))"

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


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


def check(ret, what):
    if ret < 0:
        raise OSError(ctypes.get_errno(), "%s: %s" % (what, os.strerror(ctypes.get_errno())))
    return ret


def parse_args(argv):
    opts = {"workers": 1, "preload": [], "policy": None, "paths": False, "warm": True}
    for arg in argv:
        if arg.startswith("--workers="):
            opts["workers"] = max(1, int(arg.split("=", 1)[1]))
        elif arg.startswith("--preload="):
            opts["preload"] = [m for m in arg.split("=", 1)[1].split(",") if m]
        elif arg.startswith("--policy="):
            opts["policy"] = arg.split("=", 1)[1]
        elif arg == "--no-warm":
            opts["warm"] = False
        elif arg == "--paths":
            opts["paths"] = True
        else:
            sys.exit("limit_loop.py: unknown argument %r" % arg)
    return opts


def runtime_paths(preloaded):
    """The paths a pynox template reports in its hello frame."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths += [p for p in sys.path if p]
    for mod in preloaded:
        f = getattr(sys.modules.get(mod), "__file__", None)
        if f:
            paths.append(os.path.dirname(f) if os.path.basename(f).startswith("__init__.") else f)
    return paths


class Loop:
    def __init__(self, policy):
        self.policy = policy
        self.nr = policy["syscalls"]
        ll = policy["landlock"]
        if ll.get("error") or policy.get("seccomp_error"):
            raise RuntimeError("policy unusable: %s" % (ll.get("error") or policy.get("seccomp_error")))
        self.attr = RulesetAttr(ll["handled_fs"], ll["handled_net_deny"], ll["scoped"])
        self.attr_size = 24 if ll["abi"] >= 6 else (16 if ll["abi"] >= 4 else 8)
        self.progs = {}
        for key in ("template", "deny"):
            raw = bytes.fromhex(policy["seccomp"][key])
            buf = ctypes.create_string_buffer(raw, len(raw))
            self.progs[key] = (SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p)), buf)
        # The runtime rules' paths, opened once; each spare adds them to its
        # own ruleset and closes them.
        self.rules = []
        for path, access in policy["runtime_rules"]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            # Clear of the descriptors 0-4 a spare gives its own pipes.
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)
            os.close(fd)
            self.rules.append((PathBeneath(access, high), high))
        self.keep_fds = {fd for _, fd in self.rules}
        self.zombies = []  # spares that reported and have yet to be reaped

    def confine_template(self):
        cap_last = self.policy["cap_last"]
        for cap in range(cap_last + 1):
            if _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (1, 22):
                check(-1, "prctl(PR_CAPBSET_DROP)")
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        hdr, data = CapHeader(0x20080522, 0), (CapData * 2)()
        check(_syscall(self.nr["capset"], ctypes.byref(hdr), ctypes.byref(data)), "capset")
        check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        prog, _ = self.progs["template"]
        check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp (template layer)")

    def fork_spare(self):
        """Forks a spare; returns its pid and the template's ends of its
        pipes: the job's code (in), its status, stdout and stderr (out)."""
        job_r, job_w = os.pipe()
        st_r, st_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            status = STATUS_SETUP
            try:
                try:
                    vm = self.prepare(parent, job_r, st_w, out_w, err_w)
                except BaseException:  # noqa: BLE001 - nothing runs unconfined
                    traceback.print_exc()
                    os._exit(STATUS_SETUP)
                status = 70
                self.run(vm)
            finally:
                os._exit(status)
        for fd in (job_r, st_w, out_w, err_w):
            os.close(fd)
        return pid, job_w, st_r, out_r, err_r

    def prepare(self, parent, job_r, st_w, out_w, err_w):
        """A spare's request-independent steps; returns its address space."""
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(job_r, JOB_FD)
        os.dup2(st_w, STATUS_FD)
        os.set_inheritable(JOB_FD, False)
        os.set_inheritable(STATUS_FD, False)
        keep = sorted({0, 1, 2, JOB_FD, STATUS_FD} | self.keep_fds)
        lo = 0
        for fd in keep + [1 << 20]:
            if fd > lo:
                os.closerange(lo, fd)
            lo = fd + 1
        os.setsid()
        check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent:
            os._exit(0)
        ruleset = check(_syscall(self.nr["landlock_create_ruleset"], ctypes.byref(self.attr), self.attr_size, 0),
                        "landlock_create_ruleset")
        add = self.nr["landlock_add_rule"]
        for rule, fd in self.rules:
            check(_syscall(add, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0), "landlock_add_rule")
            os.close(fd)
        self.ruleset = ruleset
        if self.warm:
            # Take the copy-on-write faults of a job's path now, off its
            # clock, as a pynox spare's warm-up does.
            saved, null = os.dup(1), os.open("/dev/null", os.O_WRONLY)
            os.dup2(null, 1)
            exec(compile(WARM, "<warm>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))  # runner.py MAX_FILES
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (64, 64))  # runner.py MAX_SIGPENDING
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
        fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        vm = int(os.read(fd, 256).split()[0]) * os.sysconf("SC_PAGE_SIZE")
        os.close(fd)
        prog, _ = self.progs["deny"]
        check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp (job layer)")
        return vm

    def run(self, vm):
        """A spare's job: read the code, finish confining, run it."""
        chunks = []
        while True:
            b = os.read(JOB_FD, 65536)
            if not b:
                break
            chunks.append(b)
        if not chunks:
            os._exit(0)  # the loop is shutting down
        lim = self.policy["job_limits"]
        try:
            resource.setrlimit(resource.RLIMIT_AS, (vm + lim["memory"], vm + lim["memory"]))
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
            resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
            check(_syscall(self.nr["landlock_restrict_self"], self.ruleset, 0), "landlock_restrict_self")
            os.close(self.ruleset)
            os.close(JOB_FD)
        except BaseException:  # noqa: BLE001 - nothing runs unconfined
            traceback.print_exc()
            os._exit(STATUS_SETUP)
        code = 0
        try:
            exec(compile(b"".join(chunks), "<code>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - the job's exception
            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        # The result before the exit, as a pynox job reports "done" before
        # it exits: the output pipes close, then the status byte goes out,
        # and the kernel tears the process down off the job's clock.
        os.close(1)
        os.close(2)
        try:
            os.write(STATUS_FD, bytes([code & 0xFF]))
        except OSError:
            pass
        os._exit(code & 0xFF)


def collapse_huge_pages():
    """Backs the template's densely populated anonymous memory with huge
    pages (MADV_COLLAPSE), as a pynox template does: a fork then copies,
    and an exit tears down, one page-table entry per 2 MiB instead of 512.
    Best effort: regions at least 7/8 populated, nothing on older kernels."""
    huge = 2 << 20
    try:
        madvise = _libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        todo = []
        with open("/proc/self/smaps") as f:
            region = None
            for line in f:
                fields = line.split()
                if fields and not fields[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    name = fields[5] if len(fields) > 5 else ""
                    region = (lo, hi) if fields[1] == "rw-p" and name in ("", "[heap]") else None
                elif region is not None and fields[0] == "Anonymous:":
                    lo, hi = region
                    start, end = (lo + huge - 1) & ~(huge - 1), hi & ~(huge - 1)
                    if int(fields[1]) * 1024 * 8 >= (hi - lo) * 7 and end - start >= huge:
                        todo.append((start, end - start))
                    region = None
        for start, length in todo:
            madvise(start, length, 25)  # MADV_COLLAPSE
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


def mapped_files():
    """The paths of the files this process maps."""
    files = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                files.add(fields[5])
    return files


def copy_file_ptes_at_fork(files):
    """As a pynox template does (runner.py: _copy_file_ptes_at_fork):
    rewrites one byte of each read-only private mapping of the files
    mapped before the preloads through /proc/self/mem, so that the
    mapping holds an anonymous page and a fork copies its page-table
    entries instead of leaving each child to fault the code in again.
    Best effort: nothing changes where the kernel refuses the write."""
    try:
        mem = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
        for line in lines:
            fields = line.split()
            if len(fields) < 6 or fields[5] not in files or fields[1][1] != "-" or fields[1][3] != "p":
                continue
            lo = int(fields[0].split("-", 1)[0], 16)
            try:
                os.pwrite(mem, os.pread(mem, 1, lo), lo)
            except OSError:
                pass
    except Exception:  # noqa: BLE001 - an optimisation only
        pass
    finally:
        os.close(mem)


def emit(data):
    """Writes one result line on stdout, shared by the workers: a write of
    up to PIPE_BUF bytes to a pipe is atomic, so lines of that size never
    interleave (the bench's results are far shorter)."""
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def worker_main(loop, index, job_r, free_w):
    """One worker's template: takes job lines from the front, hands each to
    its spare, forks the next spare, writes the result line and tells the
    front it is done with a job. The next spare is forked once the result
    is out, unless another job waits already (the front queues up to two
    per worker): then at once, so that the fork overlaps the job, as pynox
    does under a backlog."""
    now = time.monotonic
    spare = loop.fork_spare()
    waiting = select.poll()
    waiting.register(job_r, select.POLLIN)
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(job_r, 65536)
            if not chunk:
                os._exit(0)
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        job = json.loads(line)
        t0 = now()
        pid, job_w, st_r, out_r, err_r = spare
        view = memoryview(job["code"].encode())
        try:
            while view:
                view = view[os.write(job_w, view):]
        except BrokenPipeError:
            pass  # the spare died setting up: its exit status says so
        os.close(job_w)
        spare = None
        if b"\n" in buf or waiting.poll(0):
            spare = loop.fork_spare()
        out, err, status = [], [], None
        poller = select.poll()
        sinks = {out_r: out, err_r: err, st_r: None}
        for fd in sinks:
            poller.register(fd, select.POLLIN)
        while sinks:
            for fd, _ev in poller.poll():
                chunk = os.read(fd, 65536)
                sink = sinks[fd]
                if sink is None and chunk:
                    status = chunk[0]
                elif chunk:
                    sink.append(chunk)
                    continue
                poller.unregister(fd)
                os.close(fd)
                del sinks[fd]
        if status is None:
            # Killed, or it died setting up: its wait status is the result.
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        else:
            loop.zombies.append(pid)
        for z in list(loop.zombies):
            if os.waitpid(z, os.WNOHANG)[0]:
                loop.zombies.remove(z)
        emit((json.dumps({
            "id": job.get("id"),
            "exit": status,
            "stdout": b"".join(out).decode("utf-8", "replace"),
            "stderr": b"".join(err).decode("utf-8", "replace"),
            "duration_us": int((now() - t0) * 1e6),
        }, separators=(",", ":")) + "\n").encode())
        # The next spare, forked once the result is out: this process
        # collects results too, and a fork while its job runs would delay
        # them (pynox forks at once, in the template, while its Go host
        # collects the result).
        if spare is None:
            spare = loop.fork_spare()
        os.write(free_w, bytes([index]))


def main():
    opts = parse_args(sys.argv[1:])
    runtime_files = mapped_files()
    for mod in opts["preload"]:
        __import__(mod)
    if opts["paths"]:
        print(json.dumps(runtime_paths(opts["preload"])))
        return
    with open(opts["policy"]) as f:
        policy = json.load(f)
    loop = Loop(policy)
    loop.warm = opts["warm"]
    loop.confine_template()
    # The template is warm: the job's path (compile, exec, print, a result
    # line) has run in it once, before any fork.
    saved, null = os.dup(1), os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 1)
    exec(compile(WARM, "<warm>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    sys.stdout.flush()
    json.loads(json.dumps({"id": 1, "code": "x", "exit": 0, "stdout": "", "stderr": "", "duration_us": 1}))
    os.dup2(saved, 1)
    os.close(saved)
    os.close(null)
    # Everything the template holds is frozen out of the garbage
    # collector, as in a pynox template: a collection in a child would
    # otherwise write to the header of every object it inherited, copying
    # the template's heap page by page.
    gc.collect()
    gc.freeze()
    collapse_huge_pages()
    copy_file_ptes_at_fork(runtime_files)

    # One template per worker, as in pynox, forked from this one (the
    # front), which only passes job lines on to free workers.
    workers = opts["workers"]
    free_r, free_w = os.pipe()
    pipes = []
    for index in range(workers):
        job_r, job_w = os.pipe()
        if os.fork() == 0:
            try:
                os.close(job_w)
                os.close(free_r)
                for w in pipes:
                    os.close(w)
                os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
                worker_main(loop, index, job_r, free_w)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                os._exit(70)
        os.close(job_r)
        pipes.append(job_w)
    os.close(free_w)
    emit((json.dumps({"event": "ready", "pid": os.getpid(), "workers": workers,
                      "preloaded_modules": opts["preload"]}) + "\n").encode())

    poller = select.poll()
    poller.register(0, select.POLLIN)
    poller.register(free_r, select.POLLIN)
    # Each worker takes up to two jobs: one running, one waiting (which
    # tells it to fork its next spare at once). Idle workers come first.
    free = collections.deque(list(range(workers)) * 2)
    pending = collections.deque()
    inbuf = b""
    eof = False
    while True:
        while pending and free:
            line = pending.popleft()
            view = memoryview(line)
            w = pipes[free.popleft()]
            while view:
                view = view[os.write(w, view):]
        if eof and not pending and len(free) == 2 * workers:
            break
        for fd, _ev in poller.poll():
            chunk = os.read(fd, 65536)
            if fd == free_r:
                if not chunk:
                    sys.exit("limit_loop.py: a worker died")
                free.extend(chunk)
                continue
            if not chunk:
                eof = True
                poller.unregister(0)
                continue
            inbuf += chunk
            *lines, inbuf = inbuf.split(b"\n")
            pending.extend(x + b"\n" for x in lines if x.strip())
    for w in pipes:
        os.close(w)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break


main()
