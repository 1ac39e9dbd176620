"""Tests of the pynox package against a real `pynox pool`."""

import io
import os
import shutil
import signal
import tempfile
import threading
import unittest

import support  # noqa: F401 - puts nothing on sys.path; the package comes from PYTHONPATH or site-packages

import pynox

DATA = os.path.join(support.ROOT, "examples", "data")


def search(query: str, limit: int = 3) -> list:
    """Searches the documentation."""
    return ["hit %d for %s" % (i, query) for i in range(limit)]


def failing(*args, **kwargs):
    """Always fails."""
    raise ValueError("backend unavailable")


class NoPage(KeyError):
    pass


def missing(name):
    """Raises a subclass of KeyError."""
    raise NoPage("no page %r" % name)


class Odd(Exception):
    pass


def odd():
    raise Odd("strange")


def not_json():
    return object()


class PoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = support.binary()
        cls.tmp = tempfile.mkdtemp(prefix="pynox-pytest-")
        cls.work = os.path.join(cls.tmp, "work")
        os.mkdir(cls.work)
        cls.pool = pynox.Pool(cls.bin, workers=2, allow_read=[support.ROOT, cls.tmp], allow_write=[cls.work],
                              cwd=support.ROOT)

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()
        shutil.rmtree(cls.tmp, True)

    def test_ready(self):
        self.assertEqual(self.pool.ready["event"], "ready")
        self.assertEqual(self.pool.ready["workers"], 2)

    def test_run(self):
        r = self.pool.run("import sys; print('out'); print('err', file=sys.stderr)")
        self.assertTrue(r.ok, r)
        self.assertEqual((r.exit, r.stdout, r.stderr, r.error), (0, "out\n", "err\n", None))
        self.assertIs(r.check(), r)
        self.assertEqual(r.raw["policy"]["network"], "deny")

    def test_failed_job_is_a_result(self):
        r = self.pool.run("open('/etc/passwd')")
        self.assertFalse(r.ok)
        self.assertEqual(r.exit, 1)
        self.assertEqual(r.error.type, "PermissionError")
        self.assertEqual((r.error.file, r.error.line), ("<code>", 1))
        self.assertIn("/etc/passwd", r.error.hint)
        with self.assertRaises(pynox.JobError) as cm:
            r.check()
        self.assertIs(cm.exception.result, r)
        self.assertIn("PermissionError", str(cm.exception))

    def test_request_error_raises(self):
        with self.assertRaises(pynox.RequestError) as cm:
            self.pool.run("print(1)", memory="100g")
        self.assertIn("memory", str(cm.exception))
        self.assertEqual(cm.exception.result.exit, -1)
        with self.assertRaises(pynox.RequestError) as cm:
            self.pool.run("print(1)", unknown_field=1)
        self.assertIn("unknown_field", str(cm.exception))

    def test_grants_and_script(self):
        out = os.path.join(self.work, "grants")
        os.makedirs(out, exist_ok=True)
        r = self.pool.run("open(%r, 'w').write('x'); print(open(%r).readline().strip())"
                          % (os.path.join(out, "f"), os.path.join(DATA, "orders.csv")),
                          allow_read=DATA, allow_write=[out])  # one path or a list
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout, "product,amount\n")
        script = os.path.join(self.tmp, "app.py")
        with open(script, "w") as f:
            f.write("import sys; print(sys.argv[1:])")
        r = self.pool.run(script=script, args=["one", "two"], allow_read=[self.tmp])
        self.assertEqual(r.stdout, "['one', 'two']\n", r)

    def test_timeout_forms(self):
        for timeout in (0.3, "300ms"):
            r = self.pool.run("while True: pass", timeout=timeout)
            self.assertEqual(r.error.type, "TimeoutError", r)
            self.assertIn("300ms", r.error.message)
        with self.assertRaises(TypeError):
            self.pool.run("pass", timeout=[1])

    def test_host_functions(self):
        r = self.pool.run("from pynox_host import search\nprint(search('x', limit=2))", functions={"search": search})
        self.assertEqual(r.stdout, "['hit 0 for x', 'hit 1 for x']\n", r)
        r = self.pool.run("from pynox_host import failing, HostError\n"
                          "try:\n    failing(1)\nexcept HostError as e:\n    print(e)", functions={"failing": failing})
        self.assertEqual(r.stdout, "backend unavailable\n", r)
        # An exception of a builtin type (or a subclass) keeps its type in the job.
        r = self.pool.run("from pynox_host import failing, missing, odd, HostError\n"
                          "try:\n    failing()\nexcept ValueError as e:\n    print(type(e).__name__, isinstance(e, HostError), e)\n"
                          "try:\n    missing('p')\nexcept KeyError as e:\n    print(type(e).__name__, isinstance(e, HostError), e.args[0])\n"
                          "try:\n    odd()\nexcept HostError as e:\n    print(type(e).__name__, e)",
                          functions={"failing": failing, "missing": missing, "odd": odd})
        self.assertEqual(r.stdout, "ValueError True backend unavailable\nKeyError True no page 'p'\n"
                                   "HostError Odd: strange\n", r)
        r = self.pool.run("from pynox_host import not_json, HostError\n"
                          "try:\n    not_json()\nexcept HostError as e:\n    print('HostError', e)",
                          functions={"not_json": not_json})
        self.assertTrue(r.stdout.startswith("HostError TypeError"), r)

    def test_host_function_signatures(self):
        calls = []

        def recorded(query: str, limit: int = 3) -> list:
            """Searches, and records the call."""
            calls.append((query, limit))
            return [query] * limit

        r = self.pool.run("import inspect\nfrom pynox_host import search\nprint(inspect.signature(search))\n"
                          "print(search.__doc__)\n"
                          "try:\n    search('x', limits=2)\nexcept TypeError as e:\n    print('TypeError', e)\n"
                          "print(search('y', limit=1))",
                          functions={"search": recorded})
        self.assertEqual(r.stdout, "(query: str, limit: int = 3) -> list\nSearches, and records the call.\n"
                                   "TypeError search(): got an unexpected keyword argument 'limits'\n['y']\n", r)
        self.assertEqual(calls, [("y", 1)], "the wrong call never reached the host")

    def test_concurrent_runs_get_their_own_results(self):
        results = {}

        def run(i):
            results[i] = self.pool.run("print(%d)" % i, functions={"search": search})

        threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual({i: r.stdout for i, r in results.items()}, {i: "%d\n" % i for i in range(12)})

    def test_session(self):
        with self.pool.session(allow_read=[DATA], functions={"search": search}) as s:
            r = s.run("import csv\nrows = list(csv.DictReader(open(%r)))" % os.path.join(DATA, "orders.csv"))
            self.assertTrue(r.ok, r)
            self.assertEqual((r.session, r.step), (s.name, 1))
            r = s.run("from pynox_host import search\nprint(len(rows), search('s', limit=1))")
            self.assertEqual(r.stdout, "3 ['hit 0 for s']\n", r)
            self.assertEqual(r.step, 2)
            r = s.run("1/0")
            self.assertEqual(r.error.type, "ZeroDivisionError")
            self.assertFalse(r.session_ended)
            r = s.run("import os; os._exit(3)")
            self.assertTrue(r.session_ended, r)
            # The next step starts a new process with the same grants and functions.
            r = s.run("from pynox_host import search\nprint('rows' in dir(), len(open(%r).readlines()), search('t', 1))"
                      % os.path.join(DATA, "orders.csv"))
            self.assertEqual(r.stdout, "False 4 ['hit 0 for t']\n", r)
            self.assertEqual(r.step, 1)

    def test_session_request_error_raises(self):
        # A step the pool refuses raised nothing in examples/agent_tool.py:
        # its result was returned like any other, so a caller that read
        # stdout saw nothing and went on.
        s = self.pool.session(allow_read=[DATA])
        with self.assertRaises(pynox.RequestError) as cm:
            s.run("print(1)", memory="100g")  # the first step: beyond the ceiling
        self.assertIn("memory", str(cm.exception))
        self.assertEqual(s.run("x = 1").step, 1)  # still fresh: this step started the process
        with self.assertRaises(pynox.RequestError) as cm:
            s.run("print(x)", allow_write=[self.work])  # a later step may not carry permissions
        self.assertIn("allow_write", str(cm.exception))
        self.assertEqual(s.run("print(x)").stdout, "1\n")  # the session lives on
        s.close()
        s.close()  # closing twice is harmless

    def test_stats(self):
        before = self.pool.stats()
        self.pool.run("print(1)")
        after = self.pool.stats()
        self.assertEqual(after["event"], "stats")
        self.assertEqual(after["jobs"], before["jobs"] + 1)

    def test_tool(self):
        python = self.pool.tool(functions={"search": search}, allow_read=[DATA])
        self.assertIn("search(query: str, limit: int = 3) -> list: Searches the documentation.", python.__doc__)
        self.assertEqual(python.schema["name"], "python")
        self.assertEqual(python.schema["parameters"]["required"], ["code"])
        self.assertEqual(python.openai_schema, {"type": "function", "function": python.schema})
        self.assertEqual(python.anthropic_schema["input_schema"], python.schema["parameters"])
        self.assertIn("search(query: str", python.anthropic_schema["description"])
        self.assertEqual(python("print(6 * 7)"), "42\n")
        out = python("open('/etc/passwd')")
        self.assertIn("PermissionError: [Errno 13] Permission denied: '/etc/passwd'\nhint: ", out)
        self.assertEqual(out.count("PermissionError: [Errno 13]"), 1, out)
        self.assertEqual(python("x = 1\nprint(x)"), "1\n")
        self.assertIn("NameError", python("print(x)"))  # not stateful

        notebook = self.pool.tool(session=True)
        self.assertIn("Variables persist", notebook.__doc__)
        notebook("y = 5")
        self.assertEqual(notebook("print(y)"), "5\n")
        self.assertIn("the session restarted", notebook("import os; os._exit(1)"))
        self.assertIn("NameError", notebook("print(y)"))
        notebook.close()

        refused = self.pool.tool(allow_write=["/"])
        self.assertTrue(refused("print(1)").startswith("RequestError: "))


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.bin = support.binary()

    def test_binary_not_found_says_how_to_install(self):
        saved = dict(os.environ)
        try:
            os.environ.pop("PYNOX_BIN", None)
            os.environ["PATH"] = "/nonexistent"
            with self.assertRaises(pynox.BinaryNotFoundError) as cm:
                pynox.Pool()
            self.assertIn("PYNOX_BIN", str(cm.exception))
            self.assertIn("go install ./cmd/pynox", str(cm.exception))
            os.environ["PYNOX_BIN"] = "/nonexistent/pynox"
            with self.assertRaises(pynox.BinaryNotFoundError) as cm:
                pynox.Pool()
            self.assertIn("PYNOX_BIN='/nonexistent/pynox' is not an executable file", str(cm.exception))
            os.environ["PYNOX_BIN"] = self.bin
            self.assertEqual(pynox.find_binary(), self.bin)
            os.environ.pop("PYNOX_BIN")
            os.environ["PATH"] = os.path.dirname(self.bin)
            self.assertEqual(pynox.find_binary(), os.path.join(os.path.dirname(self.bin), "pynox"))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_start_failure_quotes_stderr(self):
        err = io.StringIO()
        with self.assertRaises(pynox.PoolError) as cm:
            pynox.Pool(self.bin, config="/nonexistent/pynox.toml", stderr=err)
        self.assertIn("exited before it was ready", str(cm.exception))
        self.assertIn("/nonexistent/pynox.toml", str(cm.exception))
        self.assertIn("/nonexistent/pynox.toml", err.getvalue())

    def test_close(self):
        pool = pynox.Pool(self.bin, workers=1)
        s = pool.session()
        s.run("x = 1")
        self.assertEqual(pool.close(), 0)
        self.assertTrue(pool.closed)
        with self.assertRaises(pynox.PoolError):
            pool.run("print(1)")
        s.close()  # harmless once the pool is gone

    def test_killed_pool_wakes_waiters(self):
        pool = pynox.Pool(self.bin, workers=1)
        outcome = []
        started = threading.Event()

        def slow():
            started.set()
            try:
                pool.run("import time\ntime.sleep(60)", timeout="30s")
                outcome.append("answered")
            except pynox.PoolError as e:
                outcome.append(str(e))

        t = threading.Thread(target=slow)
        t.start()
        started.wait()
        # Wait until the job runs (the pool counts it as running only once
        # its stats say so) is not observable; killing at any point must
        # fail the waiting request rather than hang it.
        os.kill(pool.pid, signal.SIGKILL)
        t.join(60)
        self.assertFalse(t.is_alive(), "the waiting request hangs after the pool died")
        self.assertEqual(len(outcome), 1)
        self.assertNotEqual(outcome[0], "answered")
        with self.assertRaises(pynox.PoolError):
            pool.run("print(1)")
        pool.close()

    def test_module_tool_uses_a_default_pool(self):
        saved = os.environ.get("PYNOX_BIN")
        os.environ["PYNOX_BIN"] = self.bin
        try:
            python = pynox.tool(functions={"search": search})
            self.assertEqual(python("from pynox_host import search\nprint(search('d', 1))"), "['hit 0 for d']\n")
            self.assertIs(pynox.default_pool(), pynox.default_pool())
        finally:
            if saved is None:
                os.environ.pop("PYNOX_BIN", None)
            else:
                os.environ["PYNOX_BIN"] = saved
            pynox.default_pool().close()


if __name__ == "__main__":
    unittest.main()
