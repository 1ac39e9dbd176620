"""Pool and Session: a client of the `pynox pool` JSONL protocol."""

from __future__ import annotations

import collections
import datetime
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Deque, Dict, Iterable, List, Mapping, Optional, Union

from ._errors import BinaryNotFoundError, PoolError, RequestError
from ._result import ErrorInfo, Result

log = logging.getLogger("pynox")

MAX_LINE = 1 << 20  # the longest request line pynox pool reads (jsonl.MaxLine)

#: A host function: called with the JSON arguments the job passed, it
#: returns a JSON-encodable value (or raises; the job sees HostError).
HostFunction = Callable[..., Any]

#: An output callback: called as on_output(stream, text) with stream
#: "stdout" or "stderr" and the next piece of that stream (see Pool.run).
OutputCallback = Callable[[str, str], None]

#: A duration: a string the pool reads ("500ms", "5s", "1m"), a number of
#: seconds, or a timedelta.
Duration = Union[str, int, float, datetime.timedelta]

INSTALL_HINT = (
    "build it from a checkout of pynox with `go install ./cmd/pynox` (it lands in $(go env GOPATH)/bin, "
    "which must be on PATH) or `go build -o pynox ./cmd/pynox` and set PYNOX_BIN=$PWD/pynox"
)

# The start of a line the reader could not decode: the pool writes "event"
# (calls only) and "id" first, so these find whom the line was for.
_CALL_PREFIX = re.compile(
    rb'\{"event":"call","id":(?:"(?:[^"\\]|\\.)*"|[-0-9.eE+]+),(?:"session":"(?:[^"\\]|\\.)*",)?"call_id":(\d+),'
)
_RESULT_PREFIX = re.compile(rb'\{"id":("(?:[^"\\]|\\.)*"|-?\d+),')


#: The builtin exception types a host function's exception keeps in the
#: job (the pool's HostErrorTypes): one of these, or a subclass of one,
#: raises that builtin type there (also a pynox_host.HostError); any other
#: exception raises HostError with "Type: message".
HOST_ERROR_TYPES = frozenset((
    "ValueError", "TypeError", "KeyError", "IndexError", "LookupError", "AttributeError",
    "PermissionError", "FileNotFoundError", "FileExistsError", "IsADirectoryError",
    "NotADirectoryError", "OSError", "TimeoutError", "ConnectionError",
    "ConnectionRefusedError", "ConnectionResetError", "RuntimeError",
    "NotImplementedError", "ZeroDivisionError", "OverflowError",
))


def _error_reply(call_id: Any, e: BaseException) -> Dict[str, Any]:
    """The reply that raises e's nearest builtin type from HOST_ERROR_TYPES
    in the job, or HostError."""
    for cls in type(e).__mro__:
        if cls.__module__ == "builtins" and cls.__name__ in HOST_ERROR_TYPES:
            msg = str(e.args[0]) if len(e.args) == 1 else str(e)
            return {"call_id": call_id, "error": msg, "error_type": cls.__name__}
    return {"call_id": call_id, "error": "%s: %s" % (type(e).__name__, e)}


