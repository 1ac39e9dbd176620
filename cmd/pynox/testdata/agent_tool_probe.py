"""Drives the pynox Python package (python/pynox) against a real pynox pool
with hostile input. Usage: agent_tool_probe.py PACKAGE_DIR PYNOX INJECT_WRAPPER

Prints one line per check; the Go test compares them."""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, sys.argv[1])
from pynox import Pool, PoolError  # noqa: E402

binary, wrapper = sys.argv[2], sys.argv[3]

FORGE = r"""import os, struct
def read(n):
    b = b''
    while len(b) < n:
        b += os.read(3, n - len(b))
    return b
def call(payload):
    os.write(3, struct.pack('<I', len(payload)) + payload)
    os.write(4, b'!')
    n = struct.unpack('<I', read(4))[0]
    print(read(n).decode())
"""
FRAMES = {
    "utf8": r"""b'{"t":"call","step":1,"function":"f","args":["\xff"],"kwargs":{}}'""",
    "deep": r"""b'{"t":"call","step":1,"function":"f","args":' + b'[' * 5000 + b']' * 5000 + b',"kwargs":{}}'""",
    "digits": r"""b'{"t":"call","step":1,"function":"f","args":[' + b'7' * 5000 + b'],"kwargs":{}}'""",
}


def f(*args, **kwargs):
    return "answered"


# 1. Forged call frames through a real pool: the calls are refused in the
# job (or reach the client as lines it reads), and the client keeps
# working.
with Pool(binary=binary, workers=1) as pool:
    for name, frame in FRAMES.items():
        r = pool.run(FORGE + "call(%s)\nprint('job went on')" % frame, functions={"f": f}, timeout="10s")
        ok = r.error is None and "job went on" in r.stdout
        print("forged %s: %s" % (name, "served" if ok else "FAILED %r" % r))
    print("after forged:", pool.run("print(6 * 7)").stdout.strip())

# 2. Lines Python's json cannot read, put on the stream after the ready
# line by the wrapper: each is skipped, and requests are answered.
os.environ["PYNOX_REAL"] = binary
with Pool(binary=wrapper, workers=1) as pool:
    print("after bad lines:", pool.run("print(6 * 7)").stdout.strip())
    r = pool.run("from pynox_host import f\nprint(f(1))", functions={"f": f})
    print("host call after bad lines:", r.stdout.strip())

# 3. The reader stops (the pool is killed): a waiting request and every
# later one fail with PoolError instead of hanging.
pool = Pool(binary=binary, workers=1)
outcome = {}


def slow():
    try:
        r = pool.run("import time\ntime.sleep(60)", timeout="20s")
        outcome["slow"] = "answered %r" % (r.error,)
    except PoolError as e:
        outcome["slow"] = "PoolError: %s" % e


t = threading.Thread(target=slow)
t.start()
time.sleep(0.5)
os.kill(pool.pid, signal.SIGKILL)
t.join(30)
print("waiting request:", outcome.get("slow", "STILL WAITING"))
try:
    pool.run("print(1)")
    print("later request: answered")
except PoolError as e:
    print("later request: PoolError")  # the pipe or the reader, whichever saw it first
pool.close()
