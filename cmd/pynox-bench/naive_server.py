# naive_server.py: the baseline pynox-bench compares pynox against.
#
# A deliberately naive fork-per-request job server, the first thing one
# would write by hand: it imports the --preload modules once, then reads
# JSON requests ({"id": ..., "code": ...}) one per line on stdin and, for
# each, os.fork()s a child that exec()s the code with its stdout and stderr
# captured to pipes. The parent collects the output, reaps the child and
# writes one JSON result line ({"id", "exit", "stdout", "stderr",
# "duration_us"}) on stdout, in completion order. At most --workers
# children run at once; further requests wait in a queue.
#
# It does nothing pynox does beyond that: no spare child forked ahead of
# time, no confinement (no Landlock, seccomp, rlimits, capability drop or
# descriptor hygiene), no output cap, no timeout. Standard library only.
#
# Usage: python3 naive_server.py [--workers=N] [--preload=mod,mod]
import builtins
import collections
import json
import os
import selectors
import sys
import time
import traceback


def parse_args(argv):
    workers, preload = 1, []
    for arg in argv:
        if arg.startswith("--workers="):
            workers = max(1, int(arg.split("=", 1)[1]))
        elif arg.startswith("--preload="):
            preload = [m for m in arg.split("=", 1)[1].split(",") if m]
        else:
            sys.exit("naive_server.py: unknown argument %r" % arg)
    return workers, preload


def emit(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def child_main(job, out_w, err_w):
    # In the child: descriptors 1 and 2 become the job's pipes.
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    code = 0
    try:
        exec(compile(job["code"], "<code>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
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
    os._exit(code & 0xFF)


class Running:
    def __init__(self, job, pid, start):
        self.job, self.pid, self.start = job, pid, start
        self.out, self.err = [], []
        self.open = 2


def main():
    workers, preload = parse_args(sys.argv[1:])
    for mod in preload:
        __import__(mod)
    emit({"event": "ready", "pid": os.getpid(), "workers": workers, "preloaded_modules": preload})

    sel = selectors.DefaultSelector()
    os.set_blocking(0, False)
    sel.register(0, selectors.EVENT_READ, None)
    pending = collections.deque()
    running = 0
    inbuf = b""
    eof = False

    def start(job):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(out_r)
                os.close(err_r)
                child_main(job, out_w, err_w)
            finally:
                os._exit(70)
        os.close(out_w)
        os.close(err_w)
        r = Running(job, pid, t0)
        sel.register(out_r, selectors.EVENT_READ, (r, r.out))
        sel.register(err_r, selectors.EVENT_READ, (r, r.err))

    while True:
        while pending and running < workers:
            start(pending.popleft())
            running += 1
        if eof and not pending and running == 0:
            return
        for key, _ in sel.select():
            if key.fd == 0:
                chunk = os.read(0, 65536)
                if not chunk:
                    eof = True
                    sel.unregister(0)
                    continue
                inbuf += chunk
                *lines, inbuf = inbuf.split(b"\n")
                for line in lines:
                    if line.strip():
                        pending.append(json.loads(line))
                continue
            r, sink = key.data
            chunk = os.read(key.fd, 65536)
            if chunk:
                sink.append(chunk)
                continue
            sel.unregister(key.fd)
            os.close(key.fd)
            r.open -= 1
            if r.open:
                continue
            _, status = os.waitpid(r.pid, 0)
            running -= 1
            emit({
                "id": r.job.get("id"),
                "exit": os.waitstatus_to_exitcode(status),
                "stdout": b"".join(r.out).decode("utf-8", "replace"),
                "stderr": b"".join(r.err).decode("utf-8", "replace"),
                "duration_us": int((time.monotonic() - r.start) * 1e6),
            })


main()
