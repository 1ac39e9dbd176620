# A preload that probes, as it is imported in a template, what the template
# process may do: code running there (as if it had escaped a job) must find
# only the pool's ceiling. The test fills in the @...@ placeholders. A job
# prints `results`, inherited from the template with the module.
import os
import socket

results = {}


def _try(name, fn):
    try:
        fn()
        results[name] = "ok"
    except OSError as e:
        results[name] = type(e).__name__


def _read(path):
    with open(path, "rb") as f:
        f.read()


def _write(path):
    with open(path, "wb") as f:
        f.write(b"x")


def _connect():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(("127.0.0.1", @PORT@))
    finally:
        s.close()


_try("read_outside", lambda: _read(@SECRET@))
_try("read_ceiling", lambda: _read(@READ_FILE@))
_try("write_read_ceiling", lambda: _write(@READ_DIR@ + "/probe-%d" % os.getpid()))
_try("write_write_ceiling", lambda: _write(@WRITE_DIR@ + "/probe-%d" % os.getpid()))
_try("list_outside", lambda: os.listdir(os.path.dirname(@SECRET@)))
_try("tcp_connect", _connect)
