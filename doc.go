// Package pynox runs real CPython for untrusted code — LLM-written code,
// notebook cells, agent tools — fast and confined.
//
// A trusted template process imports the interpreter and the operator's
// preloads once; every job is a fresh child forked from it and confined by
// Landlock, seccomp and rlimits before its first line runs. Go programs use
// [New] and [Pool.Run] for one-shot jobs and [Pool.Checkout] for sessions;
// every other language drives `pynox pool` (the cmd/pynox command, a thin
// layer over [Pool.Serve]) over JSON Lines.
//
// # Process model
//
//	Go host: Pool ──── Run(ctx, Job) ────────────── Serve (JSON Lines)
//	   │   one socketpair per template: framed JSON, SCM_RIGHTS
//	   ▼
//	template   python3 -I -B -c <embedded runner>   (one per worker)
//	   │   trusted, single-threaded; holds fds 0-3 and O_PATH descriptors
//	   │   of the runtime paths; imports preloads, then drops every
//	   │   capability (bounding set too), sets no_new_privs and attaches
//	   │   the seccomp template layer, once; runs a fixed dummy job (and
//	   │   a failing one) through the job path, so that the state CPython
//	   │   builds lazily is shared by every child, and backs its dense
//	   │   heap with huge pages (cheaper forks and exits);
//	   │   forks the next spare when the last one is done with (or as soon
//	   │   as it is taken, when jobs are waiting); reaps children and
//	   │   reports their exit status
//	   ▼ fork
//	spare      request-independent confinement done ahead of time:
//	   │   only its own fds (0 /dev/null, 1-2 output pipes, 3 control,
//	   │   4 bell), own session, parent-death signal, a Landlock ruleset
//	   │   holding the runtime rules, the seccomp job layer of its kind
//	   │   (with or without network), standard streams, warmed up
//	   ▼ job frame (+ the grants' O_PATH fds) on its own control socket
//	job        environment, rlimits, the request's Landlock grants and
//	           restrict_self — then "started", the code, "done"
//
// The template hands each spare's control socket, output pipes and pidfd to
// Go and keeps none of them, so a job never holds the template's channel:
// anything it writes to any descriptor reaches only its own control channel,
// bell and output pipes. The host reads the control channel when the child
// rings its bell (a byte on a pipe), so the "started" report wakes nobody
// and a short job wakes the host once; a job that closes its bell is polled. Go reads the pipes itself (output is captured at
// descriptors 1 and 2, so os.write and C extensions are captured too),
// keeps at most max_output bytes of each and drains the rest. Timeouts are
// enforced from Go with a pidfd, which cannot hit a reused pid. A job that
// reported "done" is killed at once: nothing it does afterwards can matter.
// A template that dies is replaced at once, before its worker serves
// again; its children die with it (parent-death signal), and it dies with
// the pool (parent-death signal, and end of file on its channel).
//
// # Confinement
//
// Each job, before its first line runs, has gone through these steps.
// Those that do not depend on the request happen earlier — capabilities,
// no_new_privs and the seccomp template layer in the template,
// descriptors, the Landlock ruleset and the seccomp job layer in the
// spare — which only makes the process stricter
// sooner; the request's environment, rlimits and Landlock grants come when
// the job arrives, and Landlock is enforced last:
//
//  1. descriptors: only 0-4 remain; the environment is a fixed minimal set
//     (PATH, LANG, LC_ALL, HOME=/nonexistent, single-threaded BLAS
//     settings) plus the request's env — the pool's own environment never
//     reaches a template or a job;
//  2. rlimits: address space (see Limits), file size (SIGXFSZ ignored, so
//     an oversized write fails with OSError EFBIG), no core dumps, a CPU
//     time backstop one second past the timeout, 4096 descriptors;
//  3. every capability dropped, bounding and ambient sets included, and
//     no_new_privs — CI and many servers run as root, and root without
//     capabilities is just a user;
//  4. Landlock, at the newest ABI the kernel offers: read and execute on the
//     interpreter's runtime paths and a few system paths (shared libraries,
//     zoneinfo, certificates, name-service files), read on allow_read and
//     package_dirs, read and write on allow_write, nothing else; TCP bind
//     and connect denied unless the network is granted (ABI 4); signals and
//     abstract unix sockets scoped to the job (ABI 6);
//  5. seccomp (built in Go, internal/seccomp): no process creation, no exec,
//     no sockets unless the network is granted (then IPv4/IPv6 only), none
//     of the kernel surface a job never needs, and the architecture checked.
//     It comes in two layers, because attaching a filter costs the kernel
//     time in proportion to its length: the template attaches the long one
//     (everything the template itself can live without) once, and each
//     spare only a short one on top (process creation, pidfd_open, sockets
//     without the network); the kernel runs both and the stricter answer
//     wins.
//
// If any step fails no user code runs, and the job answers
// SandboxSetupError. Landlock can only add rules, so a write grant that
// would cover the interpreter, its packages or a package dir is refused
// before anything runs. Paths in requests are opened by the pool with
// O_PATH and judged by what the descriptor really names, and that same
// descriptor is what the job's Landlock rule holds: a symlink swapped in
// later cannot redirect a grant. SECURITY.md has the threat model.
//
// # The pool's own confinement
//
// With Config.ConfineSelf (on in `pynox pool`, unless [pool] confine_self
// = false) the pool puts its whole process in a Landlock domain, through
// go-landlock, before the first template starts; templates and jobs
// inherit it, and a job's own domain stacks on top. It allows what some
// job may be granted and little more: read and execute on the
// interpreter's runtime paths (asked of the interpreter once, by a
// throw-away run started like a template) and the system paths jobs get,
// read on the package dirs and the read ceiling, read and write (not
// execute) on the write ceiling, the device files jobs use, and /proc
// read-only (each template inspects its own /proc/self, whose number is
// not known in advance; Landlock's ptrace rules still keep other
// processes' environ, memory and descriptors out of reach). TCP bind and
// connect are denied unless the ceiling grants the network (ABI 4; Landlock
// does not mediate Multipath TCP, which stays to the seccomp layers), and
// abstract unix sockets are scoped (ABI 6). The configuration file is not
// in the domain: it was read before, and no job may read it. So code that
// escaped a job into a template — or a preload that misbehaves — still
// finds only the ceiling, and the pool itself opens nothing outside it.
//
// It is best effort: on a kernel without Landlock the pool runs
// unconfined, and an older ABI enforces what it has. So it does, with a
// reason, in a PID namespace that kept its parent's /proc (`unshare -p -f`
// without --mount-proc) when built with cgo and below ABI 8: libpsx finds
// the threads to confine in /proc/<pid>/task, which there names another
// process. Signals are scoped
// only from ABI 8, which enforces one domain on all threads at once
// (LANDLOCK_RESTRICT_SELF_TSYNC); before, go-landlock enforces it thread
// by thread (psx), each thread gets a domain of its own, and a scoped
// domain would stop the pool from signalling a job whose template another
// thread started. [Pool.SelfConfinement] and the ready event's
// "self_confinement" report the ABI, whether TCP is denied and whether
// signals are scoped. The library leaves the field off by default because
// the domain holds the whole embedding program, for good: a program that
// confines itself this way can afterwards only read and write what the
// pool may, and a second pool in the same process gets at most the first
// one's domain. A preload that reads files outside the runtime paths at
// import (rare) fails the template's start with its PermissionError;
// put its directory in package_dirs or set confine_self = false.
//
// # Limits
//
// Without a configured ceiling, a request may read and write only beneath
// the pool's working directory, has no network, and gets (at most) a 30s
// timeout, 1 GiB of memory, 1 MiB of each output stream and 256 MiB files.
// memory is the job's allowance on top of the template it was forked from:
// the job's RLIMIT_AS is set to the address space it already has at
// hand-over plus the allowance, so preloaded pandas does not eat a small
// allowance. An allocation beyond it raises MemoryError, whose hint names
// the limit and how far the ceiling allows raising it.
//
// # Results
//
// [Pool.Run] answers every job it accepts with a [Result], whatever
// happened; it returns an error only when it could not take the job
// (ctx ended, pool closed). Result.Exit is the process's exit status when
// it ended on its own, and -1 otherwise. Result.Error is nil on success;
// its Type is the Python exception class, or RequestError (refused before
// anything ran), TimeoutError, SignalError (killed by a signal such as
// SIGSEGV; the message names it), SandboxSetupError or PoolWorkerError
// (the template died, or the job broke its control protocol).
// [Result.Err] turns it into an [*Error] for errors.Is against [ErrTimeout]
// and the other sentinels. Inline code is named [DefaultName] ("<code>") in
// tracebacks unless the request names it.
//
// A job can lie only about itself: once its code runs it can write any
// frame to its own control channel, but the pool accepts from it nothing
// but its own "done" (validated, size-bounded), and a malformed frame gets
// it killed with PoolWorkerError.
//
// # Sessions
//
// [Pool.Checkout] starts a session: a template of its own (the spec's "the
// first step pays the template start") and, at the first [Checkout.Feed],
// one process forked from it and confined exactly as a job. The checkout's
// job fixes permissions, limits, environment and host functions; each
// [Step] brings code, name, args and optionally a timeout and output cap
// within the ceiling. Steps run in order in the same __main__. A Python
// exception leaves the process alive; an exit, a timeout, a crash, a
// MemoryError or a broken protocol ends it (Result.SessionEnded), and the
// next Feed forks a new one from the same template. Config.MaxSessions
// caps open checkouts ([ErrExhausted] beyond), Config.SessionIdle closes
// an idle one, and [Pool.Close] ends them all.
//
// Between steps the pool stops the process (SIGSTOP through its pidfd)
// and resumes it for the next step (SIGCONT), so threads it started burn
// no CPU and write nothing while nobody waits on it; descriptors 1 and 2
// point at /dev/null then, and a host call from such a thread belongs to
// the step that is running. A frame found on the control channel when a
// step begins was forged (the runner holds its channel between steps) and
// ends the session. A CPU-time backstop is renewed at each step (CPU used
// so far + the step's timeout + 1s). Its memory limit is fixed at
// creation. The pool protocol's named sessions
// (`"session": "name"`) are checkouts that [Pool.Serve] keeps by name, with
// a queue of at most [MaxPendingSteps] requests each.
//
// # Host functions
//
// A job that declares Functions gets a pynox_host module with one function
// per name (and pynox_host.HostError). A call encodes its arguments as
// JSON (at most [MaxCallBytes]), sends a "call" frame on the job's control
// channel and blocks until the pool writes the reply; the pool hands it to
// Job.Host (or, for a checkout without a Host, returns it from Feed as a
// [TurnEvent] to answer with [Checkout.Resume]). The time waiting counts
// against the job's timeout; a job may make [MaxCalls] calls (per step in
// a session). The pool checks every call frame before anyone sees it: a
// name that was not declared, too many calls or too large arguments get
// an error the job sees as HostError and the host never sees; a second
// call while one waits, or a malformed one, is a protocol break
// (PoolWorkerError). Calls from several threads take turns.
//
// # Relation to monty-pool
//
// The Go API is modelled on the Rust monty-pool crate, mapped onto CPython:
//
//   - Pool, PoolConfig: [Pool] and [Config]. min/max_processes become
//     Config.Workers: every template is started eagerly and each job is a
//     fresh fork, so there is nothing to scale or recycle
//     (max_checkouts_per_worker has no purpose: no process ever serves two
//     jobs). checkout_timeout is the ctx passed to Run; request_timeout is
//     Job.Timeout, enforced from Go exactly as monty's parent-side deadline.
//   - PoolError kinds: [Kind]. Crashed is KindCrashed (PoolWorkerError),
//     Timeout KindTimeout, Runtime KindRuntime, Spawn KindSpawn,
//     Exhausted KindExhausted (Config.MaxSessions checkouts are open; no
//     waiting, since a checkout is not a worker of the pool's), Finished
//     KindFinished, Protocol KindProtocol (caller misuse: Resume with no
//     call waiting, Feed while one waits; a child's protocol break is
//     KindCrashed); a closed pool is KindClosed. A worker exceeding its
//     memory limit is a Python MemoryError, as in monty.
//   - Checkout, feed, resume, finish: [Checkout], [Checkout.Feed],
//     [Checkout.Resume], [Checkout.Finish]. ReplConfig becomes the [Job]
//     given to [Pool.Checkout] (script name: Step.Name; limits: the job's
//     timeout and memory). As in monty, a Feed whose ctx ends kills the
//     step (the process is discarded; the next Feed starts a new one) and
//     a Python exception leaves the session usable. Dropping a Checkout
//     without Finish leaves it to Config.SessionIdle.
//   - TurnEvent: [TurnEvent] with Call (FunctionCall) or Result
//     (Complete). OsCall, NameLookup and ResolveFutures do not apply: the
//     job's OS calls are real system calls confined by the kernel, names
//     are looked up by CPython itself, and host calls are synchronous
//     (no futures).
//   - ResumeValue: [Return] and [Raise] (Return and Error). Future,
//     NotFound and NotHandled do not apply: calls are synchronous, and
//     only declared names exist in pynox_host, so an undeclared one fails
//     in the job before it reaches the host.
//   - OnPrint streaming: not provided; a step's stdout and stderr come
//     whole with its Result, captured at the descriptors (so C
//     extensions' output is included), capped by MaxOutput.
//   - MountSpec: does not apply. monty services file access from the
//     parent because its interpreter has no real OS; pynox runs real CPython
//     on the real filesystem and confines it with Landlock grants
//     (allow_read, allow_write), which the kernel enforces. There is no
//     overlay mode; a job writes only where it is granted.
//   - dump/restore, install_dependencies, type checking, WebSocket
//     transport, telemetry adapters: do not apply. CPython state cannot be
//     serialised safely, packages come from the operator (preloads and
//     package dirs) rather than from jobs, and logging goes to
//     Config.Logger (a *slog.Logger).
package pynox
