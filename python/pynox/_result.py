"""The result of a job, as the pool reports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._errors import JobError


@dataclass(frozen=True)
class ErrorInfo:
    """Why a job did not succeed: type is the Python exception class, or
    one of RequestError, TimeoutError, SignalError, SandboxSetupError,
    PoolWorkerError. file and line point at the code when known; hint says
    what to change for permission, memory and file-size errors."""

    type: str
    message: str
    file: Optional[str] = None
    line: Optional[int] = None
    hint: Optional[str] = None

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> ErrorInfo:
        """Builds an ErrorInfo from the error object of a result line."""
        return cls(
            type=str(obj.get("type") or "Error"),
            message=str(obj.get("message") or ""),
            file=obj.get("file"),
            line=obj.get("line"),
            hint=obj.get("hint"),
        )

    def __str__(self) -> str:
        text = "%s: %s" % (self.type, self.message)
        if self.hint:
            text += " (hint: %s)" % self.hint
        return text


@dataclass(frozen=True)
class Result:
    """The answer to one job or session step.

    exit is the process's exit status (-1 when the job never ran or was
    killed); stdout and stderr are what it printed (the traceback of an
    uncaught exception is in stderr); error is None on success. session
    and step are set for session steps; session_ended says the session's
    process ended with this step, so the next step starts a new one.
    value is the value of the code's last expression (REPL style),
    decoded from JSON, when it is one and not None and has a JSON
    encoding; otherwise such a value's repr (cut to 64 KiB) is in
    value_repr. Both are None when the code ended in a statement, its
    value was None, or it failed.
    restarted marks the first step of a session's replacement process
    (its globals start empty); restored, the first step after the pool
    restored an idle session from its dump. usage holds the kernel's
    figures for the job or step (cpu_ms, max_rss_bytes, minor_faults,
    wall_ms), files the files it left (collect, $PYNOX_OUTPUTS: dicts
    with path, size and base64 data), each as the pool wrote them.
    outputs are the job's rich outputs in order, each {"mime", "data"}
    (data base64 for image/png and image/jpeg): matplotlib figures,
    pynox_display.display(obj), a DataFrame value's HTML table.
    raw is the whole result line as the pool wrote it (runtime, policy,
    timings)."""

    id: Any
    exit: int
    stdout: str = ""
    stderr: str = ""
    error: Optional[ErrorInfo] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    queue_us: int = 0
    session: Optional[str] = None
    step: Optional[int] = None
    session_ended: bool = False
    value: Any = None
    value_repr: Optional[str] = None
    restarted: bool = False
    restored: bool = False
    usage: Optional[Dict[str, Any]] = None
    files: List[Dict[str, Any]] = field(default_factory=list)
    outputs: List[Dict[str, str]] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> Result:
        """Builds a Result from a decoded result line."""
        err = obj.get("error")
        return cls(
            id=obj.get("id"),
            exit=int(obj.get("exit", -1)),
            stdout=str(obj.get("stdout") or ""),
            stderr=str(obj.get("stderr") or ""),
            error=ErrorInfo.from_json(err) if isinstance(err, dict) else None,
            stdout_truncated=bool(obj.get("stdout_truncated")),
            stderr_truncated=bool(obj.get("stderr_truncated")),
            duration_ms=int(obj.get("duration_ms") or 0),
            queue_us=int(obj.get("queue_us") or 0),
            session=obj.get("session"),
            step=obj.get("step"),
            session_ended=bool(obj.get("session_ended")),
            value=obj.get("value"),
            value_repr=obj.get("value_repr"),
            restarted=bool(obj.get("restarted")),
            restored=bool(obj.get("restored")),
            usage=obj.get("usage") if isinstance(obj.get("usage"), dict) else None,
            files=[f for f in obj.get("files") or [] if isinstance(f, dict)],
            outputs=[o for o in obj.get("outputs") or [] if isinstance(o, dict)],
            raw=obj,
        )

    @property
    def ok(self) -> bool:
        """True when the code ran to the end and exited with status 0."""
        return self.error is None and self.exit == 0

    def check(self) -> Result:
        """Returns the result if ok, and raises JobError otherwise."""
        if not self.ok:
            raise JobError(self)
        return self

    def output(self) -> str:
        """The text a person or a model should read: stdout, stderr, the
        error and its hint, and notes on truncation and a session's end."""
        out = self.stdout + self.stderr
        if self.stdout_truncated or self.stderr_truncated:
            out = _line(out, "(output truncated)")
        if self.error is not None:
            line = "%s: %s" % (self.error.type, self.error.message)
            if not out.rstrip("\n").endswith(line):  # the traceback's last line says it already
                out = _line(out, line)
            if self.error.hint:
                out = _line(out, "hint: " + self.error.hint)
        if self.session_ended:
            out = _line(out, "(the session restarted: its variables are gone)")
        return out


def _line(text: str, line: str) -> str:
    """Appends line to text, on a line of its own."""
    if text and not text.endswith("\n"):
        text += "\n"
    return text + line + "\n"
