"""Rich outputs (result.outputs) against a real `pynox pool`."""

import unittest

import support

import pynox

CODE = """
from pynox_display import display, HTML
print("a", flush=True)
display(HTML("<b>x</b>"))
print("b", flush=True)
"""


class DisplayTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = support.binary()
        cls.pool = pynox.Pool(cls.bin, workers=1)

    @classmethod
    def tearDownClass(cls):
        cls.pool.close()

    def test_outputs(self):
        res = self.pool.run(CODE).check()
        self.assertEqual(res.outputs, [{"mime": "text/html", "data": "<b>x</b>"}])

    def test_streamed_display_event_is_not_the_result(self):
        # With on_output the request streams, and its display event comes
        # before the result: the client must not take it for the result.
        seen = []
        res = self.pool.run(CODE, on_output=lambda stream, text: seen.append(text)).check()
        self.assertEqual(res.stdout, "a\nb\n")
        self.assertEqual("".join(seen), "a\nb\n")
        self.assertEqual(res.outputs, [{"mime": "text/html", "data": "<b>x</b>"}])


if __name__ == "__main__":
    unittest.main()
