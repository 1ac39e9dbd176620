#!/usr/bin/env python3
"""An agent's Python tool on the pynox package (python/ in this repository).

Run it from a checkout, with the pynox binary built or on PATH:

    go build -o pynox ./cmd/pynox
    PYNOX_BIN=$PWD/pynox python3 examples/agent_tool.py

It plays the model's part with a fixed script: each "turn" is code a model
might write, run through a stateful tool that can call one of your
functions (search) and read examples/data.
"""

import os
import sys
import threading
import time

try:
    import pynox
except ImportError:  # not installed: use the package beside this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import pynox

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def search(query: str, limit: int = 3) -> list:
    """Searches the documentation and returns the titles found."""
    return ["%s result %d" % (query, i) for i in range(limit)]


def press_stop(stop):
    """What a "stop" button does: retries until a step is running to stop
    (stop is Session.interrupt, or a Pool.cancel for one job id)."""
    while not stop():
        time.sleep(0.05)


def main(binary=None):
    # The pool's read ceiling is examples/data: no request may read beyond it.
    with pynox.Pool(binary, workers=2, allow_read=[DATA]) as pool:
        r = pool.run("import platform; print('hello from', platform.python_version())")
        print(r.stdout, end="")
        r = pool.run("open('/etc/passwd').read()")
        print("denied:", r.error.type, "-", r.error.hint)
        print(pool.tool()("import os; os.fork()"))  # what a model reads

        # Any number of threads may share the pool.
        threads = [threading.Thread(target=pool.run, args=("print(%d)" % i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = pool.stats()
        print("jobs=%d ok=%d failed=%d" % (s["jobs"], s["ok"], s["failed"]))

        r = pool.run("from pynox_host import search\nprint(search('pynox', limit=2))", functions={"search": search})
        print("host call:", r.stdout, end="")

        # Output as it comes (a long cell's progress), before the result.
        pool.run("import time\nfor i in range(3): print('step', i, flush=True); time.sleep(0.1)",
                 on_output=lambda stream, text: print("streamed %s: %s" % (stream, text), end=""))

        with pool.session() as sess:  # __main__ survives between runs
            sess.run("total = 40")
            print("session:", sess.run("total += 2\nprint(total)").stdout, end="")
            # The user presses "stop": the step gets KeyboardInterrupt and
            # the session keeps its variables.
            threading.Thread(target=press_stop, args=(sess.interrupt,)).start()
            r = sess.run("while True: total += 0")
            print("interrupted:", r.error.type, "- total is", sess.run("print(total)").stdout, end="")

        # A one-shot job the caller gives up on: cancel() ends it.
        threading.Thread(target=press_stop, args=(lambda: pool.cancel("slow"),)).start()
        print("cancelled:", pool.run("import time; time.sleep(60)", job_id="slow").error.type)

        # The model's tool: stateful, with search() and read access to DATA.
        python = pool.tool(session=True, functions={"search": search}, allow_read=[DATA])
        print("tool description:", python.__doc__)
        turns = [
            "from pynox_host import search\nhits = search('sessions', limit=1)",
            "print(hits)",
            "import csv\nrows = list(csv.DictReader(open(%r)))\nprint(len(rows), 'orders')" % os.path.join(DATA, "orders.csv"),
            "open('/etc/shadow')",
        ]
        for code in turns:
            print(">>>", code.splitlines()[-1])
            print(python(code))
        python.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
