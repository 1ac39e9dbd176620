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

    # Host functions (CodeAct): the code calls your Python functions.
    def search(query, limit=3):
        '''Searches the docs.'''   # the tool's description shows it
        return ["hit %d for %s" % (i, query) for i in range(limit)]
    pool.run("from pynox_host import search\nprint(search('pynox', limit=2))",
             functions={"search": search})

    # Sessions: __main__ survives between calls.
    with pool.session(allow_read=["data"]) as s:
        s.run("x = 41")
        print(s.run("print(x + 1)")["stdout"])   # "42\n"
    notebook = pool.tool(session=True, functions={"search": search})

Standard library only. The pool answers in completion order, so a reader
thread routes each result line to the request waiting for its id; any
number of threads may call run() at once. A line the reader cannot decode
is logged and skipped (a call event's call is answered with an error, a
result's request fails with PoolError); if the reader stops, every waiting
request, and every later one, fails with PoolError.

Run this file directly for a demonstration against a pool built from this
repository: python3 examples/agent_tool.py [path/to/pynox]
"""

import inspect
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading

log = logging.getLogger("agent_tool")

# The start of a line the reader could not decode: the pool writes "event"
# (calls only) and "id" first, so these find whom the line was for.
_CALL_PREFIX = re.compile(rb'\{"event":"call","id":(?:"(?:[^"\\]|\\.)*"|[-0-9.eE+]+),(?:"session":"(?:[^"\\]|\\.)*",)?"call_id":(\d+),')
_RESULT_PREFIX = re.compile(rb'\{"id":("(?:[^"\\]|\\.)*"|-?\d+),')


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
        self._sessions = itertools.count(1)
        self._lock = threading.Lock()  # one request line at a time
        self._state = threading.Lock()  # guards _waiting and _stopped
        self._stopped = None  # why the reader stopped, once it has
        self._waiting = {}
        self._functions = {}  # request id -> the host functions its code may call
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        reason = "pynox pool exited before answering"
        try:
            for line in self._proc.stdout:
                try:
                    self._dispatch(line)
                except Exception as e:  # noqa: BLE001 - one bad line must not stop the reader
                    log.warning("skipped a line from pynox pool: %s: %s", type(e).__name__, e)
        except BaseException as e:  # noqa: BLE001 - reported to every waiting request
            reason = "the reader of pynox pool's output failed: %s: %s" % (type(e).__name__, e)
            raise
        finally:
            # Wake everyone still waiting, and refuse new requests.
            with self._state:
                self._stopped = reason
                slots = list(self._waiting.values())
                self._waiting.clear()
            for slot in slots:
                slot["error"] = reason
                slot["event"].set()

    def _dispatch(self, line):
        try:
            msg = json.loads(line)
        except Exception as e:  # noqa: BLE001 - ValueError, RecursionError...
            self._unreadable(line, e)
            return
        if msg.get("event") == "call":
            # A host-function call: answer it on a thread of its own, so
            # that other results keep flowing.
            threading.Thread(target=self._answer, args=(msg,), daemon=True).start()
            return
        self._deliver(msg.get("id"), result=msg)

    def _deliver(self, key, result=None, error=None):
        with self._state:
            slot = self._waiting.pop(key, None)
            self._functions.pop(key, None)
        if slot is not None:
            slot["result"], slot["error"] = result, error
            slot["event"].set()

    def _unreadable(self, line, err):
        """Handles a line that is not JSON Python can read: a call it starts
        is answered with an error, a result fails its request; anything
        else is skipped."""
        what = "%s: %s" % (type(err).__name__, str(err)[:200])
        m = _CALL_PREFIX.match(line)
        if m:
            log.warning("answered an unreadable call event with an error (%s)", what)
            self._write(json.dumps({"reply": {"call_id": int(m.group(1)),
                                              "error": "the client could not read the call (%s)" % what}}))
            return
        m = _RESULT_PREFIX.match(line)
        if m:
            try:
                key = json.loads(m.group(1))
            except ValueError:
                key = None
            if key in self._waiting:
                self._deliver(key, error="unreadable result from pynox pool (%s)" % what)
                return
        log.warning("skipped a line from pynox pool that is not JSON (%s): %r", what, line[:200])

    def _answer(self, call):
        fn = self._functions.get(call.get("id"), {}).get(call["function"])
        try:
            if fn is None:
                raise LookupError("no function %r for request %r" % (call["function"], call.get("id")))
            reply = {"call_id": call["call_id"], "result": fn(*call["args"], **call["kwargs"])}
            data = json.dumps({"reply": reply})  # inside the try: a result that is not JSON is an error too
        except Exception as e:  # noqa: BLE001 - the error goes to the sandbox as HostError
            data = json.dumps({"reply": {"call_id": call["call_id"], "error": "%s: %s" % (type(e).__name__, e)}})
        self._write(data)

    def _write(self, line):
        """Writes one request line (JSON text without its newline)."""
        with self._lock:
            try:
                self._proc.stdin.write((line + "\n").encode())
            except BrokenPipeError:
                raise PoolError("pynox pool is not running") from None

    def _request(self, req, functions=None):
        rid = "py-%d" % next(self._ids)
        req = dict(req, id=rid)
        slot = {"event": threading.Event(), "result": None, "error": None}
        with self._state:
            if self._stopped:
                raise PoolError(self._stopped)
            self._waiting[rid] = slot
            if functions:
                self._functions[rid] = functions
        self._write(json.dumps(req))
        slot["event"].wait()
        if slot["result"] is None:
            raise PoolError(slot["error"] or "pynox pool exited before answering")
        return slot["result"]

    def run(self, code, functions=None, **fields):
        """Runs code with the given request fields (allow_read, allow_write,
        timeout, memory, env, args, name, profile, ...) and returns the result
        object. Check result["exit"] and result["error"].

        functions maps names to callables the code may call through
        pynox_host (from pynox_host import search); they run in this
        process, with JSON arguments and results."""
        if functions:
            fields["functions"] = sorted(functions)
        return self._request(dict(fields, code=code), functions)

    def session(self, functions=None, **grants):
        """Returns a Session: a sandboxed process whose globals survive
        between its run() calls. The grants and functions given here fix its
        permissions."""
        return Session(self, "py-session-%d" % next(self._sessions), grants, functions or {})

    def stats(self):
        """Returns the pool's counters."""
        return self._request({"stats": True})

    def tool(self, session=False, functions=None, **grants):
        """Returns a callable for a model's tool list: it runs code under the
        given grants and returns what a model should read. With session=True
        the tool is stateful (a variable defined in one call is there in the
        next); functions are host functions the code may call, described in
        the tool's docstring with their signatures and docstrings."""
        functions = functions or {}
        state = {"session": None}

        def python(code):
            if session:
                if state["session"] is None:
                    state["session"] = self.session(functions=functions, **grants)
                r = state["session"].run(code)
            else:
                r = self.run(code, functions=functions, **grants)
            out = r["stdout"] + r["stderr"]
            if r["error"]:
                err = r["error"]
                out += "\n%s: %s" % (err["type"], err["message"])
                if err.get("hint"):
                    out += "\nhint: " + err["hint"]
            if r.get("session_ended"):
                out += "\n(the session restarted: its variables are gone)"
            return out

        doc = "Run Python 3 code in a sandbox and return its output. Grants: %s." % (
            json.dumps(grants) if grants else "none (no files, no network)")
        if session:
            doc += " Variables persist between calls."
        if functions:
            doc += "\nThe code can call these functions with `from pynox_host import NAME`:"
            for name in sorted(functions):
                fn = functions[name]
                try:
                    sig = str(inspect.signature(fn))
                except (TypeError, ValueError):
                    sig = "(...)"
                doc += "\n  %s%s: %s" % (name, sig, (inspect.getdoc(fn) or "").strip())
        python.__doc__ = doc
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


class Session:
    """A sandboxed process whose __main__ survives between run() calls.
    A Python exception leaves it alive; a timeout, crash or exit ends it, and
    the next run() starts a new one (result["session_ended"] says so)."""

    def __init__(self, pool, name, grants, functions):
        self.pool, self.name, self.grants, self.functions = pool, name, grants, functions
        self._fresh = True

    def run(self, code, **step):
        """Runs code in the session; step may carry name, args, timeout and
        max_output."""
        fields = dict(step, session=self.name)
        if self._fresh:
            # The first request (and the first after the process ended)
            # fixes the permissions.
            fields.update(self.grants)
            if self.functions:
                fields["functions"] = sorted(self.functions)
        r = self.pool._request(dict(fields, code=code), self.functions)
        refused = (r.get("error") or {}).get("type") == "RequestError"
        self._fresh = bool(r.get("session_ended")) or (self._fresh and refused)
        return r

    def close(self):
        """Ends the session's process."""
        if not self._fresh:
            self.pool._request({"session": self.name, "close": True})
        self._fresh = True

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

        def search(query, limit=3):
            """Searches the documentation and returns the titles found."""
            return ["%s result %d" % (query, i) for i in range(limit)]

        r = pool.run("from pynox_host import search\nprint(search('pynox', limit=2))", functions={"search": search})
        print("host call:", r["stdout"], end="")
        with pool.session() as sess:
            sess.run("total = 40")
            print("session:", sess.run("total += 2\nprint(total)")["stdout"], end="")
        notebook = pool.tool(session=True, functions={"search": search})
        notebook("from pynox_host import search\nhits = search('sessions', limit=1)")
        print("stateful tool:", notebook("print(hits)"), end="")
        if "search(query, limit=3): Searches the documentation" not in notebook.__doc__:
            sys.exit("tool description lacks the function: %r" % notebook.__doc__)


if __name__ == "__main__":
    _demo(sys.argv[1] if len(sys.argv) > 1 else (shutil.which("pynox") or os.path.abspath("pynox")))
