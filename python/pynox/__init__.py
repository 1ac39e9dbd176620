"""pynox: run untrusted Python — LLM-written code, notebook cells, agent
tools — in fresh CPython processes forked from a warm template and confined
by Landlock, seccomp and rlimits, through a `pynox pool` process.

    import pynox

    with pynox.Pool() as pool:                  # the binary: PYNOX_BIN, then PATH
        r = pool.run("print(sum(range(10)))")
        print(r.stdout)                         # 45
        r = pool.run("open('/etc/passwd')")
        print(r.error.type, r.error.hint)       # PermissionError ...

        def search(query: str, limit: int = 3) -> list:
            '''Searches the documentation.'''
            return ["hit %d for %s" % (i, query) for i in range(limit)]

        # Host functions: the code calls search(), which runs here.
        pool.run("from pynox_host import search\\nprint(search('x'))", functions={"search": search})

        # Sessions: __main__ survives between runs.
        with pool.session(allow_read=["examples/data"]) as s:
            s.run("x = 41")
            print(s.run("print(x + 1)").stdout)  # 42

        # A callable for a model's tool list, its docstring listing search().
        python = pool.tool(session=True, functions={"search": search})

A job that fails is a Result with an error; a request the pool refuses
raises RequestError; a pool that stops raises PoolError. Standard library
only; every class is safe to share between threads.
"""

from ._errors import BinaryNotFoundError, JobError, PoolError, PynoxError, RequestError
from ._pool import Duration, HostFunction, OutputCallback, Pool, Session, Tool, default_pool, find_binary, tool
from ._result import ErrorInfo, Result

__version__ = "0.1.0"

__all__ = [
    "BinaryNotFoundError",
    "Duration",
    "ErrorInfo",
    "HostFunction",
    "JobError",
    "OutputCallback",
    "Pool",
    "PoolError",
    "PynoxError",
    "RequestError",
    "Result",
    "Session",
    "Tool",
    "default_pool",
    "find_binary",
    "tool",
]
