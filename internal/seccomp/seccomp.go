//go:build linux

// Package seccomp builds the classic-BPF seccomp filter that confines a pynox
// job.
//
// The filter comes in two layers (see Layers), each installed with
// prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog) after
// no_new_privs is set: the long Template layer once by the template
// process, before its first fork, and the short Job layer by every spare it
// forks, which inherits the first. The Go side only produces the programs
// as data (see Program.Bytes); the Python side wraps those bytes in a
// struct sock_fprog and applies them. What follows is the policy of the
// two layers together.
//
// The policy is a deny list on top of a default of SECCOMP_RET_ALLOW. Unless
// stated otherwise a denied system call fails with EPERM
// (SECCOMP_RET_ERRNO|EPERM) so that Python sees an ordinary PermissionError:
//
//   - A system call made with a foreign audit architecture (for example i386
//     compat calls on amd64 or AArch32 calls on arm64) kills the whole process
//     (SECCOMP_RET_KILL_PROCESS), because the syscall numbers below would not
//     mean the same thing.
//   - On amd64 every x32 system call (nr >= __X32_SYSCALL_BIT) is denied, which
//     blocks the x32 aliases of every denied call wholesale.
//   - Process creation is denied: fork, vfork, execve, execveat and any clone
//     that does not create a thread (CLONE_THREAD clear) or that requests a new
//     namespace. clone3 fails with ENOSYS instead, so that the C library falls
//     back to clone, whose flags the filter can inspect. pidfd_open is
//     denied too. (The template, which forks and opens pidfds, has only the
//     first layer: clone, fork and pidfd_open are the job layer's.)
//   - socket is denied for every domain, unless Policy.AllowNetwork is set, in
//     which case AF_INET and AF_INET6 sockets are allowed. socketpair is always
//     allowed.
//   - ioctl is denied for the terminal injection commands TIOCSTI and
//     TIOCLINUX (comparing only the low 32 bits of the command, as the kernel
//     does).
//   - prlimit64 is only allowed on the calling process (pid 0) and
//     personality only as a query (0xffffffff).
//   - Changing a file's mode, owner, extended attributes or timestamps is
//     denied in every form (chmod, fchmod, fchmodat, the chown family, the
//     xattr setters, utimensat, utime, utimes, futimesat): Landlock does not
//     mediate metadata, and a job running as the files' owner could
//     otherwise change them on anything it may merely read — make a runtime
//     file setuid, say — through a read-only descriptor.
//   - setpriority (PRIO_PROCESS only), sched_setaffinity, sched_setscheduler,
//     sched_setparam and sched_setattr are only allowed on the calling
//     process, so a job cannot slow down other processes of its uid.
//   - A fixed list of system calls that could escape or weaken the sandbox,
//     inspect other processes, change credentials, file modes, ownership or
//     extended attributes, touch kernel state, mounts, namespaces, keys, BPF,
//     perf, io_uring or the clock is always denied.
//
// Every other system call is allowed; the filesystem view is restricted
// separately by Landlock.
package seccomp

import (
	"fmt"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"
)

// Policy selects the variant of the filter.
type Policy struct {
	// AllowNetwork, when true, allows socket() for the AF_INET and AF_INET6
	// domains only; when false socket() fails with EPERM for every domain.
	// socketpair() is always allowed.
	AllowNetwork bool
}

// Program is a classic BPF seccomp program, one unix.SockFilter per
// instruction.
type Program []unix.SockFilter

// Seccomp return actions, to be combined with 16 bits of data (for
// ActionErrno, the errno value).
const (
	// ActionKillProcess kills the whole process as if by an unblockable SIGSYS.
	ActionKillProcess uint32 = unix.SECCOMP_RET_KILL_PROCESS
	// ActionErrno makes the system call fail with the errno held in the low 16 bits.
	ActionErrno uint32 = unix.SECCOMP_RET_ERRNO
	// ActionAllow lets the system call run normally.
	ActionAllow uint32 = unix.SECCOMP_RET_ALLOW
)

// x32SyscallBit is __X32_SYSCALL_BIT from arch/x86/include/uapi/asm/unistd.h.
const x32SyscallBit = 0x40000000

