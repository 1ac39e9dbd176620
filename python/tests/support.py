"""Shared set-up of the package's tests: the pynox binary they drive.

The tests run a real `pynox pool` (real python3 under the real sandbox).
The binary is PYNOX_BIN if set; otherwise it is built from this checkout
with `go build` into a temporary directory, once per test run.
"""

import atexit
import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGE_DIR = os.path.join(ROOT, "python")

_binary = None
_why_not = None


def binary():
    """Returns the path of a pynox binary, or raises unittest.SkipTest
    saying why there is none."""
    global _binary, _why_not
    if _binary is None and _why_not is None:
        _binary, _why_not = _find()
    if _binary is None:
        raise unittest.SkipTest(_why_not)
    return _binary


def _find():
    env = os.environ.get("PYNOX_BIN")
    if env:
        return env, None
    if not os.path.isdir(os.path.join(ROOT, "cmd", "pynox")):
        return None, "PYNOX_BIN is not set and %s is not a pynox checkout to build it from" % ROOT
    go = shutil.which("go")
    if go is None:
        return None, "PYNOX_BIN is not set and there is no go to build pynox with"
    tmp = tempfile.mkdtemp(prefix="pynox-pytest-")
    atexit.register(shutil.rmtree, tmp, True)
    path = os.path.join(tmp, "pynox")
    proc = subprocess.run([go, "build", "-o", path, "./cmd/pynox"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError("go build ./cmd/pynox failed:\n" + proc.stdout.decode(errors="replace"))
    return path, None


def python():
    """The interpreter jobs run under: Debian's, when there is one (the
    first python3 on PATH may be a pyenv shim)."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None