def _signature_text(fn: Callable[..., Any]) -> Optional[str]:
    """fn's signature as the pool takes it ("(query: str, limit: int = 3)"),
    or None when it has none the pool could read: a default that is not a
    literal shows as ..., an annotation that is not an expression is left
    out."""
    import ast
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None

    def expr(text: str) -> bool:
        try:
            ast.parse(text, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        return "\n" not in text and "\r" not in text

    def annotation(a: Any) -> Any:
        if a is inspect.Parameter.empty:
            return a
        text = a if isinstance(a, str) else inspect.formatannotation(a)
        return _Text(text) if expr(text) else inspect.Parameter.empty

    if len(sig.parameters) > 64:
        return None  # more than the pool takes
    params = []
    for p in sig.parameters.values():
        if not (p.name.isascii() and p.name.isidentifier()):
            return None
        default = p.default
        if default is not inspect.Parameter.empty:
            text = repr(default)
            try:
                ok = ast.literal_eval(text) == default and expr(text)
            except Exception:  # noqa: BLE001 - not a literal
                ok = False
            default = _Text(text) if ok else _Text("...")
        params.append(p.replace(annotation=annotation(p.annotation), default=default))
    out = sig.replace(parameters=params, return_annotation=annotation(sig.return_annotation))
    text = str(out)
    return text if len(text) <= 4096 else None


class _Text:
    """Shows as the text it holds (in a signature string)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def declare(functions: Mapping[str, HostFunction]) -> List[Any]:
    """The "functions" of a request: for each callable, by name, an object
    with its docstring and signature, which the job's pynox_host function
    then has (help(), inspect.signature) and checks calls against; a bare
    name for a callable without a signature the pool can read."""
    import inspect

    out: List[Any] = []
    for name in sorted(functions):
        fn = functions[name]
        sig = _signature_text(fn)
        if sig is None:
            out.append(name)
            continue
        entry: Dict[str, Any] = {"name": name, "signature": sig}
        doc = inspect.getdoc(fn)
        if doc:
            entry["doc"] = doc.encode()[:16 << 10].decode(errors="ignore")  # the pool takes 16 KiB
        out.append(entry)
    return out


def find_binary(binary: Optional[str] = None) -> str:
    """Returns the path of the pynox binary: binary if given, else the
    PYNOX_BIN environment variable, else `pynox` on PATH. A name without a
    slash is looked up on PATH. Raises BinaryNotFoundError, saying how to
    install it, when there is none."""
    source = "binary=%r" % binary
    if not binary:
        binary = os.environ.get("PYNOX_BIN") or None
        source = "PYNOX_BIN=%r" % binary
    if not binary:
        found = shutil.which("pynox")
        if found:
            return found
        raise BinaryNotFoundError("cannot find the pynox binary: PYNOX_BIN is not set and there is no pynox on PATH; "
                                  + INSTALL_HINT)
    if os.sep in binary:
        if os.path.isfile(binary) and os.access(binary, os.X_OK):
            return binary
        raise BinaryNotFoundError("%s is not an executable file; %s" % (source, INSTALL_HINT))
    found = shutil.which(binary)
    if found:
        return found
    raise BinaryNotFoundError("%s is not on PATH; %s" % (source, INSTALL_HINT))


def _duration(value: Duration) -> str:
    """Converts a duration to the pool's string form."""
    if isinstance(value, str):
        return value
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a duration is a string like '5s', a number of seconds or a timedelta, not %r" % (value,))
    return "%dms" % round(value * 1000)


_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

# The pool's default [pool] session_idle, in seconds.
DEFAULT_SESSION_IDLE = 600.0


def _seconds(value: Duration) -> float:
    """Converts a duration (a string like "1m30s" as the pool writes it, a
    number of seconds or a timedelta) to seconds."""
    if isinstance(value, str):
        text = value.strip()
        pos, total = 0, 0.0
        for m in _GO_DURATION.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise ValueError("%r is not a duration like '5s' or '1m30s'" % value)
        return total
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a duration is a string like '5s', a number of seconds or a timedelta, not %r" % (value,))
    return float(value)


def _config_session_idle(path: Optional[str]) -> Optional[float]:
    """The [pool] session_idle of the configuration file the pool read,
    in seconds, or None when it sets none (or cannot be read here)."""
    if not path:
        return None
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return None
    try:
        with open(path, "rb") as f:
            value = tomllib.load(f).get("pool", {}).get("session_idle")
        return _seconds(value) if value is not None else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _fields(fields: Dict[str, Any]) -> Dict[str, Any]:
    """Converts the Python forms of request fields to the pool's."""
    out = {k: v for k, v in fields.items() if v is not None}
    if "timeout" in out:
        out["timeout"] = _duration(out["timeout"])
    for key in ("allow_read", "allow_write", "package_dirs"):
        if key in out:
            paths = out[key]
            if isinstance(paths, (str, os.PathLike)):
                paths = [paths]  # one path, not a list of its characters
            out[key] = [os.fspath(p) for p in paths]
    return out


class _Slot:
    """Where the reader leaves the answer to one request."""

    __slots__ = ("done", "answer", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: Optional[Dict[str, Any]] = None
        self.error: Optional[str] = None


class Pool:
    """A running `pynox pool` process, shared by any number of threads.

    The pool answers in completion order, so a reader thread routes each
    result line to the request waiting for its id, and answers host-function
    calls on threads of their own. A line the reader cannot decode is logged
    and skipped (a call it starts is answered with an error, a result it
    carries fails its request with PoolError); if the pool exits, every
    waiting request, and every later one, raises PoolError.

    binary is found as find_binary() says. workers, preload, package_dirs,
    allow_read, allow_write, config, python and log are the `pynox pool`
    flags of the same names (see `pynox pool --help`); extra_args are
    passed as they are. cwd is the pool's working directory, against which
    relative request paths resolve. The pool's stderr goes to stderr (a
    text file; default sys.stderr); its last lines are quoted in the error
    when the pool does not start. session_idle is the pool's [pool]
    session_idle; by default it is read from the configuration file the
    pool reports in its ready event, else the pool's default (10m).
    """

    def __init__(
        self,
        binary: Optional[str] = None,
        *,
        workers: Optional[int] = None,
        preload: Iterable[str] = (),
        package_dirs: Iterable[str] = (),
        allow_read: Iterable[str] = (),
        allow_write: Iterable[str] = (),
        config: Optional[str] = None,
        python: Optional[str] = None,
        log: Optional[str] = None,
        extra_args: Iterable[str] = (),
        cwd: Optional[str] = None,
        stderr: Optional[IO[str]] = None,
        session_idle: Optional[Duration] = None,
    ) -> None:
        self.binary = find_binary(binary)
        args: List[str] = [self.binary, "pool"]
        if workers:
            args.append("--workers=%d" % workers)
        preload = list(preload)
        if preload:
            args.append("--preload=" + ",".join(preload))
        args += ["--package-dir=" + os.fspath(d) for d in package_dirs]
        args += ["--allow-read=" + os.fspath(d) for d in allow_read]
        args += ["--allow-write=" + os.fspath(d) for d in allow_write]
        if config:
            args.append("--config=" + os.fspath(config))
        if python:
            args.append("--python=" + python)
        if log:
            args.append("--log=" + log)
        args += list(extra_args)
        self._stderr_to = stderr
        self._stderr_tail: Deque[str] = collections.deque(maxlen=20)
        try:
            self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, cwd=cwd)
        except OSError as e:
            raise PoolError("cannot start %s: %s" % (self.binary, e)) from e
        assert self._proc.stdin is not None and self._proc.stdout is not None and self._proc.stderr is not None
        self._stdin = self._proc.stdin
        self._stdout = self._proc.stdout
        self._stderr_reader = threading.Thread(target=self._copy_stderr, args=(self._proc.stderr,),
                                               name="pynox-stderr", daemon=True)
        self._stderr_reader.start()
        self.ready: Dict[str, Any] = self._read_ready()
        # How long the pool keeps an idle session: a Session idle for about
        # as long resends its grants (see Session.run).
        if session_idle is not None:
            self.session_idle = _seconds(session_idle)
        else:
            found = _config_session_idle(self.ready.get("config"))
            self.session_idle = found if found is not None else DEFAULT_SESSION_IDLE
        self._ids = itertools.count(1)
        self._sessions = itertools.count(1)
        self._write_lock = threading.Lock()  # one line at a time on stdin
        self._state = threading.Lock()  # guards _waiting, _functions, _stopped
        self._stopped: Optional[str] = None  # why no request can be answered any more
        self._waiting: Dict[Any, _Slot] = {}
        self._functions: Dict[Any, Mapping[str, HostFunction]] = {}  # request id -> its host functions
        self._outputs: Dict[Any, OutputCallback] = {}  # request id -> its on_output (the reader's own)
        self._reader = threading.Thread(target=self._read, name="pynox-reader", daemon=True)
        self._reader.start()

    # -- start-up and stderr ------------------------------------------------

    def _copy_stderr(self, pipe: IO[bytes]) -> None:
        for raw in pipe:
            line = raw.decode("utf-8", "replace")
            self._stderr_tail.append(line)
            out = self._stderr_to if self._stderr_to is not None else sys.stderr
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass

    def _read_ready(self) -> Dict[str, Any]:
        line = self._stdout.readline()
        ready: Any = None
        if line:
            try:
                ready = json.loads(line)
            except ValueError:
                pass
        if isinstance(ready, dict) and ready.get("event") == "ready":
            return ready
        if line:
            self._proc.kill()
        code = self._proc.wait()
        self._stderr_reader.join(timeout=5)
        try:
            self._stdin.close()
        except OSError:
            pass
        self._close_pipes()
        why = "".join(self._stderr_tail).strip()
        if line:
            what = "did not start with a ready event (its first line: %r)" % line[:200]
        else:
            what = "exited before it was ready (exit status %d)" % code
        raise PoolError("%s pool %s%s" % (self.binary, what, ": " + why if why else ""))

    @property
    def pid(self) -> int:
        """The process id of the pool."""
        return self._proc.pid

    # -- the reader ---------------------------------------------------------

    def _read(self) -> None:
        reason = "pynox pool exited before answering"
        try:
            for line in self._stdout:
                try:
                    self._dispatch(line)
                except Exception as e:  # noqa: BLE001 - one bad line must not stop the reader
                    log.warning("skipped a line from pynox pool: %s: %s", type(e).__name__, e)
        except BaseException as e:  # noqa: BLE001 - reported to every waiting request
            reason = "the reader of pynox pool's output failed: %s: %s" % (type(e).__name__, e)
            raise
        finally:
            # Wake everyone still waiting, and refuse new requests.
            with self._state:
                if self._stopped is None:
                    self._stopped = reason
                slots = list(self._waiting.values())
                self._waiting.clear()
                self._functions.clear()
                self._outputs.clear()
            for slot in slots:
                slot.error = reason
                slot.done.set()

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except Exception as e:  # noqa: BLE001 - ValueError, RecursionError...
            self._unreadable(line, e)
            return
        if not isinstance(msg, dict):
            log.warning("skipped a line from pynox pool that is not an object: %r", line[:200])
            return
        if msg.get("event") == "call":
            # A host-function call: answer it on a thread of its own, so
            # that other results keep flowing.
            threading.Thread(target=self._answer, args=(msg,), name="pynox-call", daemon=True).start()
            return
        if msg.get("event") == "output":
            self._output(msg)
            return
        if msg.get("event") == "display":
            # A rich output of a streamed request: it is in the result's
            # outputs too.
            return
        if msg.get("id") is None and "call_id" in msg:
            err = msg.get("error") or {}
            log.warning("pynox pool refused a reply to call %s: %s", msg.get("call_id"), err.get("message"))
            return
        if not self._deliver(msg.get("id"), answer=msg):
            log.warning("skipped a line from pynox pool for no waiting request: %r", line[:200])

    def _deliver(self, key: Any, answer: Optional[Dict[str, Any]] = None, error: Optional[str] = None) -> bool:
        try:
            with self._state:
                slot = self._waiting.pop(key, None)
                self._functions.pop(key, None)
                self._outputs.pop(key, None)
        except TypeError:  # an id Python cannot hash (a list, an object)
            return False
        if slot is None:
            return False
        slot.answer, slot.error = answer, error
        slot.done.set()
        return True

    def _unreadable(self, line: bytes, err: Exception) -> None:
        """Handles a line that is not JSON Python can read: a call it starts
        is answered with an error, a result fails its request; anything
        else is skipped."""
        what = "%s: %s" % (type(err).__name__, str(err)[:200])
        m = _CALL_PREFIX.match(line)
        if m:
            log.warning("answered an unreadable call event with an error (%s)", what)
            try:
                self._write({"reply": {"call_id": int(m.group(1)),
                                       "error": "the client could not read the call (%s)" % what}})
            except PoolError:
                pass
            return
        m = _RESULT_PREFIX.match(line)
        if m:
            try:
                key = json.loads(m.group(1))
            except ValueError:
                key = None
            if self._deliver(key, error="unreadable result from pynox pool (%s)" % what):
                return
        log.warning("skipped a line from pynox pool that is not JSON (%s): %r", what, line[:200])

    def _output(self, msg: Dict[str, Any]) -> None:
        """Passes an output event to its request's on_output, on the reader
        thread: in order, and before the request's result is delivered."""
        try:
            with self._state:
                fn = self._outputs.get(msg.get("id"))
        except TypeError:  # an id Python cannot hash
            return
        stream, text = msg.get("stream"), msg.get("text")
        if fn is None or stream not in ("stdout", "stderr") or not isinstance(text, str):
            return
        try:
            fn(stream, text)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the reader
            log.exception("on_output raised; the rest of request %r's output is not passed on", msg.get("id"))
            with self._state:
                self._outputs.pop(msg.get("id"), None)

    def _answer(self, call: Dict[str, Any]) -> None:
        call_id = call.get("call_id")
        with self._state:
            functions = self._functions.get(call.get("id"), {})
        fn = functions.get(call.get("function"))  # type: ignore[arg-type]
        try:
            if fn is None:
                raise RuntimeError("no function %r for request %r" % (call.get("function"), call.get("id")))
            value = fn(*(call.get("args") or ()), **(call.get("kwargs") or {}))
        except Exception as e:  # noqa: BLE001 - the error goes to the sandbox, typed (HOST_ERROR_TYPES) or as HostError
            data = json.dumps({"reply": _error_reply(call_id, e)})
        else:
            try:
                data = json.dumps({"reply": {"call_id": call_id, "result": value}})
            except Exception as e:  # noqa: BLE001 - a value that is not JSON is the host's fault: HostError
                data = json.dumps({"reply": {"call_id": call_id, "error": "%s: %s" % (type(e).__name__, e)}})
        if len(data) > MAX_LINE:  # ASCII: json.dumps escapes the rest
            # The pool would discard the line, answering it with no
            # call_id, and the call would wait until its job's timeout.
            data = json.dumps({"reply": {"call_id": call_id, "error":
                               "the host's reply is %d bytes of JSON; pynox pool reads request lines of at most %d"
                               % (len(data), MAX_LINE)}})
        try:
            self._write_line(data)
        except PoolError:
            pass  # the pool is gone; its job is too

    # -- requests -----------------------------------------------------------

    def _write(self, obj: Dict[str, Any]) -> None:
        self._write_line(json.dumps(obj))

    def _write_line(self, line: str) -> None:
        """Writes one request line (JSON text without its newline)."""
        with self._write_lock:
            try:
                self._stdin.write(line.encode() + b"\n")
                self._stdin.flush()
            except (OSError, ValueError):  # BrokenPipeError; ValueError once closed
                raise PoolError(self._stopped or "pynox pool is not running") from None

    def _request(self, req: Dict[str, Any], functions: Optional[Mapping[str, HostFunction]] = None,
                 on_output: Optional[OutputCallback] = None, rid: Optional[Any] = None) -> Dict[str, Any]:
        if rid is None:
            rid = "py-%d" % next(self._ids)
        if on_output is not None:
            req = dict(req, stream=True)
        line = json.dumps(dict(req, id=rid))
        if len(line) > MAX_LINE:  # ASCII: json.dumps escapes the rest
            # The pool would discard the line and answer it with no id.
            msg = "the request is %d bytes of JSON; pynox pool reads lines of at most %d" % (len(line), MAX_LINE)
            raise RequestError(Result(id=rid, exit=-1, error=ErrorInfo(type="RequestError", message=msg)))
        slot = _Slot()
        with self._state:
            if self._stopped:
                raise PoolError(self._stopped)
            if rid in self._waiting:
                raise ValueError("job_id %r is the id of a request still waiting for its answer" % (rid,))
            self._waiting[rid] = slot
            if functions:
                self._functions[rid] = functions
            if on_output is not None:
                self._outputs[rid] = on_output
        try:
            self._write_line(line)
        except PoolError:
            with self._state:
                self._waiting.pop(rid, None)
                self._functions.pop(rid, None)
                self._outputs.pop(rid, None)
            raise
        slot.done.wait()
        if slot.answer is None:
            raise PoolError(slot.error or "pynox pool exited before answering")
        return slot.answer

    def _result(self, req: Dict[str, Any], functions: Optional[Mapping[str, HostFunction]],
                on_output: Optional[OutputCallback] = None, rid: Optional[Any] = None) -> Result:
        res = Result.from_json(self._request(req, functions, on_output, rid))
        if res.error is not None and res.error.type == "RequestError":
            raise RequestError(res)
        return res

    def run(
        self,
        code: Optional[str] = None,
        *,
        script: Optional[str] = None,
        functions: Optional[Mapping[str, HostFunction]] = None,
        timeout: Optional[Duration] = None,
        on_output: Optional[OutputCallback] = None,
        inputs: Optional[Mapping[str, Any]] = None,
        job_id: Optional[str] = None,
        **fields: Any,
    ) -> Result:
        """Runs code (or the file script) in a fresh confined process and
        returns its Result. fields are the protocol's request fields:
        allow_read, allow_write, allow_network, env, args, name, memory,
        max_output, max_file_size, package_dirs, profile. timeout is a
        string like "5s", a number of seconds or a timedelta.

        functions maps names to callables the code may call through
        pynox_host (`from pynox_host import search`); they run in this
        process, on a thread of their own, with JSON arguments and results,
        and an exception they raise is a HostError in the job.

        on_output, when given, is called as on_output(stream, text) while
        the job runs, stream being "stdout" or "stderr" and text the next
        piece of it (valid UTF-8, in the order written, everything the job
        writes even beyond max_output), all before run returns. It runs on
        the client's reader thread: while it runs no other answer is read,
        so a slow on_output slows the job (and the pool's other answers)
        rather than piling output up, and it must not wait for another
        answer of this pool (a run() inside it would wait forever). If it
        raises, the exception is logged and the job's later output is not
        passed on.

        inputs maps names to JSON values that become globals of the code
        before it runs. When the code ends with an expression, its value
        is result.value (or result.value_repr when it has no JSON form).

        job_id names the job for cancel() from another thread (it must not
        be the id of another request still running); by default the client
        numbers its requests itself.

        A job that fails is a Result (check result.ok, result.error, or call
        result.check()); a request the pool refuses raises RequestError, and
        a pool that stops raises PoolError. A job that cancel() ended is a
        Result with error type CancelledError and exit -1."""
        req = _fields(dict(fields, timeout=timeout))
        if code is not None:
            req["code"] = code
        if script is not None:
            req["script"] = os.fspath(script)
        if functions:
            req["functions"] = declare(functions)
        if inputs is not None:
            req["inputs"] = dict(inputs)
        return self._result(req, functions, on_output, job_id)

    def cancel(self, job_id: str) -> bool:
        """Ends the job that run(..., job_id=job_id) is running or queuing
        (on another thread): that run() returns a Result with error type
        CancelledError. Returns whether such a job had not been answered
        yet. Session steps are interrupted instead (Session.interrupt)."""
        return bool(self._request({"cancel": job_id}).get("cancelled"))

    def session(self, *, name: Optional[str] = None, functions: Optional[Mapping[str, HostFunction]] = None,
                **grants: Any) -> Session:
        """Returns a Session: a confined process whose __main__ survives
        between its run() calls. grants (allow_read, allow_write, env,
        memory, timeout, profile...) and functions fix its permissions and
        host functions. The process starts with the first run()."""
        if name is None:
            name = "py-session-%d-%d" % (os.getpid(), next(self._sessions))
        return Session(self, name, grants, functions or {})

    def stats(self) -> Dict[str, Any]:
        """Returns the pool's counters: the protocol's stats event (jobs,
        ok, failed, timeouts, errors by type, ...)."""
        return self._request({"stats": True})

    def tool(self, *, session: bool = False, functions: Optional[Mapping[str, HostFunction]] = None,
             name: str = "python", **grants: Any) -> Tool:
        """Returns a Tool running code in this pool; see pynox.tool."""
        return Tool(self, session=session, functions=functions, name=name, grants=grants)

    @property
    def closed(self) -> bool:
        """True once close() was called or the pool stopped."""
        return self._stopped is not None

    def close(self) -> int:
        """Closes the pool's input: it answers what it accepted and exits.
        Returns its exit status (0 after a clean drain). Requests made after
        close raise PoolError."""
        with self._state:
            if self._stopped is None:
                self._stopped = "the pool is closed"
        with self._write_lock:
            try:
                self._stdin.close()
            except OSError:
                pass
        code = self._proc.wait()
        self._reader.join(timeout=10)
        self._stderr_reader.join(timeout=10)
        self._close_pipes()
        return code

    def _close_pipes(self) -> None:
        """Closes the pool's output pipes once their readers are done."""
        for reader, pipe in ((getattr(self, "_reader", None), self._stdout),
                             (self._stderr_reader, self._proc.stderr)):
            if pipe is not None and (reader is None or not reader.is_alive()):
                try:
                    pipe.close()
                except OSError:
                    pass

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """A confined process whose __main__ survives between run() calls, for
    agents that define a variable in one call and use it in the next.

    A Python exception leaves it alive, like a notebook cell. A timeout, a
    crash or an exit ends its process (result.session_ended says so) and
    the next run() starts a new one with the same grants. So does a run()
    after the pool closed the session for being idle ([pool] session_idle;
    see Pool): a step after half that time without one carries the grants
    and host functions again. Steps queue behind each other; interrupt()
    stops the running one from another thread."""

    def __init__(self, pool: Pool, name: str, grants: Dict[str, Any],
                 functions: Mapping[str, HostFunction]) -> None:
        self.pool = pool
        self.name = name
        self.grants = grants
        self.functions = functions
        self._lock = threading.Lock()
        self._fresh = True  # the next step starts a process, so it carries the grants
        self._last = 0.0  # time.monotonic() of the last step's answer

    def run(self, code: str, *, timeout: Optional[Duration] = None,
            on_output: Optional[OutputCallback] = None,
            inputs: Optional[Mapping[str, Any]] = None, **step: Any) -> Result:
        """Runs code in the session and returns its Result. step may carry
        name, args and max_output; timeout (as in Pool.run) bounds this
        step; on_output streams its output as in Pool.run. inputs (JSON
        values by name) become globals of the session before the code runs,
        and stay for later steps. Raises RequestError when the pool refuses the step (nothing
        ran), PoolError when the pool stops."""
        with self._lock:
            fields = _fields(dict(step, timeout=timeout))
            fields["session"] = self.name
            fields["code"] = code
            if inputs is not None:
                fields["inputs"] = dict(inputs)
            grants = _fields(dict(self.grants))
            if self.functions:
                grants["functions"] = declare(self.functions)
            if self._fresh:
                # The first request (and the first after the process
                # ended) fixes the permissions and the host functions. A
                # RequestError raised here ran nothing: a fresh session
                # stays fresh.
                res = self.pool._result(dict(grants, **fields), self.functions, on_output)
            elif grants and time.monotonic() - self._last >= self.pool.session_idle / 2:
                # The pool may have closed the session for being idle; a
                # request under its name would then start a new one with
                # only what it carries. So the grants go along, and if the
                # session is alive after all, the pool refuses them
                # (nothing runs) and the step goes again without.
                try:
                    res = self.pool._result(dict(grants, **fields), self.functions, on_output)
                except RequestError as e:
                    if "is running: a later request carries only" not in str(e):
                        raise
                    res = self.pool._result(fields, self.functions, on_output)
            else:
                # A RequestError raised here ran nothing: the session
                # lives on.
                res = self.pool._result(fields, self.functions, on_output)
            self._fresh = res.session_ended
            self._last = time.monotonic()
            return res

    def interrupt(self) -> bool:
        """Interrupts the step this session is running (on another
        thread), as Ctrl-C does: the step's code gets KeyboardInterrupt
        (its result's error type) and the session lives on with its
        variables. A step that catches it and goes on, or that is blocked
        in C code, is killed 2 s later (result.session_ended). Returns
        whether a step was running."""
        return bool(self.pool._request({"session": self.name, "interrupt": True}).get("interrupted"))

    def close(self) -> None:
        """Ends the session's process, if it has one."""
        with self._lock:
            if self._fresh:
                return
            self._fresh = True
            if self.pool.closed:
                return
            try:
                self.pool._request({"session": self.name, "close": True})
            except PoolError:
                pass  # the pool is gone, and the session with it

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Tool:
    """A callable for a model's tool list: tool(code) runs the code and
    returns the text a model should read (output, error, hint). Its
    docstring (also description) tells the model what the tool can do,
    including the host functions' signatures and docstrings; schema is the
    JSON-schema form most model APIs take.

    A Tool made by pynox.tool() without a pool starts a shared default pool
    on its first call (binary from PYNOX_BIN or PATH), closed when Python
    exits."""

    def __init__(self, pool: Optional[Pool], *, session: bool = False,
                 functions: Optional[Mapping[str, HostFunction]] = None,
                 name: str = "python", grants: Optional[Dict[str, Any]] = None) -> None:
        self.pool = pool
        self.stateful = session
        self.functions: Mapping[str, HostFunction] = dict(functions or {})
        self.grants: Dict[str, Any] = dict(grants or {})
        self.name = self.__name__ = name
        self._session: Optional[Session] = None
        self._lock = threading.Lock()
        self.description = self.__doc__ = _describe(self.grants, session, self.functions)

    @property
    def schema(self) -> Dict[str, Any]:
        """The tool as a model API describes a function: name, description
        and JSON-schema parameters (one string, code)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "Python 3 source code to run"}},
                "required": ["code"],
            },
        }

    @property
    def openai_schema(self) -> Dict[str, Any]:
        """The tool as an entry of an OpenAI-style "tools" list:
        {"type": "function", "function": schema}."""
        return {"type": "function", "function": self.schema}

    @property
    def anthropic_schema(self) -> Dict[str, Any]:
        """The tool as an entry of an Anthropic-style "tools" list: name,
        description and input_schema."""
        s = self.schema
        return {"name": s["name"], "description": s["description"], "input_schema": s["parameters"]}

    def __call__(self, code: str) -> str:
        pool = self.pool if self.pool is not None else default_pool()
        try:
            if self.stateful:
                with self._lock:
                    if self._session is None:
                        self._session = pool.session(functions=self.functions, **self.grants)
                    sess = self._session
                res = sess.run(code)
            else:
                res = pool.run(code, functions=self.functions, **self.grants)
        except RequestError as e:
            return "RequestError: %s" % e
        return res.output()

    def interrupt(self) -> bool:
        """Interrupts the step a stateful tool's session is running (see
        Session.interrupt); returns whether one was running."""
        with self._lock:
            sess = self._session
        return sess.interrupt() if sess is not None else False

    def close(self) -> None:
        """Ends the session of a stateful tool."""
        with self._lock:
            sess, self._session = self._session, None
        if sess is not None:
            sess.close()


def _describe(grants: Dict[str, Any], session: bool, functions: Mapping[str, HostFunction]) -> str:
    import inspect

    doc = "Run Python 3 code in a sandbox and return its output (print what you want to see). Grants: %s." % (
        json.dumps(grants, default=str) if grants else "none (no files, no network)")
    if session:
        doc += " Variables persist between calls."
    if functions:
        doc += "\nThe code can call these functions with `from pynox_host import NAME`:"
        for fname in sorted(functions):
            fn = functions[fname]
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                sig = "(...)"
            doc += "\n  %s%s: %s" % (fname, sig, (inspect.getdoc(fn) or "").strip())
    return doc


def tool(pool: Optional[Pool] = None, *, session: bool = False,
         functions: Optional[Mapping[str, HostFunction]] = None, name: str = "python", **grants: Any) -> Tool:
    """Returns a Tool for a model's tool list: it runs the code it is given
    under grants (allow_read, allow_write, timeout, ...), with functions
    as host functions the code may call, and returns what a model should
    read. With session=True the tool is stateful: a variable defined in one
    call is there in the next. pool defaults to a shared pool started on
    the tool's first call (see default_pool)."""
    return Tool(pool, session=session, functions=functions, name=name, grants=grants)


_default: Optional[Pool] = None
_default_lock = threading.Lock()


def default_pool() -> Pool:
    """Returns the shared pool that tools made without a pool use,
    starting it on first use with the binary from PYNOX_BIN or PATH and the
    pool's defaults; it is closed when Python exits."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            import atexit

            _default = Pool()
            atexit.register(_default.close)
        return _default
