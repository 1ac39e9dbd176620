"""Streamed output (on_output=) against a real `pynox pool`."""

import os
import shutil
import tempfile
import threading
import unittest

import support

import pynox

# The job prints its next line only once the client's on_output has seen
# the last one (it creates ack-N where the job looks): output that reached
# the client only with the result would leave the job waiting until its
# timeout.
ACKED_LOOP = """
import os, sys, time
def wait_ack(name):
    while not os.path.exists(os.path.join(%r, "ack-" + name)):
        time.sleep(0.005)
for i in range(3):
    print(i, flush=True)
    wait_ack(str(i))
    time.sleep(0.3)
print("warn", file=sys.stderr, flush=True)
"""


class StreamTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = support.binary()
        cls.tmp = tempfile.mkdtemp(prefix="pynox-pytest-stream-")
        cls.pool = pynox.Pool(cls.bin, workers=1, allow_read=[cls.tmp], cwd=cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()
        shutil.rmtree(cls.tmp, True)

    def recorder(self, ack_dir=None):
        events = []
        returned = threading.Event()
        late = []

        def on_output(stream, text):
            if returned.is_set():
                late.append((stream, text))
            events.append((stream, text))
            if ack_dir is not None:
                open(os.path.join(ack_dir, "ack-" + text.strip()), "w").close()

        return events, returned, late, on_output

    def test_run_streams_before_result(self):
        ack = tempfile.mkdtemp(dir=self.tmp)
        events, returned, late, on_output = self.recorder(ack)
        r = self.pool.run(ACKED_LOOP % ack, allow_read=[ack], timeout="20s", on_output=on_output)
        returned.set()
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout, "0\n1\n2\n")
        self.assertEqual(events, [("stdout", "0\n"), ("stdout", "1\n"), ("stdout", "2\n"), ("stderr", "warn\n")])
        self.assertEqual(late, [])

    def test_without_on_output_nothing_changes(self):
        r = self.pool.run("print('plain')")
        self.assertEqual(r.stdout, "plain\n")
        self.assertNotIn("stream", r.raw)

    def test_session_step_streams(self):
        events, returned, late, on_output = self.recorder()
        with self.pool.session() as s:
            s.run("x = 41")
            r = s.run("print(x + 1)\nraise KeyError('k')", on_output=on_output)
            returned.set()
            self.assertEqual(r.error.type, "KeyError")
            self.assertEqual(events[0], ("stdout", "42\n"))
            stderr = "".join(t for st, t in events if st == "stderr")
            self.assertEqual(stderr, r.stderr)
            self.assertIn("KeyError", stderr)
            # A later step without on_output streams nothing.
            self.assertEqual(s.run("print(x)").stdout, "41\n")
        self.assertEqual(len([e for e in events if e[0] == "stdout"]), 1)
        self.assertEqual(late, [])

    def test_invalid_utf8_and_more_than_max_output(self):
        events, returned, late, on_output = self.recorder()
        r = self.pool.run("import sys, time\nb = sys.stdout.buffer\nb.write(b'A\\xe2\\x82'); b.flush(); time.sleep(0.1)\n"
                          "b.write(b'\\xac\\xff' + b'z' * 5000)", max_output=100, on_output=on_output)
        returned.set()
        self.assertTrue(r.ok, r)
        text = "".join(t for _, t in events)
        self.assertEqual(text, "A\u20ac\ufffd" + "z" * 5000)
        self.assertTrue(r.raw["stdout_truncated"])
        self.assertEqual(late, [])

    def test_raising_on_output_is_logged(self):
        calls = []

        def broken(stream, text):
            calls.append(text)
            raise RuntimeError("bug in the callback")

        with self.assertLogs("pynox", level="ERROR"):
            r = self.pool.run("import time\nfor i in range(3): print(i, flush=True); time.sleep(0.05)", on_output=broken)
        self.assertEqual(r.stdout, "0\n1\n2\n")
        self.assertEqual(len(calls), 1)


if __name__ == "__main__":
    unittest.main()
