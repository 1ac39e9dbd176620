"""Inputs and the value of the last expression, against a real `pynox pool`."""

import shutil
import tempfile
import unittest

import support  # noqa: F401 - puts nothing on sys.path; the package comes from PYTHONPATH or site-packages

import pynox


class ValuesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = support.binary()
        cls.tmp = tempfile.mkdtemp(prefix="pynox-pytest-")
        kwargs = {"python": support.python()} if support.python() else {}
        cls.pool = pynox.Pool(cls.bin, workers=1, allow_read=[cls.tmp], cwd=cls.tmp, **kwargs)

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()
        shutil.rmtree(cls.tmp, True)

    def test_inputs_and_value(self):
        inputs = {"d": {"a": [1, 2.5, None, True]}, "l": [1, [2]], "s": "héllo", "n": 10 ** 20}
        r = self.pool.run("d['a'].append(len(s)); [d, l, s, n]", inputs=inputs)
        self.assertTrue(r.ok, r)
        self.assertEqual(r.value, [{"a": [1, 2.5, None, True, 5]}, [1, [2]], "héllo", 10 ** 20])
        self.assertIsNone(r.value_repr)
        self.assertEqual(r.stdout, "", "the value is not printed")
        self.assertEqual(inputs["d"]["a"], [1, 2.5, None, True], "the caller's inputs are not changed")
        for code, value in (("n // 10", 10 ** 19), ("s.upper()", "HÉLLO"), ("{'k': l}", {"k": [1, [2]]}), ("False", False)):
            self.assertEqual(self.pool.run(code, inputs=inputs).value, value, code)

    def test_value_repr_and_none(self):
        r = self.pool.run("{1, 2}")
        self.assertEqual((r.value, r.value_repr), (None, "{1, 2}"))
        r = self.pool.run("class C:\n    pass\nC()")
        self.assertTrue(r.value_repr.startswith("<__main__.C object at 0x"), r.value_repr)
        r = self.pool.run("'x' * (2 << 20)")
        self.assertIsNone(r.value)
        self.assertEqual(len(r.value_repr), 64 << 10)
        for code in ("None", "print('hi')", "x = 1"):
            r = self.pool.run(code)
            self.assertTrue(r.ok, r)
            self.assertEqual((r.value, r.value_repr), (None, None), code)
        r = self.pool.run("x = 1\n(x +\n  1 / 0)", name="cell.py")
        self.assertEqual((r.error.type, r.error.line), ("ZeroDivisionError", 3))
        self.assertIsNone(r.value)

    def test_bad_inputs_raise(self):
        for inputs, msg in (({"1x": 1}, '"1x" is not a name'), ({"class": 1}, '"class" is a Python keyword'),
                            ({"x": "y" * (1 << 20)}, "pynox pool reads lines of at most 1048576")):
            with self.assertRaises(pynox.RequestError) as cm:
                self.pool.run("print('ran')", inputs=inputs)
            self.assertIn(msg, str(cm.exception))
        self.assertEqual(self.pool.run("1 + 1").value, 2, "the pool keeps serving")

    def test_session_inputs_persist(self):
        with self.pool.session() as s:
            r = s.run("total = sum(xs)\ntotal", inputs={"xs": [1, 2, 3]})
            self.assertEqual((r.step, r.value), (1, 6))
            r = s.run("[total * k, xs]", inputs={"k": 10})
            self.assertEqual((r.step, r.value), (2, [60, [1, 2, 3]]))
            with self.assertRaises(pynox.RequestError):
                s.run("k", inputs={"def": 1})
            r = s.run("k")
            self.assertEqual((r.step, r.value), (3, 10))
            r = s.run("{k}")
            self.assertEqual((r.value, r.value_repr), (None, "{10}"))

    def test_usage_files_restarted(self):
        # The result fields newer than the client's first version.
        res = self.pool.run("import os\nopen(os.path.join(os.environ['PYNOX_OUTPUTS'], 'a.txt'), 'w').write('hi')").check()
        self.assertIsNotNone(res.usage)
        self.assertGreaterEqual(res.usage["cpu_ms"], 0)
        self.assertEqual([f["path"].rsplit("/", 1)[-1] for f in res.files], ["a.txt"])
        s = self.pool.session()
        self.assertFalse(s.run("import os\nos._exit(3)").restarted)
        self.assertTrue(s.run("x = 1").restarted)
        s.close()


if __name__ == "__main__":
    unittest.main()
