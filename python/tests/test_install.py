"""The package installs offline with pip into a fresh venv, and works there."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import support


def _venv_missing():
    """Says why `python -m venv` cannot make a venv with pip, or None."""
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError as e:
        return "%s lacks venv/ensurepip (%s); on Debian: apt-get install python3-venv" % (sys.executable, e)
    return None


class InstallTest(unittest.TestCase):
    def test_offline_pip_install_in_a_fresh_venv(self):
        why = _venv_missing()
        if why:
            self.skipTest(why)
        binary = support.binary()
        tmp = tempfile.mkdtemp(prefix="pynox-install-")
        self.addCleanup(shutil.rmtree, tmp, True)
        # Build from a copy: setuptools writes build/ and *.egg-info beside
        # the sources, and the checkout must stay clean.
        src = os.path.join(tmp, "python")
        shutil.copytree(support.PACKAGE_DIR, src, ignore=shutil.ignore_patterns(
            "__pycache__", "build", "*.egg-info", "tests"))
        env = dict(os.environ, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
            env.pop(key, None)  # nothing to fetch from anywhere
        venv = os.path.join(tmp, "venv")

        def run(*args):
            proc = subprocess.run(list(args), cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out = proc.stdout.decode(errors="replace")
            if proc.returncode != 0:
                if args[1:3] == ("-m", "venv") and "ensurepip" in out:
                    self.skipTest("%s -m venv cannot install pip (%s); on Debian: apt-get install python3-venv"
                                  % (sys.executable, out.strip().splitlines()[-1]))
                self.fail("%s exited %d:\n%s" % (" ".join(args), proc.returncode, out))
            return out

        # --no-build-isolation builds with what the venv has: setuptools
        # (a venv's own on 3.11; none on 3.12+) and, for setuptools < 70.1,
        # wheel, which no venv gets by itself. --system-site-packages lends
        # them from the system (Debian: python3-setuptools, python3-wheel).
        run(sys.executable, "-m", "venv", "--system-site-packages", venv)
        py = os.path.join(venv, "bin", "python")
        missing = run(py, "-c", "import importlib.util as u\n"
                      "if not u.find_spec('setuptools'): print('setuptools'); raise SystemExit\n"
                      "import setuptools\n"
                      "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])\n"
                      "print('' if v >= (70, 1) or u.find_spec('wheel') else 'wheel')").strip()
        if missing:
            self.skipTest("the venv lacks %s to build with setuptools offline; on Debian: apt-get install python3-setuptools python3-wheel"
                          % missing)
        run(py, "-m", "pip", "install", "--no-index", "--no-build-isolation", src)
        check = (
            "import os, pynox, pynox._pool\n"
            "here = os.path.dirname(pynox.__file__)\n"
            "assert here.startswith(%r), here\n"
            "assert os.path.exists(os.path.join(here, 'py.typed'))\n"
            "with pynox.Pool(%r, workers=1) as pool:\n"
            "    print(pool.run('print(6 * 7)').check().stdout, end='')\n"
        ) % (venv, binary)
        self.assertEqual(run(py, "-c", check), "42\n")
        shutil.rmtree(src)  # the installed package needs nothing from its sources
        self.assertEqual(run(py, "-c", check), "42\n")


if __name__ == "__main__":
    unittest.main()