// cloneNamespaceFlags are the clone flags that create a new namespace.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWTIME

// Offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offIP   = 8
	offArgs = 16
)

const (
	retKill   = ActionKillProcess
	retAllow  = ActionAllow
	retEPERM  = ActionErrno | uint32(unix.EPERM)
	retENOSYS = ActionErrno | uint32(unix.ENOSYS)
)

// sysEntry names one system call number of an architecture.
type sysEntry struct {
	name string
	nr   uint32
}

// archTable holds everything architecture specific about the policy.
type archTable struct {
	goarch    string
	auditArch uint32
	auditName string
	x32       bool // deny the x32 ABI (nr >= __X32_SYSCALL_BIT)

	// System calls with argument-dependent rules.
	clone, clone3, socket, ioctl, prlimit64, personality uint32

	// jobDeny lists the system calls that only the job layer denies (with
	// EPERM): the template itself needs them.
	jobDeny []sysEntry

	// deny lists the system calls that always fail with EPERM.
	deny []sysEntry
}

// special returns the argument-dependent system calls with their names.
func (t *archTable) special() []sysEntry {
	return []sysEntry{
		{"clone", t.clone},
		{"clone3", t.clone3},
		{"socket", t.socket},
		{"ioctl", t.ioctl},
		{"prlimit64", t.prlimit64},
		{"personality", t.personality},
	}
}

// sharedDeny lists denied system calls whose numbers every supported
// architecture has under the same name; each table appends them.
var sharedDeny = []sysEntry{
	// System V IPC and POSIX message queues live outside the filesystem
	// Landlock sees; a job could reach other processes' segments (same uid)
	// or leave state behind for the next job.
	{"shmget", unix.SYS_SHMGET},
	{"shmat", unix.SYS_SHMAT},
	{"shmctl", unix.SYS_SHMCTL},
	{"shmdt", unix.SYS_SHMDT},
	{"msgget", unix.SYS_MSGGET},
	{"msgsnd", unix.SYS_MSGSND},
	{"msgrcv", unix.SYS_MSGRCV},
	{"msgctl", unix.SYS_MSGCTL},
	{"semget", unix.SYS_SEMGET},
	{"semop", unix.SYS_SEMOP},
	{"semtimedop", unix.SYS_SEMTIMEDOP},
	{"semctl", unix.SYS_SEMCTL},
	{"mq_open", unix.SYS_MQ_OPEN},
	{"mq_unlink", unix.SYS_MQ_UNLINK},
	{"mq_timedsend", unix.SYS_MQ_TIMEDSEND},
	{"mq_timedreceive", unix.SYS_MQ_TIMEDRECEIVE},
	{"mq_notify", unix.SYS_MQ_NOTIFY},
	{"mq_getsetattr", unix.SYS_MQ_GETSETATTR},
	// I/O priority of other processes (or of every process of the uid).
	{"ioprio_set", unix.SYS_IOPRIO_SET},
	// inotify is not mediated by Landlock: a job could watch any directory
	// it cannot read, such as another job's write grant, and learn the
	// names of the files created there.
	{"inotify_init1", unix.SYS_INOTIFY_INIT1},
	{"inotify_add_watch", unix.SYS_INOTIFY_ADD_WATCH},
	{"fanotify_mark", unix.SYS_FANOTIFY_MARK},
}

// selfEntry is a system call allowed only on the calling process: every
// listed argument must be zero (all 64 bits).
type selfEntry struct {
	name string
	nr   uint32
	args []uint32
}

// selfOnly lists the scheduling calls a job may make on itself but not on
// other processes of its uid, which it could otherwise slow down.
// setpriority(which, who, prio) needs which == PRIO_PROCESS and who == 0:
// PRIO_USER with who 0 would renice every process of the uid.
func (t *archTable) selfOnly() []selfEntry {
	return []selfEntry{
		{"setpriority", unix.SYS_SETPRIORITY, []uint32{0, 1}},
		{"sched_setaffinity", unix.SYS_SCHED_SETAFFINITY, []uint32{0}},
		{"sched_setscheduler", unix.SYS_SCHED_SETSCHEDULER, []uint32{0}},
		{"sched_setparam", unix.SYS_SCHED_SETPARAM, []uint32{0}},
		{"sched_setattr", unix.SYS_SCHED_SETATTR, []uint32{0}},
	}
}

