"""Tests of interrupt(), cancel() and sessions the pool closed for being
idle, against a real `pynox pool`."""

import os
import shutil
import tempfile
import threading
import time
import unittest

import support

import pynox

DATA = os.path.join(support.ROOT, "examples", "data")
ORDERS = os.path.join(DATA, "orders.csv")


def search(query: str, limit: int = 3) -> list:
    """Searches the documentation."""
    return ["hit %d for %s" % (i, query) for i in range(limit)]


def press(stop):
    """Calls stop until it reports that it stopped something."""
    while not stop():
        time.sleep(0.05)


class InterruptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = support.binary()
        cls.tmp = tempfile.mkdtemp(prefix="pynox-pytest-")
        # The pool closes sessions idle for 1 s; the client reads that from
        # the configuration file the ready event names.
        cls.config = os.path.join(cls.tmp, "pynox.toml")
        with open(cls.config, "w") as f:
            f.write('[pool]\nworkers = 1\nsession_idle = "1s"\n')
        cls.pool = pynox.Pool(cls.bin, config=cls.config, allow_read=[support.ROOT], python=support.python(),
                              cwd=support.ROOT)

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()
        shutil.rmtree(cls.tmp, True)

    def test_session_interrupt_keeps_variables(self):
        with self.pool.session() as s:
            self.assertFalse(s.interrupt())  # no session process yet
            s.run("x = 41")
            self.assertFalse(s.interrupt())  # no step running
            t = threading.Thread(target=press, args=(s.interrupt,))
            t.start()
            r = s.run("while True: pass")
            t.join()
            self.assertEqual(r.error.type, "KeyboardInterrupt", r)
            self.assertFalse(r.session_ended)
            r = s.run("print(x + 1)")
            self.assertEqual(r.stdout, "42\n", r)
            self.assertEqual(r.step, 3)

    def test_tool_interrupt(self):
        tool = self.pool.tool(session=True)
        self.assertFalse(tool.interrupt())
        self.assertEqual(tool("y = 2"), "")
        t = threading.Thread(target=press, args=(tool.interrupt,))
        t.start()
        out = tool("while True: pass")
        t.join()
        self.assertIn("KeyboardInterrupt", out)
        self.assertEqual(tool("print(y)").strip(), "2")
        tool.close()

    def test_cancel(self):
        self.assertFalse(self.pool.cancel("nothing-by-that-id"))
        t = threading.Thread(target=press, args=(lambda: self.pool.cancel("slow"),))
        t.start()
        r = self.pool.run("import time; time.sleep(60); print('ran')", job_id="slow")
        t.join()
        self.assertEqual(r.error.type, "CancelledError", r)
        self.assertEqual(r.exit, -1)
        self.assertEqual(r.stdout, "")
        self.assertTrue(self.pool.run("print(1)").ok)  # the pool serves on

    def test_idle_closed_session_resends_grants(self):
        self.assertEqual(self.pool.session_idle, 1.0)
        with self.pool.session(allow_read=[DATA], functions={"search": search}) as s:
            r = s.run("x = 1")
            self.assertEqual(r.step, 1)
            time.sleep(1.5)  # the pool closes the session meanwhile
            r = s.run("from pynox_host import search\nprint('x' in dir(), len(open(%r).readlines()), search('q', 1))"
                      % ORDERS)
            self.assertTrue(r.ok, r)
            self.assertEqual(r.stdout, "False 4 ['hit 0 for q']\n", r)
            self.assertEqual(r.step, 1)

    def test_live_session_refusing_grants_runs_the_step_alone(self):
        # A client that believes the pool's session_idle is shorter than
        # it is resends the grants to a live session: the pool refuses them
        # (nothing runs) and the step goes again without.
        pool = pynox.Pool(self.bin, workers=1, allow_read=[support.ROOT], python=support.python(),
                          cwd=support.ROOT, session_idle=0.2)
        try:
            with pool.session(allow_read=[DATA], functions={"search": search}) as s:
                s.run("x = 1")
                time.sleep(0.3)
                r = s.run("from pynox_host import search\nx += 1\nprint(x, search('q', 1))")
                self.assertEqual(r.stdout, "2 ['hit 0 for q']\n", r)
                self.assertEqual(r.step, 2)
                with self.assertRaises(pynox.RequestError):  # the caller's own permissions still refused
                    s.run("print(x)", allow_write=[self.tmp])
        finally:
            pool.close()


if __name__ == "__main__":
    unittest.main()
