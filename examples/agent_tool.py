#!/usr/bin/env python3
"""A Python client for `pynox pool`: run untrusted code as an agent's tool.

    from agent_tool import Pool

    with Pool(workers=2) as pool:
        result = pool.run("print(sum(range(10)))")
        print(result["stdout"])            # "45\\n"
        print(pool.stats()["jobs"])        # 1

    # A tool description and callable for a model's tool list:
    tool = pool.tool(allow_read=["data"])
    tool("import os; print(os.listdir('data'))")

Standard library only. The pool answers in completion order, so a reader
thread routes each result line to the request waiting for its id; any
number of threads may call run() at once.

Run this file directly for a demonstration against a pool built from this
repository: python3 examples/agent_tool.py [path/to/pynox]
"""

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading


class PoolError(Exception):
    """The pool process failed or closed before answering."""


class Pool:
    """A running `pynox pool` process."""

    def __init__(self, binary="pynox", workers=None, preload=(), config=None, python=None, cwd=None):
        args = [binary, "pool"]
        if workers:
            args.append("--workers=%d" % workers)
        if preload:
            args.append("--preload=" + ",".join(preload))
        if config:
            args.append("--config=" + config)
        if python:
            args.append("--python=" + python)
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      cwd=cwd, bufsize=0)
        ready = self._proc.stdout.readline()
        if not ready:
            raise PoolError("pynox pool exited before it was ready (exit %s)" % self._proc.wait())
        self.ready = json.loads(ready)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self._proc.stdout:
            msg = json.loads(line)
            slot = self._waiting.pop(json.dumps(msg.get("id")), None)
            if slot is not None:
                slot["result"] = msg
                slot["event"].set()
        # The pool is gone: wake everyone still waiting.
        for slot in list(self._waiting.values()):
            slot["event"].set()

    def _request(self, req):
        rid = "py-%d" % next(self._ids)
        req = dict(req, id=rid)
        slot = {"event": threading.Event(), "result": None}
        self._waiting[json.dumps(rid)] = slot
        data = (json.dumps(req) + "\n").encode()
        with self._lock:
            try:
                self._proc.stdin.write(data)
            except BrokenPipeError:
                raise PoolError("pynox pool is not running") from None
        slot["event"].wait()
        if slot["result"] is None:
            raise PoolError("pynox pool exited before answering")
        return slot["result"]

    def run(self, code, **fields):
        """Runs code with the given request fields (allow_read, allow_write,
        timeout, memory, env, args, name, profile, ...) and returns the result
        object. Check result["exit"] and result["error"]."""
        return self._request(dict(fields, code=code))

    def stats(self):
        """Returns the pool's counters."""
        return self._request({"stats": True})

    def tool(self, **grants):
        """Returns a callable for a model's tool list: it runs code under the
        given grants and returns what a model should read."""

        def python(code):
            r = self.run(code, **grants)
            out = r["stdout"] + r["stderr"]
            if r["error"]:
                err = r["error"]
                out += "\n%s: %s" % (err["type"], err["message"])
                if err.get("hint"):
                    out += "\nhint: " + err["hint"]
            return out

        python.__doc__ = "Run Python 3 code in a sandbox and return its output. Grants: %s" % (
            json.dumps(grants) if grants else "none (no files, no network)")
        return python

    def close(self):
        """Closes stdin; the pool answers what it accepted and exits 0."""
        try:
            self._proc.stdin.close()
        except BrokenPipeError:
            pass
        code = self._proc.wait()
        self._reader.join(timeout=5)
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _demo(binary):
    with Pool(binary=binary, workers=2) as pool:
        print("ready:", pool.ready)
        r = pool.run("import platform; print('hello from', platform.python_version())")
        print(r["stdout"], end="")
        r = pool.run("open('/etc/passwd').read()")
        print("denied:", r["error"]["type"], "-", r["error"].get("hint"))
        tool = pool.tool()
        print(tool("import os; os.fork()"))
        threads = [threading.Thread(target=pool.run, args=("print(%d)" % i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = pool.stats()
        print("jobs=%d ok=%d failed=%d" % (s["jobs"], s["ok"], s["failed"]))
        if s["jobs"] != 11 or s["ok"] != 9:
            sys.exit("unexpected counters: %r" % s)


if __name__ == "__main__":
    _demo(sys.argv[1] if len(sys.argv) > 1 else (shutil.which("pynox") or os.path.abspath("pynox")))
