// Package pynox runs real CPython for untrusted code — LLM-written code,
// notebook cells, agent tools — fast and confined.
//
// A trusted template process imports the interpreter and the operator's
// preloads once; every job is a fresh child forked from it and confined by
// Landlock, seccomp and rlimits before its first line runs. Go programs use
// [New] and [Pool.Run] for one-shot jobs and [Pool.Checkout] for sessions;
// every other language drives `pynox pool` (the cmd/pynox command, a thin
// layer over the protocol package github.com/pynox/pynox/jsonl, which
// serves a Pool over JSON Lines as net/rpc/jsonrpc serves net/rpc) over
// JSON Lines. MCP clients use `pynox mcp`, a Model Context Protocol server
// over stdio (package github.com/pynox/pynox/mcpserver, on the same Pool
// and Checkout). This package is the library only: Pool, Job, Result,
// Checkout, Step, errors, Config and its limits.
//
// # Process model
//
//	Go host: Pool ──── Run(ctx, Job) ────────────── jsonl.Serve (JSON Lines)
//	   │   one socketpair per template: framed JSON, SCM_RIGHTS
//	   ▼
//	template   python3 -I -B -c <boot> < embedded runner   (one per worker; PID 1
//	   │   of a PID namespace of its own)
//	   │   trusted, single-threaded; holds fds 0-3 and O_PATH descriptors
//	   │   of the runtime paths; imports preloads, then drops every
//	   │   capability (bounding set too), sets no_new_privs and attaches
//	   │   the seccomp template layer, once; runs a fixed dummy job (and
//	   │   a failing one) through the job path, so that the state CPython
//	   │   builds lazily is shared by every child (the receipt of a
//	   │   job frame too), and builds a spare's Landlock argument blocks
//	   │   and descriptor plan once; lays out the functions of a plain
//	   │   job's path (and their constants) together, and fills the free
//	   │   blocks of its object allocator's partly used pools, so that a
//	   │   spare writes to (and copies) fewer pages; backs its dense
//	   │   heap with huge pages (cheaper forks and exits); gives the
//	   │   read-only file mappings of its runtime one private page each,
//	   │   unchanged, so that a fork copies their page-table entries and
//	   │   a spare does not fault the interpreter's code in again;
//	   │   forks the next spare when the last one is done with (or as soon
//	   │   as it is taken, when jobs are waiting); reaps children and
//	   │   reports their exit status
//	   ▼ fork
//	spare      request-independent confinement done ahead of time:
//	   │   only its own fds (0 /dev/null, 1-2 output pipes, 3 control,
//	   │   4 bell), own session, parent-death signal, a Landlock ruleset
//	   │   holding the runtime rules, the seccomp job layer of its kind
//	   │   (with or without network), standard streams; then warmed up
//	   │   (a dummy job) only if no job waits yet and it got a CPU
//	   │   without waiting (a busy machine's CPU is the jobs');
//	   │   the host moves it into a cgroup of its own (tasks and memory)
//	   │   before handing it out
//	   ▼ job frame (+ the grants' O_PATH fds) on its own control socket
//	job        environment, rlimits, the request's Landlock grants and
//	           restrict_self — then "started", the code, "done"
//
// The template hands each spare's control socket, output pipes and pidfd to
// Go and keeps none of them, so a job never holds the template's channel:
// anything it writes to any descriptor reaches only its own control channel,
// bell and output pipes. The host reads the control channel when the child
// rings its bell (a byte on a pipe), so the "started" report wakes nobody
// and a short job wakes the host once; a job that closes its bell is polled.
// The bell is read in bulk, and a job that rings more than twice per frame
// it writes (and 256 more) is killed as a protocol break. Go reads the pipes itself (output is captured at
// descriptors 1 and 2, so os.write and C extensions are captured too),
// keeps at most max_output bytes of each and drains the rest. Timeouts are
// enforced from Go with a pidfd, which cannot hit a reused pid. A job that
// reported "done" is killed at once: nothing it does afterwards can matter.
// A template that dies is replaced at once, before its worker serves
// again; its children die with it, and it dies with the pool (see Process
// lifetime).
//
// # Process lifetime
//
// Each template runs as PID 1 of a PID namespace of its own
// (Config.PIDNamespace "auto", the default; [Pool.PIDNamespace] and the
// ready event's "pid_namespace" say whether it does). The template dies
// with the pool (parent-death signal SIGKILL, and end of file on its
// channel), and when a namespace's PID 1 dies the kernel kills every
// process in the namespace and reaps it: a job or session process cannot
// outlive its template, hence the pool, whatever it does — clearing its
// own parent-death signal (prctl(PR_SET_PDEATHSIG, 0)) included. As root
// the namespace is a plain CLONE_NEWPID. Otherwise it belongs to a new
// user namespace that maps the caller's uid and gid to themselves (setgroups
// denied), so that ids and file ownership are unchanged; the capabilities
// the template holds in it are dropped, bounding set included, before it
// forks anything, as root's are, so a job gains nothing from it (and
// seccomp denies jobs unshare, setns and process creation anyway). Where
// the kernel refuses both (user namespaces disabled, an old kernel), "auto"
// falls back to ordinary children, which die with their template only by
// their parent-death signal; "require" makes [New] fail instead; "off"
// never uses namespaces. Inside its namespace a job sees its own pid
// and the template's (1), but not the pool nor any other template's
// processes; [Checkout.Pid] is a pid in the pool's namespace (the host
// learns a child's from its pidfd). Signals from the
// pool still reach the template: it only sends SIGKILL (and tests
// SIGSTOP), which the kernel delivers to a namespace's PID 1 from outside
// it; from inside, a PID 1 receives only signals it handles.
//
// Every process is reaped by its parent: Go waits for each template; a
// template reaps each child it forked (reporting its exit status), reaps
// any orphan its namespace hands it (none can arise: jobs cannot fork) at
// its next fork or exit report, and when it is closed kills its
// children and waits for each before it exits. So a Go program that is
// PID 1 of a container, or a subreaper, collects no zombie from pynox.
// Without PID namespaces one case remains: the spares of a template that
// was killed (by someone else, or by the pool for breaking its protocol)
// die by their parent-death signal and are orphaned to the nearest
// subreaper or PID 1; the library does not reap them, as a library must
// not wait for children it did not start. `pynox pool` does: it makes
// itself a child subreaper and reaps every exited child it did not start:
// the processes it starts share its session and either lead a process
// group of their own (the templates) or stay in its group, while a spare
// is in its template's group until its setsid and in a session of its own
// after it, so this never takes a status os/exec waits for.
//
// # CPU affinity
//
// With Config.PinCPUs (off in the library, on in `pynox pool` and `pynox
// serve` unless [pool] pin_cpus = false or --pin-cpus=false), template i
// pins itself, before it imports its preloads, to the i-th CPU, round
// robin, of the CPUs the pool process may run on at New (never another:
// with one allowed CPU nothing is pinned), and every spare, job and
// session it forks inherits that CPU; a replacement template gets its
// predecessor's. The wake-ups between a template, its spare and its job
// then never cross CPUs, which on a small VM cost tens of microseconds
// each. The price is that the scheduler may no longer move a busy job or
// session to an idle CPU: sessions are spread over the templates, so a
// long CPU-bound step shares its template's CPU with that worker's jobs.
// Pool.PinnedCPUs and the ready event's pinned_cpus report the CPUs. A
// job may widen its own affinity within its cpuset (its seccomp filter
// allows sched_setaffinity on itself): pinning is not a confinement.
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
//     (PATH, LANG, LC_ALL, single-threaded BLAS settings; TMPDIR and HOME
//     name the job's scratch directory, see Scratch space and mounts) plus
//     the request's env — the pool's own environment never reaches a
//     template or a job;
//  2. rlimits: address space (see Limits), the size of each file written
//     (SIGXFSZ ignored, so an oversized write fails with OSError EFBIG),
//     no core dumps, a CPU time backstop one second past the timeout, 4096
//     descriptors;
//  3. every capability dropped, bounding and ambient sets included, and
//     no_new_privs — CI and many servers run as root, and root without
//     capabilities is just a user — and not dumpable, so that a crash
//     never reaches the host's core handler (a core_pattern pipe ignores
//     RLIMIT_CORE);
//  4. Landlock, at the newest ABI the kernel offers: read and execute on the
//     interpreter's runtime paths and a few system paths (shared libraries,
//     zoneinfo, certificates, name-service files), read on allow_read and
//     package_dirs, read and write on allow_write, nothing else; TCP bind
//     and connect denied unless the network is granted (ABI 4); signals and
//     abstract unix sockets scoped to the job (ABI 6);
//  5. seccomp (built in Go, internal/seccomp), an allow list: every system
//     call it does not name fails with EPERM, new and unknown numbers
//     included. No process creation, no exec, no sockets unless the network
//     is granted (then IPv4/IPv6 only), no descriptors passed (sendmsg)
//     unless the network is granted, no out-of-band data, no set-ID bits
//     in a new file's mode, socketpair only as an AF_UNIX
//     stream pair, ioctl, fcntl and prctl only for a short list of
//     requests, and the architecture checked. It comes in two layers,
//     because attaching a filter costs the kernel time in proportion to its
//     length: the template attaches the long one (the allow list and the
//     argument filters) once, and each spare only a short one on top
//     (process creation, pidfd_open, seccomp, PR_SET_PDEATHSIG, and the
//     socket calls without the network); the kernel runs both and the
//     stricter answer wins.
//
// If any step fails no user code runs, and the job answers
// SandboxSetupError. Landlock can only add rules, so a write grant that
// would cover the interpreter, its packages or a package dir is refused
// before anything runs; so is one that would cover the pool's own
// executable, its directory or its configuration file (or is a hard link
// to one of these files), which the operator's next start would run or
// load with the pool's rights. Paths in requests are opened by the pool
// with O_PATH and judged by what the descriptor really names, and that same
// descriptor is what the job's Landlock rule holds: a symlink swapped in
// later cannot redirect a grant. SECURITY.md has the threat model.
//
// # Scratch space and mounts
//
// Every job and every session gets a private scratch directory, which its
// TMPDIR and HOME name (unless its env names them itself), so that
// tempfile, pandas.to_csv and libraries' caches work without a grant. The
// pool makes one directory of its own at [New] (beneath
// Config.ScratchDir: by default /dev/shm when it is a tmpfs, else
// os.TempDir(); mode 0700) and in it one
// directory per job or session (mode 0700), opened with O_PATH and given
// to that job alone as a write grant: two jobs never see each other's,
// and no request may be granted the pool's scratch directory or anything
// beneath it. A session keeps its directory across the steps of one
// process; a replacement process (Result.Restarted, or an idle session
// restored from its file) finds it empty, since what the ended process
// wrote there was charged to that process's memory cgroup. When a job
// ends, the pool empties its directory once the template has reported
// the process gone, and keeps it for the next job (making and removing a
// directory costs a journal commit on ext4); a session's is removed when
// it ends, and the whole scratch directory when the pool closes (a pool
// holds an flock on its scratch directory for its whole life; the next
// pool removes those of pools that were killed, whose lock went with
// them). The pool
// removes only through descriptors it opened itself, relative to its
// scratch directory's and with O_NOFOLLOW|O_DIRECTORY, so a symlink a job
// planted is unlinked, never followed; a directory whose permissions
// were taken away gets them back through a descriptor of that very
// directory; nesting deeper than 32 levels is moved up and removed from
// there, so the descriptors held stay bounded.
//
// A pool running as root with memory cgroups mounts a tmpfs of its own
// (no inode limit, the parent's size) on its scratch directory when that
// lies in a tmpfs, so that a job's files, their inodes too, are charged
// to its own memory cgroup and no job uses up the inodes every other
// job's scratch directory needs; the pool unmounts it when it closes (a
// pool that confines itself has its mounter do it), and the next pool
// unmounts a killed pool's.
//
// Scratch space has no size bound of its own: max_file_size bounds each
// file. On a tmpfs (the default /dev/shm) what a job writes there is
// memory, charged to the job's memory cgroup like the rest of its memory
// (see Limits): with cgroups, a job's scratch and its heap share its
// allowance, and a job that fills its scratch beyond it is killed and
// answers MemoryError (rather than failing a write with ENOSPC); without
// cgroups only the tmpfs's own size bounds it. On a disk (ScratchDir
// elsewhere) the file system's free space does. A bound that fails
// writes with ENOSPC needs a sized tmpfs per job in a mount namespace of
// its own, which only overlay mounts get (see below).
//
// [Job.Mounts] gives a job host directories or files as [MountSpec]s:
// [ReadOnly] mounts are read grants and [ReadWrite] mounts write grants,
// opened, judged and refused exactly as allow_read and allow_write, and
// fixed when the job or session starts. What a job writes through a
// read-write mount is untrusted: never execute or import it. A mount at
// its host path is a Landlock grant and nothing more.
//
// A mount at another path (Path "/data"), and an [Overlay] mount, take a
// mount namespace of the job's own. Landlock denies a confined process
// every mount, and the template has dropped its capabilities, so the
// pool starts a mounter (a trusted Python helper, python3 -I -S, that
// dies with the pool) with the first job that needs one. Per job it
// assembles a root as a detached mount tree: a small tmpfs holding the
// host's top-level symlinks and, at their host paths, read-only binds of
// the paths the job's Landlock rules name (the interpreter's runtime
// paths, the system paths, four device files, /proc) and its grants and
// scratch directory (read-write where granted), plus its mounts at their
// paths: read-only ones remounted read-only (writes fail with EROFS),
// overlays as overlayfs over the host directory with their writes on a
// tmpfs of WriteBytesLimit (DefaultOverlayLimit by default; past it
// writes fail with ENOSPC). Nothing is ever created on the host; the host
// directories are the descriptors the pool opened when it accepted the
// request. The mounter pivots into the tree in a new mount namespace,
// then makes a user namespace (mapping only an id no file has) with a
// copy of it, and hands the pool both namespaces. The job's process is
// the template's ready ns spare (a spare attaches its seccomp job layer
// ahead of time, so it cannot serve such a job): a spare prepared like
// any other but for that layer, which it attaches only once it has
// entered its job's namespaces. It enters the two namespaces (the
// template's seccomp layer allows setns for exactly these two types; the
// job layer denies setns and capset), drops the capabilities the user
// namespace gave it and checks they are gone, attaches its job layer,
// and adds its Landlock rules (per inode, so they match the binds; an
// overlay's rule is opened inside) before it enforces them. So the job
// sees nothing of the host it was not given, not even by stat; renames
// and hard links across mounts fail with EXDEV; a symlink planted in a
// writable mount resolves inside the namespace. A session keeps its
// namespace across steps (its overlay writes persist and vanish with
// it); a replacement process, or one restoring a dump, gets a new one,
// its overlays empty like its __main__. Such a job costs a round trip to
// the mounter on its path; the fork of its process is not on it. The
// paths of a job's mounts and of the grants it sees at their host paths
// may name at most 512 directories in all (each directory above a path
// counting once): in a pool that confines itself the mountpoints of
// every live namespace share one tmpfs, sized for that many per
// namespace the pool can have live at once.
//
// A template keeps no ns spare until its first job (or session) with a
// mount namespace, and from then on one per network kind used, replaced
// like its spare once the one taken is done with (a session's, after its
// first step); a replacement template starts without one again. A pool
// whose jobs never need a namespace holds none. After its first such job
// an idle pool holds, per template, one more process than before: its ns
// spare, forked from the template as its spare is (measured on this
// machine with smaps_rollup: about 1.1 MB of memory of its own, USS, and
// 5.3 MB PSS without preloads; 2.4 MB USS and 18.6 MB PSS with pandas
// preloaded). Like every spare it sits in a job cgroup of its own (when
// the pool uses cgroups), with one job's tasks and memory limits: it
// takes none of another job's tasks (Limits.Threads), and counts one
// task against a limit the operator sets on the pool's own cgroup.
// pynox_ns_spares_ready counts the templates holding one. A ready ns
// spare that never receives its namespaces' descriptors never runs
// code: a job frame without them, or with descriptors that are not a
// user and a mount namespace, is a SandboxSetupError before any of the
// job's code (TestNSSpareForgedFrames).
//
// A ready ns spare enters a namespace before its job, off the job's
// path: as the template delivers it, the pool leases a prepared
// namespace from its mounter (one of its stock, holding the base only)
// and sends it to the spare, which enters it, drops its capabilities and
// attaches its seccomp job layer while it waits. At the job the mounter
// attaches the job's mounts to that namespace and makes its root
// read-only while the spare takes its job and confines itself; the spare
// waits for the pool's word that the attach succeeded before it opens
// anything in the namespace or runs any code, and checks the root is
// read-only first. When no prepared
// namespace is ready (the stock is being rebuilt) the spare enters its
// job's namespace at the job, as above. So a mount job's path holds one
// round trip to the mounter (the attach, overlapping the spare's own
// confinement) and no setns, capability drop or seccomp filter. The
// mounter rebuilds its stock at nice 10, and at the normal priority once
// a request waits for it. See SECURITY.md ("Leased namespaces").
//
// A pool whose mount jobs repeat their mounts (two jobs in a row with
// the same part: mounts, grants, overlay sizes) skips even that: it has
// the mounter attach the part ahead, with a fresh scratch directory, and
// the ready ns spare enters such a namespace instead of a lease. A job
// whose sources are the very objects the namespace shows (device, inode
// and unique mount id, the same paths and modes) and before which no
// mount changed in the pool's mount namespace runs in it as it is, its
// scratch directory the namespace's; any other job in that spare has the
// mounter replace the part with its own first. A one-shot job's
// namespace without overlays is taken back once the job's process is
// reaped, its scratch directory emptied, for the next job asking for
// the same part. The pool stops after 30 s without mount jobs. See
// SECURITY.md ("Namespaces attached ahead, and taken back").
//
// The part of that tree no request changes (the runtime and system
// paths, the devices, /proc, the host's links, the working directory) is
// the pool's base, computed once: at the first job that needs a
// namespace the pool hands it to the mounter, which from then on keeps a
// few namespaces built from it ready (one per worker, at least two, each
// rebuilt in the background after it is taken). A job's request then
// only attaches its own part (grants, scratch, mounts) to one of them:
// clones of its sources moved into the prepared namespace with setns and
// move_mount, the root then made read-only, no fork on the request's
// path. These mounts are not locked to the namespace as the base's are;
// the job's dropped capabilities and its seccomp layer keep it from
// unmounting or remounting them (see SECURITY.md). A pool whose jobs never
// use mounts prepares nothing.
//
// A pool that confines itself (Config.ConfineSelf, on in `pynox pool`)
// starts its mounter before it does (a confined process can never mount),
// and makes a detached tmpfs whose root gets a rule of its own domain:
// every job namespace's root is a clone of that tmpfs. Landlock matches
// rules along the path walk, which in a job's namespace goes from a
// bound host directory up to the namespace's root, skipping the host
// directory's ancestors (the ceiling's rule) and the mountpoints; without
// that rule the pool's domain would deny the job its own mounts. The
// namespace holds only what the domain allows anyway, read-only where it
// does not allow writes, so the rule adds nothing the domain denied.
//
// The pool refuses with SandboxSetupError, naming what is missing, before
// anything runs and never with something weaker in its place: a virtual
// path or an overlay where it does not run as root, user namespaces are
// disabled, the kernel has no overlayfs, or the mounter could not start
// or build its probe namespace; and any WriteBytesLimit on a read-write mount
// (bounding writes to a host directory takes file system project
// quotas). [Pool.Mounts] (the ready event's "mounts") says what the pool
// enforces; each result's policy lists the job's mounts, with their
// paths, modes and limits, and its scratch directory.
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
// Without a configured ceiling, a request may read only beneath the pool's
// working directory and write nowhere, has no network, and gets (at most)
// a 30s timeout, 1 GiB of memory, 1 MiB of each output stream and files of
// 256 MiB each. Writing needs a write ceiling the operator names
// (Limits.AllowWrite, [pool.limits] allow_write, pynox pool
// --allow-write): the working directory often holds the pool's binary and
// configuration, and a default that let jobs write there let a job
// replace the program the operator starts next, as root. Write grants
// never cover those files, even beneath an explicit ceiling.
//
// max_file_size bounds each file a job writes (RLIMIT_FSIZE), not their
// total: a job may fill whatever its write grants reach with many files.
// Give jobs write grants on a file system (or quota) whose filling harms
// nothing else.
//
// memory is the job's allowance on top of the template it was forked from:
// the job's RLIMIT_AS is set to the address space it already has at
// hand-over plus the allowance, so preloaded pandas does not eat a small
// allowance. (That address space is the template's, measured once when it
// is ready: a spare maps nothing of its own before its job, and reading its
// own would cost each one page faults; a spare that rehearses the job path
// while the machine idles measures its own again.) An allocation beyond it raises MemoryError, whose hint names
// the limit and how far the ceiling allows raising it.
//
// RLIMIT_AS counts mappings only, and RLIMIT_NPROC does not apply to uid
// 0, so where the machine has them each job (and each session's process)
// also runs in a control group of its own ([Config.Cgroups]; package
// internal/cgroup): cgroup v2 when the pool's own cgroup is delegated to
// it, else cgroup v1's pids and memory hierarchies. The pool creates them
// only beneath its own cgroup (pynox-<pid>-<random>/j<n>), moves each
// spare into its cgroup when the spare reaches Go, before any job can
// (no mkdir on a job's path); once the process has exited, its cgroup
// serves a later spare if the process left nothing in it (no task, no
// tmpfs or memfd pages), else it is removed. [Pool.Close] removes them
// all; the next pool removes those of a pool that was killed. The cgroup allows Limits.Threads tasks
// (pids.max, default 64: a thread beyond fails with EAGAIN) and memory up
// to the job's allowance plus the template's anonymous memory (what the
// job can copy of the pages it shares with the template) plus 32 MiB for
// the kernel's share; memfd and tmpfs pages, pipe and socket buffers all
// count. A job over it is killed by the kernel (a fallocate on a memfd
// does not fail: the kernel's OOM killer runs), and its result is a
// MemoryError that names the limit, told apart from other SIGKILLs by
// the cgroup's OOM-kill counter. The backend ("v2", "v1" or "none") is in
// the ready event and every result's policy; "require" refuses to start
// without one.
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
// (the template died, or the job broke its control protocol). A job's
// exception class named like one of those is reported module-qualified
// ("builtins.TimeoutError", "__main__.RequestError").
// [Result.Err] turns it into an [*Error] for errors.Is against [ErrTimeout]
// and the other sentinels. Inline code is named [DefaultName] ("<code>") in
// tracebacks unless the request names it.
//
// A job can lie only about itself: once its code runs it can write any
// frame to its own control channel, but the pool accepts from it nothing
// but its own "done" (validated, size-bounded), and a malformed frame gets
// it killed with PoolWorkerError.
//
// Result.Usage ([Usage]) is the job's CPU time, peak RSS, minor faults
// and wall time as the kernel counted them, never as the job reports
// them: a one-shot job's are its process's rusage, which the template
// reads with wait4 when it reaps it (so the pool waits for that report,
// which follows the job's end at once, before answering), less its
// counters at the hand-over (or, when the job reported its end, what
// /proc/<pid>/stat and status say then: the pool opens those two files
// once before the hand-over and reads them again with pread, so a read
// after the process is gone fails instead of reading another process
// that took its pid); a session
// step's are what the process's counters in /proc (CPU clock, minflt,
// VmHWM), read by the pool through the pidfd's pid while the process is
// stopped, grew by during the step (those read after one step are the
// next one's starting point, unless a dump ran between them), its peak
// RSS reset (clear_refs) before each step. Stats.CPUMSTotal and the JSON log's cpu_ms add them
// up.
//
// Result.Files ([File]) are the files a job left that [Job.Collect] (or
// [Step.Collect]) names with glob patterns beneath its write grants or
// its scratch directory ("$TMPDIR/…"), and every regular file directly in
// its $PYNOX_OUTPUTS directory ([OutputsDir] in its scratch directory).
// The pool reads them itself, so it reads only what the job could read:
// it walks from descriptors it opened, with openat2 and
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (no link the job planted is
// followed), reads only regular files with a single link (a hard link may
// name a file the job could not read) through a descriptor of the inode
// it checked, never opens a FIFO for reading, and reads at most
// [MaxFiles] files and [MaxFilesBytes] bytes per result; beyond that the
// files are listed with Skipped set and FilesTruncated, never killed.
//
// # Sessions
//
// [Pool.Checkout] starts a session; its first [Checkout.Feed] forks the
// session's process from one of the pool's warm templates, as a job's is
// (never a second interpreter start, and the preloads are the template's,
// already imported), and confines it exactly as a job — the session's
// grants, limits and seccomp filter — before the step's code runs. It
// takes the template's ready spare when there is one, and the template
// forks that spare's replacement once the first step has answered (as
// after a job), or at once when a job needs a spare first or already
// waits for the one the session took; otherwise the
// template forks one for the session alone. A session never takes a
// worker: one-shot jobs and sessions share the CPUs and nothing else, and
// a job waits for a session's step no more than for a fork. The checkout's
// job fixes permissions, limits, environment and host functions; each
// [Step] brings code, name, args and optionally a timeout and output cap
// within the ceiling. Steps run in order in the same __main__. A Python
// exception leaves the process alive; an exit, a timeout, a crash, a
// MemoryError or a broken protocol ends it (Result.SessionEnded), and the
// next Feed forks a new one, whose first result has Result.Restarted set.
// A session's process belongs to its template's PID namespace and dies
// with it: when a template dies (or is killed) between two steps, the pool
// replaces it for its jobs, and the session's next step runs in a
// replacement process and says so (Restarted, step 1, empty __main__); a
// step under way then ends with SessionEnded. Config.MaxSessions caps open
// checkouts: beyond it Checkout waits up to Config.CheckoutTimeout (zero:
// not at all), in order of arrival, for a Finish to free a slot, then
// fails with [ErrExhausted]; `pynox pool` never waits.
// Config.SessionIdle closes an idle one, and [Pool.Close] ends them all;
// [Checkout.Done] is closed when a checkout has ended and [Checkout.Err]
// says why.
//
// [Checkout.Interrupt] stops a running step as Ctrl-C does: the pool sends
// the process SIGINT, whose handler (the runner's) raises
// KeyboardInterrupt only while the step's own code runs on the main
// thread; in the runner's own code (taking the step, reporting it) the
// signal is held and dropped when the step has ended, and during a host
// call it is raised once the call's answer is in, so the control channel
// stays in step. The session keeps its process and globals. A step that
// has not ended worker.InterruptGrace (2 s) later — it caught the
// exception, ignored SIGINT, or is blocked in C code — is killed
// (Result.SessionEnded). A ctx that ends while Feed or Resume waits for a
// running step interrupts it the same way.
//
// A checkout's turns are sequential: Feed and Resume wait for the one in
// progress, and their ctx bounds that wait. [Checkout.Finish] kills a
// step that is running and returns once the session's processes are gone;
// of concurrent Finish calls exactly one returns nil. Once a checkout has
// ended, every call on it — and a call in flight when it ended — returns
// why: [ErrFinished] when its caller finished it or it was idle,
// [ErrClosed] when the pool was closed. A host call surfaced as a
// [TurnEvent] is answered by its [Call.ID]; an answer naming another call
// (a duplicate, or a late one) is refused with [ErrProtocol] and never
// reaches the call that waits.
//
// # Dumping and restoring a session
//
// [Checkout.Dump] returns a session's state as bytes ([Dump]): the
// globals of its __main__ that pickle (modules by name, functions defined
// in the session by value; what does not pickle is named in
// Dump.Skipped, never a failure) and its step count. [Pool.Restore]
// starts a session whose first process loads such a dump before its first
// step. Both sides run in the session's own confined process — the dump
// between steps, as a frame the process answers like a step, its pickle
// coming back on a pipe of its own; the restore as the first thing its
// first step does, from a sealed memfd — so the pool only moves bytes and
// never unpickles one: a tampered dump is code run with the restoring
// session's grants and limits, nothing more. A dump is at most
// [MaxDumpSize] (64 MiB), and a dumped session goes on as before. With
// Config.SessionIdleDump the pool keeps an idle session this way (a file
// in that directory, outside every grant) instead of closing it, and
// restores it at its next Feed (Result.Restored). Config.EvictIdle lets
// a new checkout in at Config.MaxSessions by finishing the least recently
// used idle one.
//
// # Streamed output
//
// [Job.OnOutput] and [Step.OnOutput] receive a job's stdout and stderr
// while it runs, for an agent that shows a long cell's progress (the pool
// protocol's "stream": true). The pool reads each pipe on a goroutine of
// its own and makes one call per read (at most [MaxOutputChunk] bytes,
// small writes coalesced over 5 ms), one call at a time, as valid UTF-8.
// The callback runs on the reader: until it returns, that pipe is not
// read, so a slow consumer fills the kernel's pipe and blocks the job's
// writes — back-pressure, not buffering. Per job the pool holds at most
// one chunk per stream beyond the MaxOutput bytes the Result keeps. Every
// call returns before the turn's result is returned (the result waits for
// the readers), and none comes after it. The stream carries all the
// output; MaxOutput bounds only the Result.
//
// # Closing
//
// [Pool.Close] ends everything at once: running jobs are killed and their
// Run calls, like those waiting for a worker, return [ErrClosed]; every
// checkout ends as above. [Pool.Shutdown] is the graceful way: it refuses
// new work at once, waits for the jobs and session steps under way until
// its ctx ends, and then closes. A Pool must come from [New]: the zero
// value runs nothing, and its methods return a KindClosed error at once.
//
// Between steps the pool stops the process (SIGSTOP through its pidfd,
// from the moment it reports its step, before its output is drained; a
// warm checkout's process, forked from a pool template, is stopped just
// the same) and resumes it for the next step (SIGCONT), so threads it started burn
// no CPU and write nothing while nobody waits on it; descriptors 1 and 2
// point at /dev/null then, and a host call from such a thread belongs to
// the step that is running. A frame found on the control channel when a
// step begins was forged (the runner holds its channel between steps) and
// ends the session. Idle means that no thread of the process runs between
// steps: the runner blocking in its read of the next step would hold its
// main thread only, while threads the code started ran on. Measured on a
// 2-vCPU machine, leaving the stop and the resume out saved no CPU per
// step beyond the noise and at most half a context switch (issue 12), so
// both stay. Its hard RLIMIT_CPU is the CPU time of its whole
// life (an hour, internal/worker.SessionCPU), set before its code runs:
// neither the process nor, without CAP_SYS_RESOURCE, the pool could raise
// a per-step one again. Each step is held to its own CPU time (its timeout
// + 2s, all threads together) by the pool, which reads the process's CPU
// clock while the step runs and kills it past that (TimeoutError); the
// soft limit, renewed at each step, sends SIGXCPU at least a second
// earlier. Its memory limit is fixed at creation. The pool protocol's named sessions
// (`"session": "name"`) are checkouts that jsonl.Serve keeps by name, with
// a queue of at most jsonl.MaxPendingSteps requests each.
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
// name that was not declared, too many calls, too large arguments, or
// arguments not every client can decode (invalid UTF-8, nested deeper than
// 256 levels, a number longer than 4,300 characters) get an error the job
// sees as HostError and the host never sees; a call beyond [MaxInFlight]
// in flight is refused too, and a malformed one, one reusing the id of a
// call in flight, or a report while calls are in flight is a protocol
// break (PoolWorkerError). A HostFunc's ctx carries the values of the ctx
// given to Run or Feed and ends with it, or at the job's (step's)
// deadline; an answer that comes at or after the deadline is not passed
// on: the job ends with TimeoutError. A HostFunc
// that panics fails only its call: the job sees HostError with a generic
// message, and the panic and its stack go to Config.Logger at level Error
// (as net/http recovers a handler's panic).
//
// A host function raises a builtin exception type in the job by returning
// [RaiseAs] (Checkout.Resume: [RaiseError]): the job sees a class named
// like the builtin, deriving from it and from pynox_host.HostError, made
// inside the sandbox from the fixed list [HostErrorTypes] (monty-pool's
// ResumeValue::Error). A type name is never evaluated.
//
// Each declared function f also has an awaitable form, pynox_host.aio.f:
// calls awaited together (asyncio.gather) are in flight together, up to
// [MaxInFlight] per job (a further call waits in the job for a free
// slot), and so are sync calls from several threads. Each call frame
// carries an id the reply names, so replies come back in any order. With
// Job.Host set, a job's calls run concurrently, each on a goroutine of its
// own; driving a checkout by hand, a [TurnEvent] lists every call waiting
// (Calls), [Checkout.Resume] answers them by id in any order, and
// [Checkout.Wait] waits for the next one (monty-pool's ResolveFutures). A
// step reports only when every call it made is answered: an await that
// was cancelled still has its reply read, and dropped.
//
// Job.Tools declares host functions with a docstring and a signature
// ([Tool]): the pool parses the signature with a strict grammar
// ([ParseSignature], nothing evaluated), the sandboxed function carries
// it as __doc__ and __signature__, and a call that does not fit it is a
// TypeError in the job, checked by the job's pynox_host and again by the
// pool, before the host sees it.
//
// # Inputs and values
//
// Job.Inputs and Step.Inputs pass JSON values in: the pool checks the
// names (ASCII Python identifiers, not keywords nor dunder names) and
// encodes the values once (at most [MaxInputsBytes], held to the checks of
// host-call arguments), and the runner sets them in __main__ before the
// code runs; in a session they stay, like assignments. The runner compiles
// the code from its syntax tree with the last statement apart when it is
// an expression, executes the rest and evaluates that expression in the
// same globals, so line numbers and tracebacks are those of the whole.
// A value that is not None is encoded in the job's own process, on its
// time and memory: as JSON when json.dumps encodes it within
// [MaxValueBytes] and every client reads it back the same (no repeated
// keys, no lone surrogates, at most 256 levels, numbers of at most 4,300
// characters), else as its repr cut to [MaxValueReprBytes]. The pool
// evaluates nothing: it passes on a report only when it is one the runner
// could have made (valid JSON within those bounds and checks, or a repr
// within its bound, never both), and ends a job that reports anything
// else with PoolWorkerError (a session's process with it).
//
// # Rich outputs
//
// A job's rich outputs (Result.Outputs: matplotlib figures as PNG, objects
// shown with pynox_display.display by their IPython-style _repr_*_
// methods, the HTML table of a DataFrame that is the last expression's
// value) are made inside its sandboxed process by the runner, which sends
// each as a "display" frame on the control channel, like a host call:
// under the runner's channel lock, never cut by an interrupt, a frame
// larger than the socket's buffer as its header and the rest. matplotlib
// gets the backend module://pynox_mpl (MPLBACKEND, set in the template's
// environment; the module is found by a finder last on sys.meta_path, so
// no other import pays for it): Agg, whose show() turns the open figures
// into outputs and closes them; the figures still open at the end of the
// code are shown the same way. The pool treats each frame as untrusted:
// it passes an output on (to Job.OnDisplay or Step.OnDisplay, from a
// goroutine of the turn with a queue of MaxOutputs, and into the Result)
// only when its MIME type is on the allow list ([OutputMIMETypes]), its
// data valid UTF-8, binary data valid base64 of bytes that start with
// the type's signature, JSON valid JSON, and it fits [MaxOutputBytes],
// [MaxOutputs] and [MaxOutputsBytes]. Anything else is dropped, counted in
// Result.OutputsDropped with a text/plain marker ending Outputs; honest
// code past the bounds is never killed (the runner sends a short
// "dropped" notice instead of data beyond them). A frame larger than the
// control channel's frame bound, or for another step than the running
// one, is a protocol violation like any other (PoolWorkerError).
//
// # Metrics
//
// [Pool.Collector] returns a prometheus.Collector (client_golang) of the
// pool's metrics, named pynox_*: jobs by outcome and error type, run and
// queue time histograms, sessions, session steps, host calls and their
// latency, template restarts, spares ready, busy workers and queues (the
// README's Metrics section lists them). The library registers nothing
// globally: an embedder registers the collector in a registry of its own
// (`pynox serve` serves its own at /metrics). The collector reads, at
// scrape time, the counters [Pool.Stats] reads, so the two agree; the job
// path keeps them under the lock Stats already took, and the other
// counters are atomic adds, without allocation. The error_type label
// names Python's builtin exceptions and pynox's error types only; a job's
// own exception classes count as "other", so that jobs cannot grow the
// label set.
//
// # Traces
//
// The pool makes an OpenTelemetry span per job (SpanJob), per session step
// (SpanSessionStep, from Feed to the step's result, across the Resume
// calls in between) and per host call (SpanHostCall, a child of its job's
// or step's span, from the call to its answer; a HostFunc's ctx carries
// it, so the host's own spans are its children). A job's or step's span is
// a child of the span in the ctx given to Run or Feed — a remote parent
// too, as `pynox pool` makes one of a request's W3C "traceparent". Spans
// carry identifiers and the outcome only (AttrID, AttrSession, AttrStep,
// AttrOutcome, AttrErrorType, AttrExitCode, AttrFunction); a failure sets
// the status to Error described by the error type alone, since an
// exception's message may quote the job's data. No span carries code,
// inputs, arguments, results or output.
//
// The library depends on the OpenTelemetry API only (go.opentelemetry.io/
// otel/trace), never on the SDK: Config.TracerProvider supplies the
// provider, and nil means the program's global one
// (otel.GetTracerProvider), the OpenTelemetry convention for
// instrumented libraries. Until the program installs a provider that is
// a no-op: each job, step and host call costs one no-op Start and End
// (no attribute is built for a span that does not record), next to the
// fork and the confinement of a job. A job's log record (Config.Logger)
// carries trace_id whenever its span or its ctx has a trace: with the
// no-op provider, a remote parent's trace id still reaches the log.
// `pynox pool` and `pynox serve` install the SDK with the OTLP/HTTP
// exporter only when OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, flush it at exit, and let
// the pool's own Landlock domain connect to the endpoint's port
// (Config.ConfineSelfConnectTCP): Landlock's TCP rules name a port, not an
// address, so code that escaped a job into a template could reach that
// port on any host; the jobs' own domains still deny every connect.
//
// # Remote pools
//
// jsonl.Dial(ctx, "ws://HOST:PORT/v1/pool", jsonl.DialOptions{Token: …})
// returns a *Pool whose work runs on a `pynox serve` server, over its
// WebSocket, instead of in this process: Run, Checkout (Feed, Resume,
// Wait, Interrupt, Dump, Finish, Done, Err), Restore, host functions
// (Job.Host, Step.Host, or calls surfaced as TurnEvents), OnOutput and
// OnDisplay, Inputs and Result.Value, Stats, Close and Shutdown behave as
// a local pool's and return the same Result and *Error values (the
// protocol's error types map to the same kinds; a job's own exception
// named like a pool error type arrives qualified, as it is locally).
// [Pool.IsRemote] tells the two apart. The constructor lives in package
// jsonl, not here, because the pool protocol's one Go client, jsonl.Client,
// lives there (jsonl imports this package) and carries a remote pool's
// lines; a local pool's users do not link a WebSocket client, and a
// remote pool has none of [Config]'s settings, which are the server's.
//
// A connection that ends under work in flight fails that work with
// [KindDisconnected] ([ErrDisconnected]): a job may or may not have run,
// and its result is lost. The server's sessions belong to their
// connection, so every Checkout of that connection ends with
// ErrDisconnected (Done is closed, Err and every later call return it),
// rather than going on in a fresh process as if nothing had happened: a
// caller must open a new Checkout and replay what the session held. The
// next Run, Checkout or Stats dials a new connection. A keepalive (a stats
// request, jsonl.DialOptions.Keepalive) ends a connection whose server
// stopped answering.
//
// What a remote pool cannot do, or does differently: a Checkout's job is
// checked by the server at the first Feed (a job outside the ceiling
// fails there with KindRequest, and one beyond the server's max_sessions
// with KindExhausted, not at Checkout); a
// HostFunc's ctx ends with its call rather than with Feed's ctx; a
// Job.Script path is read on the server; [Pool.Config], [Pool.Python],
// [Pool.CgroupDirs] and [Checkout.Pid] describe nothing remote and return
// zero values, while [Pool.Workers], [Pool.Preloaded],
// [Pool.PIDNamespace], [Pool.Cgroups], [Pool.SelfConfinement] and
// [Pool.Mounts] come from the server's ready event; [Pool.Stats] is the
// server's, all its clients together (zero when the server cannot be
// asked: [Pool.StatsContext] says why); Config.Logger and
// Config.SessionIdleDump are the server's business; Shutdown ends this
// client's connection once its work is done, not the server.
//
// # Relation to monty-pool
//
// The Go API is modelled on the Rust monty-pool crate, mapped onto CPython:
//
//   - Pool, PoolConfig: [Pool] and [Config]. min/max_processes become
//     Config.Workers: every template is started eagerly and each job is a
//     fresh fork, so there is nothing to scale or recycle
//     (max_checkouts_per_worker has no purpose: no process ever serves two
//     jobs). checkout_timeout is the ctx passed to Run (and, for
//     checkouts, Config.CheckoutTimeout); request_timeout is
//     Job.Timeout, enforced from Go exactly as monty's parent-side deadline.
//   - PoolError kinds: [Kind]. Crashed is KindCrashed (PoolWorkerError),
//     Timeout KindTimeout, Runtime KindRuntime, Spawn KindSpawn,
//     Exhausted KindExhausted (Config.MaxSessions checkouts are open and
//     none was finished within Config.CheckoutTimeout), Finished
//     KindFinished, Protocol KindProtocol (caller misuse: Resume with no
//     call waiting, Feed while one waits; a child's protocol break is
//     KindCrashed); a closed pool is KindClosed; Disconnected is
//     KindDisconnected (a remote pool's connection ended under the call,
//     see Remote pools). A worker exceeding its
//     memory limit is a Python MemoryError, as in monty.
//   - Checkout, feed, resume, finish: [Checkout], [Checkout.Feed],
//     [Checkout.Resume], [Checkout.Finish]. ReplConfig becomes the [Job]
//     given to [Pool.Checkout] (script name: Step.Name; limits: the job's
//     timeout and memory). Unlike monty, a Feed whose ctx ends interrupts
//     the step (KeyboardInterrupt) and keeps the process unless the step
//     outlives the 2 s grace; as in monty, a Python exception leaves the
//     session usable. Dropping a Checkout
//     without Finish leaves it to Config.SessionIdle.
//   - TurnEvent: [TurnEvent] with Call (FunctionCall) or Result
//     (Complete). OsCall, NameLookup and ResolveFutures do not apply: the
//     job's OS calls are real system calls confined by the kernel, names
//     are looked up by CPython itself, and host calls are synchronous
//     (no futures).
//   - resume, resume_futures: [Checkout.Resume] takes the answered call's
//     id with its value, as resume_futures pairs each value with its call
//     id, so that an answer cannot reach another call.
//   - ResumeValue: [Return] and [Raise] (Return and Error). Future,
//     NotFound and NotHandled do not apply: calls are synchronous, and
//     only declared names exist in pynox_host, so an undeclared one fails
//     in the job before it reaches the host.
//   - OnPrint streaming: Job.OnOutput and Step.OnOutput (see Streamed
//     output), captured at the descriptors (so C extensions' output is
//     included); the Result still carries the whole output, capped by
//     MaxOutput.
//   - MountSpec, MountSpecMode: [MountSpec] and [MountMode] on [Job.Mounts]
//     (see Scratch space and mounts). monty services file access from the
//     parent because its interpreter has no real OS; pynox runs real
//     CPython on the real file system, so a mount is a Landlock grant the
//     kernel enforces: ReadOnly and ReadWrite at the host path; virtual
//     paths, Overlay and write_bytes_limit through a mount namespace per
//     job built by the pool's mounter (see Scratch space and mounts).
//   - checkout_with_telemetry: Config.TracerProvider and the ctx given
//     to Run and Feed (see Traces).
//   - MontyTransport::Websocket: jsonl.Dial (see Remote pools).
//   - dump/restore: [Checkout.Dump] and [Pool.Restore] (see Dumping and
//     restoring a session): the session's globals pickled inside its own
//     sandbox, not the interpreter's whole state, which CPython cannot
//     serialise.
//   - install_dependencies, type checking: do not apply. Packages come
//     from the operator (preloads and package dirs) rather than from
//     jobs, CPython has no type checker to run before the code, and
//     logging goes to Config.Logger (a *slog.Logger).
package pynox