// syscallNames maps every system call number the policy mentions to its name.
func (t *archTable) syscallNames() map[uint32]string {
	m := make(map[uint32]string, len(t.deny)+16)
	for _, e := range t.selfOnly() {
		m[e.nr] = e.name
	}
	for _, e := range t.special() {
		m[e.nr] = e.name
	}
	for _, e := range slices.Concat(t.deny, t.jobDeny) {
		m[e.nr] = e.name
	}
	return m
}

// lookup returns the number of the named system call if the policy mentions it.
func (t *archTable) lookup(name string) (uint32, bool) {
	for _, e := range t.special() {
		if e.name == name {
			return e.nr, true
		}
	}
	for _, e := range slices.Concat(t.deny, t.jobDeny) {
		if e.name == name {
			return e.nr, true
		}
	}
	return 0, false
}

// tableFor returns the table for goarch, or an error naming the architecture
// if the policy does not support it.
func tableFor(goarch string) (*archTable, error) {
	if nativeTable == nil || nativeTable.goarch != goarch {
		return nil, fmt.Errorf("seccomp: unsupported architecture %q", goarch)
	}
	return nativeTable, nil
}

// Layers is the filter as the pool installs it: two programs, each
// attached with its own prctl. The kernel runs every filter a process has
// and the most restrictive answer wins (Layers.Run does the same), so a
// spare confined by both gets exactly the policy the package documents.
//
// Attaching a filter costs the kernel time in proportion to its length (it
// converts and JIT-compiles the program, and runs it once for every
// system call number to build its per-syscall action cache). The template
// therefore attaches the long, policy-independent layer once, before its
// first fork, and every spare inherits it; each spare attaches only the
// short job layer.
type Layers struct {
	// Template is everything that the template process itself may live
	// under: the architecture checks, the x32 ABI, clone3, socket domains
	// other than AF_INET and AF_INET6, ioctl, prlimit64, personality, the
	// scheduling calls and the fixed deny list (vfork, execve and
	// execveat included).
	Template Program
	// Job is what only a job is denied: clone unless it creates a thread
	// in no new namespace, fork (amd64), pidfd_open and, without
	// AllowNetwork, every socket.
	Job Program
}

// Run returns the action the kernel takes for d under both layers: each
// program runs, and the answer whose action (the high 16 bits, compared as
// a signed number, so that SECCOMP_RET_KILL_PROCESS is the most
// restrictive) is lowest wins; of two equal actions, the newer layer's
// (Job's) answer is kept, as kernel/seccomp.c's seccomp_run_filters does.
func (l Layers) Run(d Data) (uint32, error) {
	ret := ActionAllow
	for _, p := range []Program{l.Job, l.Template} { // newest first
		r, err := p.Run(d)
		if err != nil {
			return 0, err
		}
		if actionOnly(r) < actionOnly(ret) {
			ret = r
		}
	}
	return ret, nil
}

// actionOnly is the kernel's ACTION_ONLY: the action bits as a signed value.
func actionOnly(r uint32) int32 { return int32(r & unix.SECCOMP_RET_ACTION_FULL) }

// Build returns the filter for p on the running architecture; amd64 and arm64
// are supported.
func Build(p Policy) (Layers, error) {
	return buildFor(runtime.GOARCH, p)
}

// buildFor builds the filter for p on goarch.
func buildFor(goarch string, p Policy) (Layers, error) {
	t, err := tableFor(goarch)
	if err != nil {
		return Layers{}, err
	}
	return build(t, p)
}

// maxChunk bounds how many consecutive JEQs share one RET, keeping every
// conditional jump offset within the 8-bit jt/jf fields.
const maxChunk = 200

func build(t *archTable, p Policy) (Layers, error) {
	// Reject tables that would make one rule shadow another.
	seen := make(map[uint32]string)
	all := slices.Concat(t.special(), t.deny, t.jobDeny)
	for _, e := range t.selfOnly() {
		all = append(all, sysEntry{e.name, e.nr})
	}
	for _, e := range all {
		if prev, dup := seen[e.nr]; dup {
			return Layers{}, fmt.Errorf("seccomp: %s: syscall %d listed twice (%s, %s)", t.goarch, e.nr, prev, e.name)
		}
		if t.x32 && e.nr >= x32SyscallBit {
			return Layers{}, fmt.Errorf("seccomp: %s: syscall %s number %d has the x32 bit", t.goarch, e.name, e.nr)
		}
		seen[e.nr] = e.name
	}
	tpl, err := buildTemplate(t)
	if err != nil {
		return Layers{}, err
	}
	job, err := buildJob(t, p)
	if err != nil {
		return Layers{}, err
	}
	return Layers{Template: tpl, Job: job}, nil
}

// archCheck emits: kill the process unless the audit architecture is the
// native one, then load the system call number.
func (b *asm) archCheck(t *archTable) {
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch)
	b.jeq(t.auditArch, 1, 0)
	b.ret(retKill)
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr)
}

// buildJob builds the short layer each spare attaches.
func buildJob(t *archTable, p Policy) (Program, error) {
	var b asm
	// The numbers below mean what they say only for the native
	// architecture (the template layer kills any other anyway).
	b.archCheck(t)

	// clone: only a thread (CLONE_THREAD set) in no new namespace.
	{
		skip, deny := b.label(), b.label()
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, t.clone, next, skip)
		b.loadArgLo(0)
		b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, unix.CLONE_THREAD, next, deny)
		b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, cloneNamespaceFlags, deny, next)
		b.ret(retAllow)
		b.bind(deny)
		b.ret(retEPERM)
		b.bind(skip)
	}
	// What the template needs and a job may not have, and socket without
	// the network.
	for _, e := range t.jobDeny {
		b.jeq(e.nr, 0, 1)
		b.ret(retEPERM)
	}
	if !p.AllowNetwork {
		b.jeq(t.socket, 0, 1)
		b.ret(retEPERM)
	}
	b.ret(retAllow)
	return b.finish()
}

// buildTemplate builds the long, policy-independent layer.
func buildTemplate(t *archTable) (Program, error) {
	var b asm

	// 1. Architecture and system call number.
	b.archCheck(t)

	// 2. The x32 ABI.
	if t.x32 {
		b.jump(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, x32SyscallBit, 0, 1)
		b.ret(retEPERM)
	}

	// 3. clone3 fails with ENOSYS, so that the C library falls back to
	// clone, whose flags the job layer can inspect (vfork, execve and
	// execveat are in t.deny, fork in t.jobDeny).
	b.jeq(t.clone3, 0, 1)
	b.ret(retENOSYS)

	// 4. socket(domain, ...): AF_INET and AF_INET6 at most (the job layer
	// denies those too without the network).
	{
		skip, allow := b.label(), b.label()
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, t.socket, next, skip)
		b.loadArgLo(0)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.AF_INET, allow, next)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.AF_INET6, allow, next)
		b.ret(retEPERM)
		b.bind(allow)
		b.ret(retAllow)
		b.bind(skip)
	}

	// 5. ioctl(fd, cmd, ...): the kernel truncates cmd to unsigned int.
	{
		skip, deny := b.label(), b.label()
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, t.ioctl, next, skip)
		b.loadArgLo(1)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.TIOCSTI, deny, next)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.TIOCLINUX, deny, next)
		b.ret(retAllow)
		b.bind(deny)
		b.ret(retEPERM)
		b.bind(skip)
	}

	// 6. prlimit64(pid, ...): only pid 0 (all 64 bits).
	b.argIsZero(t.prlimit64, 0)

	// 7. personality(persona): only the 0xffffffff query.
	{
		skip, deny := b.label(), b.label()
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, t.personality, next, skip)
		b.loadArgLo(0)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0xffffffff, next, deny)
		b.ret(retAllow)
		b.bind(deny)
		b.ret(retEPERM)
		b.bind(skip)
	}

	// 8. Scheduling calls only on the calling process.
	for _, e := range t.selfOnly() {
		b.argsAreZero(e.nr, e.args...)
	}

	// 9. The fixed deny list, in chunks sharing one RET ERRNO|EPERM each.
	for start := 0; start < len(t.deny); start += maxChunk {
		end := min(start+maxChunk, len(t.deny))
		deny := b.label()
		for _, e := range t.deny[start:end] {
			b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, e.nr, deny, next)
		}
		if end == len(t.deny) {
			b.ret(retAllow)
			b.bind(deny)
			b.ret(retEPERM)
			return b.finish()
		}
		after := b.label()
		b.ja(after)
		b.bind(deny)
		b.ret(retEPERM)
		b.bind(after)
	}
	b.ret(retAllow)
	return b.finish()
}

// label is a forward jump target inside an asm; next is the instruction
// immediately following the jump.
type label int

const next label = -1

type fixup struct {
	pc    int
	l     label
	field byte // 't', 'f' or 'k'
}

// asm is a tiny assembler for forward-only classic BPF with symbolic labels.
type asm struct {
	prog   Program
	labels []int // label -> pc, -1 while unbound
	fixups []fixup
}

func (b *asm) label() label {
	b.labels = append(b.labels, -1)
	return label(len(b.labels) - 1)
}

func (b *asm) bind(l label) { b.labels[l] = len(b.prog) }

func (b *asm) stmt(code uint16, k uint32) {
	b.prog = append(b.prog, unix.SockFilter{Code: code, K: k})
}

func (b *asm) ret(k uint32) { b.stmt(unix.BPF_RET|unix.BPF_K, k) }

func (b *asm) jump(code uint16, k uint32, jt, jf uint8) {
	b.prog = append(b.prog, unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k})
}

func (b *asm) jeq(k uint32, jt, jf uint8) { b.jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, k, jt, jf) }

func (b *asm) jumpL(code uint16, k uint32, jt, jf label) {
	pc := len(b.prog)
	b.jump(code, k, 0, 0)
	if jt != next {
		b.fixups = append(b.fixups, fixup{pc, jt, 't'})
	}
	if jf != next {
		b.fixups = append(b.fixups, fixup{pc, jf, 'f'})
	}
}

func (b *asm) ja(l label) {
	b.fixups = append(b.fixups, fixup{len(b.prog), l, 'k'})
	b.stmt(unix.BPF_JMP|unix.BPF_JA, 0)
}

// loadArgLo loads the low 32 bits of args[i] (little endian).
func (b *asm) loadArgLo(i uint32) {
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArgs+8*i)
}

// loadArgHi loads the high 32 bits of args[i] (little endian).
func (b *asm) loadArgHi(i uint32) {
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArgs+8*i+4)
}

// argIsZero emits: if nr == sys { allow iff args[i] == 0 (all 64 bits), else EPERM }.
func (b *asm) argIsZero(sys, i uint32) { b.argsAreZero(sys, i) }

// argsAreZero emits: if nr == sys { allow iff every args[i] == 0 (all 64
// bits), else EPERM }.
func (b *asm) argsAreZero(sys uint32, idx ...uint32) {
	skip, deny := b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	for _, i := range idx {
		b.loadArgLo(i)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, next, deny)
		b.loadArgHi(i)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, next, deny)
	}
	b.ret(retAllow)
	b.bind(deny)
	b.ret(retEPERM)
	b.bind(skip)
}

// finish resolves the labels and checks the result with the same rules the
// kernel applies.
func (b *asm) finish() (Program, error) {
	for _, f := range b.fixups {
		target := b.labels[f.l]
		if target < 0 {
			return nil, fmt.Errorf("seccomp: internal error: unbound label %d at pc %d", f.l, f.pc)
		}
		off := target - f.pc - 1
		if off < 0 {
			return nil, fmt.Errorf("seccomp: internal error: backward jump at pc %d", f.pc)
		}
		ins := &b.prog[f.pc]
		switch f.field {
		case 't', 'f':
			if off > 255 {
				return nil, fmt.Errorf("seccomp: internal error: jump at pc %d too far (%d)", f.pc, off)
			}
			if f.field == 't' {
				ins.Jt = uint8(off)
			} else {
				ins.Jf = uint8(off)
			}
		case 'k':
			ins.K = uint32(off)
		}
	}
	if err := b.prog.validate(); err != nil {
		return nil, fmt.Errorf("seccomp: internal error: %w", err)
	}
	return b.prog, nil
}
