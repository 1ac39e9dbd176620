package pynox

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/worker"
	"golang.org/x/sync/errgroup"
)

// Pool runs jobs in confined children forked from warm CPython templates.
// It is safe for concurrent use. See the package docs for the process
// model. Make one with [New]: a Pool that New did not make (the zero
// value) runs nothing, and its methods return a KindClosed error at once.
type Pool struct {
	cfg    Config
	python string
	env    []string
	start  time.Time
	log    *slog.Logger
	tracer trace.Tracer // from Config.TracerProvider (trace.go)

	workers []*poolWorker
	idle    chan *poolWorker

	info worker.Info // from the first template: version, preloads, runtime paths
	self SelfConfinement

	cg *cgroup.Manager // the jobs' cgroups; its backend may be none

	// readCeiling is where requests may read: the ceiling's read paths and
	// its write paths (writing includes reading).
	readCeiling []string
	// own lists the pool's own files, which no write grant may cover.
	own []ownFile
	// scratch holds the jobs' and sessions' scratch directories.
	scratch *scratchRoot
	// system lists the system paths every job loads (see
	// protectedSystemPaths), which no write grant may cover either.
	system []string
	// ns starts and holds the mounter that builds the jobs' mount
	// namespaces (see nsmount.go).
	ns nsMounter

	mu       sync.Mutex
	closed   bool               // no new work is accepted (Shutdown or Close)
	steps    sync.WaitGroup     // checkout steps under way, Shutdown waits for them
	closing  chan struct{}      // closed by Close
	life     context.Context    // canceled by Close: running jobs are killed
	kill     context.CancelFunc // cancels life
	inflight sync.WaitGroup
	restarts sync.WaitGroup // replacements of dead templates under way
	watchers sync.WaitGroup // one watch goroutine per worker
	waiting  atomic.Int64   // Run calls waiting for a worker: a backlog

	stats statsCounters

	// For the metrics (metrics.go): session steps under way, host calls'
	// latencies, templates replaced and replacements that failed.
	stepsRunning            atomic.Int64
	hostCallTime            histogram
	templateRestarts        atomic.Int64
	templateRestartFailures atomic.Int64

	callSeq   atomic.Int64 // host calls, numbered pool-wide
	coMu      sync.Mutex
	checkouts map[*Checkout]struct{} // open sessions; at most cfg.MaxSessions
	coWait    checkoutQueue          // Checkout calls waiting for a slot; guarded by coMu

	spareTimeout time.Duration // for templates started from now on; zero means the default

	sessionSeq atomic.Uint64 // spreads sessions' processes over the templates

	dumps chan struct{} // a token per session dump in progress (dump.go)

	// remote, when set, runs the pool's work on a server (remote.go);
	// remoteInfo is what its ready event said.
	remote     remoteBackend
	remoteInfo remoteInfo
}

// poolWorker is one template and the job slot it serves.
type poolWorker struct {
	pool *Pool
	// cpus is the affinity its templates give themselves
	// (Config.PinCPUs); nil for none.
	cpus []int
	mu   sync.Mutex
	tpl  *worker.Template
	// live is tpl, for the metrics to read without waiting for mu (held
	// while a template starts).
	live atomic.Pointer[worker.Template]
}

// New validates cfg, starts its templates and waits until each has
// imported its preloads and passed its hygiene checks. It fails with a
// KindSpawn error when the interpreter cannot be found or a template
// refuses to start (a preload that fails, starts a thread, leaves a
// descriptor open or maps writable shared memory). When a setting is to blame (an invalid value, a path
// that does not exist, a preload that fails, cgroups or pid_namespace
// "require" unmet) the error's cause is a *[ConfigError] that names it by
// its configuration key; errors.As finds it.
func New(cfg Config) (*Pool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Message: "invalid config", Err: err}
	}
	own, err := ownFiles(cfg.Source)
	system := protectedSystemPaths()
	if err == nil {
		err = checkProfileGrants(cfg, own, system)
	}
	if err != nil {
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Message: "invalid config", Err: err}
	}
	python, err := FindPython(cfg.Python)
	if err != nil {
		var problem string
		switch {
		case cfg.Python == "" && errors.Is(err, exec.ErrNotFound):
			problem = "no python3 on PATH; name the interpreter with [pool] python (pynox pool --python)"
		case errors.Is(err, exec.ErrNotFound):
			problem = "not found on PATH; expected the path or command name of a CPython 3 interpreter"
		case errors.Is(err, fs.ErrNotExist):
			problem = "does not exist; expected the path or command name of a CPython 3 interpreter"
		default:
			problem = err.Error() + "; expected the path or command name of a CPython 3 interpreter"
		}
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(),
			Err: &ConfigError{Key: "pool.python", Value: cfg.Python, Problem: problem}}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cg, err := cgroup.NewManager(cfg.Cgroups, cfg.Limits.Threads)
	if err != nil {
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(),
			Err: &ConfigError{Key: "pool.cgroups", Value: cfg.Cgroups,
				Problem: err.Error() + `; "auto" runs jobs without per-job cgroups where the machine offers none`}}
	}
	p := &Pool{
		cg:      cg,
		cfg:     cfg,
		python:  python,
		env:     baseEnv(),
		start:   time.Now(),
		log:     log,
		tracer:  tracerOf(cfg.TracerProvider),
		idle:    make(chan *poolWorker, cfg.Workers),
		closing: make(chan struct{}),
		dumps:   make(chan struct{}, maxDumpsInFlight),

		checkouts: make(map[*Checkout]struct{}),

		readCeiling: append(append([]string(nil), cfg.Limits.AllowRead...), cfg.Limits.AllowWrite...),
		own:         own,
		system:      system,
	}
	p.life, p.kill = context.WithCancel(context.Background())
	if p.scratch, err = newScratchRoot(cfg.ScratchDir); err != nil {
		cg.Close()
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Err: &ConfigError{Key: "pool.scratch_dir", Value: cfg.ScratchDir,
			Problem: "cannot make the pool's scratch directory: " + err.Error() + "; expected a writable directory (empty means the system's temporary directory)"}}
	}
	// A pool that confines itself hands its scratch tmpfs to its mounter
	// (below): none without one, rather than one mounted and unmounted.
	if cg.Backend() != cgroup.None && (!cfg.ConfineSelf || len(p.ns.machineObstacles()) == 0) {
		p.scratch.mountOwn()
	}
	// The pool confines itself before the first template starts, so that
	// every template inherits its domain.
	if cfg.ConfineSelf {
		// Directories the pool itself keeps writing to once confined,
		// besides the write ceiling: those it makes its jobs' cgroups in
		// (they exist by now; a rule holds a directory, not a name).
		selfWritable := append(cg.WritableDirs(), p.scratch.path)
		if cfg.SessionIdleDump != "" {
			selfWritable = append(selfWritable, cfg.SessionIdleDump)
		}
		// The mounter of the jobs' mount namespaces must run outside the
		// domain, and the domain must hold a rule on their root.
		if len(p.ns.machineObstacles()) == 0 {
			p.ns.inodes = nsRootInodes(cfg.Workers, cfg.MaxSessions)
			p.ns.nSlots = nsSlots(cfg.Workers, cfg.MaxSessions)
			if p.scratch.mounted {
				p.ns.scratchPath, p.ns.scratchRoot = p.scratch.path, p.scratch.fd
			}
			p.ns.startEarly()
		}
		// Once confined, the pool cannot unmount its scratch tmpfs (its
		// Landlock domain refuses every change to the mount tree): the
		// mounter does it when the pool goes, or, when it could not take
		// it, the pool keeps the shared file system (SECURITY.md).
		if p.scratch.mounted && !p.ns.scratchTaken {
			p.scratch.unmountOwn()
		}
		if p.self, err = p.confineSelf(selfWritable); err != nil {
			p.ns.close()
			cg.Close()
			p.scratch.close()
			return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Err: &ConfigError{Key: "pool.confine_self", Value: "true",
				Problem: err.Error() + "; [pool] confine_self = false starts the pool unconfined (its jobs stay confined)"}}
		}
	} else {
		p.self = SelfConfinement{TCP: "allow", Signals: "allow", Reason: "not asked for (Config.ConfineSelf)"}
	}
	// Start the templates in parallel: with heavy preloads each takes a
	// noticeable fraction of a second.
	tpls := make([]*worker.Template, cfg.Workers)
	pins := pinPlan(cfg.PinCPUs, cfg.Workers)
	var g errgroup.Group
	for i := range tpls {
		g.Go(func() (err error) {
			tpls[i], err = worker.Start(p.templateOptions(pins[i]))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		for _, t := range tpls {
			if t != nil {
				t.Close()
			}
		}
		p.ns.close()
		cg.Close()
		p.scratch.close()
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Err: startError(cfg, err)}
	}
	p.info = tpls[0].Info()
	if err := checkIdleDumpRuntime(cfg, p.info.RuntimePaths); err != nil {
		for _, t := range tpls {
			t.Close()
		}
		p.ns.close()
		cg.Close()
		p.scratch.close()
		return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Message: "invalid config", Err: err}
	}
	for i, t := range tpls {
		if e := t.Info().PinErr; e != "" {
			p.log.Warn("template not pinned to its CPU", "cpus", pins[i], "err", e)
		}
		w := &poolWorker{pool: p, tpl: t, cpus: pins[i]}
		w.live.Store(t)
		p.workers = append(p.workers, w)
		p.idle <- w
		p.watchers.Add(1)
		go w.watch()
	}
	return p, nil
}

// watch replaces the worker's template as soon as it dies, so that an
// idle worker's next job does not wait for a template to start. A busy
// worker's job finds the replacement under way (or starts it) itself.
func (w *poolWorker) watch() {
	defer w.pool.watchers.Done()
	for {
		w.mu.Lock()
		tpl := w.tpl
		w.mu.Unlock()
		if tpl != nil {
			select {
			case <-tpl.Done():
			case <-w.pool.closing:
				return
			}
		} else {
			// The last replacement failed; try again after a pause.
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-w.pool.closing:
				t.Stop()
				return
			}
		}
		if _, err := w.template(); err != nil {
			if isDone(w.pool.closing) {
				return
			}
			w.pool.log.Error("replacing a dead template failed", "err", err)
		}
	}
}

// startError names the setting behind a template's failure to start,
// where one is: a preload that fails, or a PID namespace required and
// unavailable.
func startError(cfg Config, err error) error {
	var refused *worker.RefusedError
	if errors.As(err, &refused) && strings.HasPrefix(refused.Msg, "preload ") {
		mod, _, _ := strings.Cut(strings.TrimPrefix(refused.Msg, "preload "), " ")
		return &ConfigError{Key: "pool.preload", Value: mod,
			Problem: refused.Msg + "; expected a module the interpreter imports without error, leaving no thread running, no descriptor open and no writable shared memory mapped"}
	}
	if errors.Is(err, worker.ErrNoPIDNamespace) {
		return &ConfigError{Key: "pool.pid_namespace", Value: cfg.PIDNamespace,
			Problem: err.Error() + `; "auto" runs templates without one where the kernel refuses it`}
	}
	return err
}

func (p *Pool) templateOptions(cpus []int) worker.Options {
	return worker.Options{
		CPUs:         cpus,
		Python:       p.python,
		Dir:          p.cfg.Dir,
		Env:          p.env,
		Preload:      p.cfg.Preload,
		PackageDirs:  p.cfg.PackageDirs,
		PreloadTmp:   p.scratch.path,
		Network:      p.cfg.Limits.AllowNetwork,
		SpareTimeout: p.spareTimeout,
		PIDNamespace: p.cfg.PIDNamespace,
		Cgroups:      p.cg,
		Memory:       p.cfg.Limits.Memory,
		NSLease:      p.nsLease,
		OnStderr: func(line string) {
			p.log.Warn("template stderr", "line", line)
		},
	}
}

// baseEnv is the whole environment of templates and the base of every
// job's: nothing of the pool's own environment reaches them except the
// OpenBLAS settings some CPUs need to run numpy correctly.
func baseEnv() []string {
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"HOME=/nonexistent",
		"OPENBLAS_NUM_THREADS=1",
		"OMP_NUM_THREADS=1",
		"MKL_NUM_THREADS=1",
		"NUMEXPR_NUM_THREADS=1",
		"VECLIB_MAXIMUM_THREADS=1",
		"BLIS_NUM_THREADS=1",
	}
	for _, k := range []string{"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// Python returns the Python version the templates run, such as "3.11.2".
func (p *Pool) Python() string { return p.info.Python }

// Preloaded returns the modules every template imported.
func (p *Pool) Preloaded() []string { return append([]string(nil), p.info.Preloaded...) }

// PIDNamespace reports whether the templates run as PID 1 of PID
// namespaces of their own (Config.PIDNamespace), so that every job and
// session process dies with its template, whatever it does.
func (p *Pool) PIDNamespace() bool { return p.info.PIDNamespace }

// PinnedCPUs returns, per worker, the CPU its template and everything
// it forks are pinned to (Config.PinCPUs), or nil when the pool pins
// nothing: PinCPUs is false, the process may run on one CPU only, a
// running template's pinning failed (the kernel's refusal is logged),
// or the pool is remote.
func (p *Pool) PinnedCPUs() []int {
	var out []int
	for _, w := range p.workers {
		if len(w.cpus) != 1 {
			return nil
		}
		if t := w.live.Load(); t != nil && !slices.Equal(t.Info().CPUs, w.cpus) {
			return nil
		}
		out = append(out, w.cpus[0])
	}
	return out
}

// SelfConfinement says how the pool's own process is confined.
func (p *Pool) SelfConfinement() SelfConfinement { return p.self }

// Workers returns the number of templates.
func (p *Pool) Workers() int { return p.cfg.Workers }

// Config returns the configuration the pool runs with: the one given to
// [New], with its defaults filled in and its paths made absolute. The
// slices and maps are copies.
func (p *Pool) Config() Config {
	c := p.cfg
	c.Preload = slices.Clone(c.Preload)
	c.PackageDirs = slices.Clone(c.PackageDirs)
	c.Limits.AllowRead = slices.Clone(c.Limits.AllowRead)
	c.Limits.AllowWrite = slices.Clone(c.Limits.AllowWrite)
	if c.Profiles != nil {
		c.Profiles = make(map[string]Profile, len(p.cfg.Profiles))
		for n, pr := range p.cfg.Profiles {
			pr.AllowRead = slices.Clone(pr.AllowRead)
			pr.AllowWrite = slices.Clone(pr.AllowWrite)
			pr.PackageDirs = slices.Clone(pr.PackageDirs)
			pr.Env = maps.Clone(pr.Env)
			c.Profiles[n] = pr
		}
	}
	return c
}

// templatePIDs returns the process ids of the live templates, for the
// tests (stale as soon as it returns).
func (p *Pool) templatePIDs() []int {
	var pids []int
	for _, w := range p.workers {
		w.mu.Lock()
		if w.tpl != nil {
			select {
			case <-w.tpl.Done():
			default:
				pids = append(pids, w.tpl.Pid())
			}
		}
		w.mu.Unlock()
	}
	return pids
}

// template returns a live template, starting a replacement for one that
// died. The start is not bound to any caller's context: a warm template is
// shared, and one caller's cancellation must not waste it.
func (w *poolWorker) template() (*worker.Template, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tpl != nil {
		select {
		case <-w.tpl.Done():
			w.pool.log.Warn("template died; replacing it", "pid", w.tpl.Pid(), "cause", w.tpl.Err())
			w.tpl.Close()
			w.tpl = nil
			w.live.Store(nil)
		default:
			return w.tpl, nil
		}
	}
	if isDone(w.pool.closing) {
		return nil, errClosed()
	}
	t, err := worker.Start(w.pool.templateOptions(w.cpus))
	if err != nil {
		w.pool.templateRestartFailures.Add(1)
		return nil, err
	}
	if e := t.Info().PinErr; e != "" {
		w.pool.log.Warn("template not pinned to its CPU", "cpus", w.cpus, "err", e)
	}
	w.tpl = t
	w.live.Store(t)
	w.pool.templateRestarts.Add(1)
	return t, nil
}

func (p *Pool) acquire(ctx context.Context) (*poolWorker, error) {
	select {
	case w := <-p.idle:
		return w, nil
	default:
	}
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	select {
	case w := <-p.idle:
		return w, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.closing:
		return nil, errClosed()
	}
}

func (p *Pool) release(w *poolWorker) {
	w.mu.Lock()
	dead := w.tpl != nil && isDone(w.tpl.Done())
	w.mu.Unlock()
	if !dead {
		p.idle <- w
		return
	}
	// Replace a dead template before the worker serves again, off the
	// caller's path. Close waits for the replacement (or its refusal).
	p.restarts.Add(1)
	go func() {
		defer p.restarts.Done()
		_, _ = w.template()
		p.idle <- w
	}()
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Run runs one job and returns its result. Every outcome of the job
// itself — success, a Python exception, a non-zero exit, a request the
// ceiling refuses, a timeout, a crash — is a *Result with Result.Error
// describing any failure (see [Result.Err]). Run returns a nil Result and
// an error only when the job did not run to its end on its own account:
// ctx ended (ctx.Err(); a job running then is killed), or the pool was
// closed before or while it ran (ErrClosed; Close kills a running job).
func (p *Pool) Run(ctx context.Context, job Job) (*Result, error) {
	if p.remote != nil {
		return p.remote.Run(ctx, job)
	}
	res, refill, err := p.run(ctx, job)
	refill()
	return res, err
}

// maxSetupRetries bounds how many times a job goes to another spare
// because the one it was given died before running any of its code.
const maxSetupRetries = 2

// runJob is Run, but leaves the request for the next spare to the caller
// (refill, never nil), to make once the answer is delivered: forking
// while the answer is on its way competes with it for the CPU. run
// (trace.go) calls it inside the job's span.
func (p *Pool) runJob(ctx context.Context, job Job) (_ *Result, refill func(), _ error) {
	refill = func() {}
	if err := p.usable(); err != nil {
		return nil, refill, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, refill, errClosed()
	}
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()

	accepted := time.Now()
	pl, rerr := p.plan(&job, false)
	if rerr != nil {
		return p.refuse(&job, rerr), refill, nil
	}
	var ran *worker.Child // the child the job ran in, if any
	defer func() {
		if ran != nil {
			pl.closeAfter(ran)
		} else {
			pl.close()
		}
	}()
	if (len(job.Functions) > 0 || len(job.Tools) > 0) && job.Host == nil {
		return p.refuse(&job, requestErrorf("functions are declared but the job has no Host to answer them")), refill, nil
	}
	if pl.needsNS() {
		if p.ns.failed() != nil {
			// No mounter: refused at once, as no namespace can come.
			if err := p.buildNS(pl); err != nil {
				return p.refuse(&job, err), refill, nil
			}
		} else {
			// The namespace comes with the job's process (see nsFor): the
			// mounter attaches the job's mounts to the namespace the ready
			// ns spare entered before the job. Its plan is checked first.
			if err := p.nsCheck(pl); err != nil {
				return p.refuse(&job, err), refill, nil
			}
			if err := p.takeNSSlot(ctx, pl); err != nil {
				return nil, refill, err
			}
		}
	}
	pl.job.Host = p.traceHost(trace.SpanFromContext(ctx), job.ID, "", checkedHost(pl.sigs, p.hostAdapter(job.ID, "", job.Host)))
	pl.job.Output = p.outputAdapter(job.ID, "", job.OnOutput)
	pl.job.Display = p.displayAdapter(job.ID, "", job.OnDisplay)
	// A HostFunc's ctx carries ctx's values and ends with it.
	pl.job.Ctx = ctx

	w, err := p.acquire(ctx)
	if err != nil {
		return nil, refill, err
	}
	defer p.release(w)
	// The job ends with ctx or with the pool.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(p.life, stop)()
	// stopped is why runCtx ended.
	stopped := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return errClosed()
	}

	var out *worker.Outcome
	var held *worker.Child // whose refill waits for the answer
	// A panic (a logger's, say) must not leave the template without its
	// next spare.
	defer func() {
		if r := recover(); r != nil {
			if ran != nil {
				ran.Close() // HoldClose: see below
			}
			if held != nil {
				held.RefillNow()
			}
			panic(r)
		}
	}()
	for attempt := 0; ; attempt++ {
		tpl, err := w.template()
		if err != nil {
			res := p.failed(&job, pl, KindCrashed, "no template could be started: "+err.Error(), accepted)
			p.finish(&job, res)
			return res, refill, nil
		}
		child, err := p.takeFor(tpl, pl, runCtx.Done())
		if err != nil {
			if runCtx.Err() != nil {
				return nil, refill, stopped()
			}
			if attempt < maxSetupRetries {
				continue // the template died while forking; it is replaced
			}
			res := p.failed(&job, pl, KindCrashed, "template failed: "+err.Error(), accepted)
			p.finish(&job, res)
			return res, refill, nil
		}
		if pl.needsNS() {
			if err := p.nsFor(pl, child); err != nil {
				child.Close()
				return p.refuse(&job, err), refill, nil
			}
		}
		if p.waiting.Load() > 0 {
			child.RefillNow()
		} else {
			child.HoldRefill()
			held = child
		}
		ran = child
		// The child's Close (its descriptors, its cgroup's release)
		// waits for the answer too, as its refill does: Run only kills it.
		child.HoldClose()
		out = child.Run(&pl.job, runCtx.Done())
		// A child that died before it started the job ran no user code, so
		// the job can safely go to a fresh spare (up to maxSetupRetries
		// times in all: a spare that died with its template is followed
		// by a Take from that template, which fails once its death is
		// seen, and then by a spare of its replacement); that child's
		// replacement is needed at once.
		if attempt < maxSetupRetries && !out.Started && out.SetupError == "" && !out.Canceled && !out.TimedOut {
			child.Close()
			child.RefillNow()
			continue
		}
		fill := pl.aheadFill
		refill = func() {
			child.Close()
			child.RefillNow()
			if fill {
				go p.fillAhead()
			}
		}
		break
	}
	if out.Canceled {
		return nil, refill, stopped()
	}
	res := p.result(&job, pl, out, accepted)
	if out.Started {
		res.Files, res.FilesTruncated = p.collectFiles(pl, pl.collect, false)
	}
	p.finish(&job, res)
	return res, refill, nil
}

// Close ends the pool at once: it stops accepting jobs, kills the running
// ones (their Run calls return ErrClosed, as do calls waiting for a
// worker), ends every checkout (a step running is killed; the checkout's
// calls return ErrClosed), and stops every template and its children.
// It returns once all of them are gone. It is safe to call more than
// once; on a Pool that [New] did not make it returns a KindClosed error.
func (p *Pool) Close() error {
	if p.remote != nil {
		return p.remote.Close()
	}
	if err := p.usable(); err != nil {
		return err
	}
	p.mu.Lock()
	if isDone(p.closing) {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closing)
	p.kill()
	p.mu.Unlock()
	// Sessions end with the pool.
	p.coMu.Lock()
	open := make([]*Checkout, 0, len(p.checkouts))
	for c := range p.checkouts {
		open = append(open, c)
	}
	p.coMu.Unlock()
	for _, c := range open {
		c.end(newError(KindClosed, "the pool was closed"))
	}
	for _, c := range open {
		<-c.ended
	}
	p.inflight.Wait()
	p.restarts.Wait()
	p.watchers.Wait()
	for _, w := range p.workers {
		w.mu.Lock()
		if w.tpl != nil {
			w.tpl.Close()
		}
		w.mu.Unlock()
	}
	// Every child is dead or dying now: its cgroup goes once it is gone.
	if err := p.cg.Close(); err != nil {
		p.log.Error("removing the pool's cgroups failed", "err", err)
	}
	p.closeAhead()
	p.ns.close()
	if err := p.scratch.close(); err != nil {
		p.log.Error("removing the pool's scratch directory failed", "dir", p.scratch.path, "err", err)
	}
	return nil
}

// Shutdown closes the pool gracefully: it stops accepting work at once
// (Run, Checkout and a Feed starting a new step return ErrClosed), waits
// until the jobs and session steps under way have ended — a Run call
// already waiting for a worker still runs, and a step waiting for Resume
// may still be resumed — or ctx ends, and then closes the pool as
// [Pool.Close] does, killing whatever still runs. It returns ctx.Err()
// when ctx ended first, and nil otherwise. Open checkouts without a step
// under way do not hold it up: they end with the pool.
func (p *Pool) Shutdown(ctx context.Context) error {
	if p.remote != nil {
		return p.remote.Shutdown(ctx)
	}
	if err := p.usable(); err != nil {
		return err
	}
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		p.inflight.Wait()
		p.steps.Wait()
		close(idle)
	}()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.Close()
	return err
}

// beginStep counts a checkout step under way, or fails once the pool
// stops accepting work; the step's end calls done.
func (p *Pool) beginStep() (done func(), _ error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errClosed()
	}
	p.steps.Add(1)
	p.stepsRunning.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			p.stepsRunning.Add(-1)
			p.steps.Done()
		})
	}, nil
}

// usable fails for a Pool that New did not make.
func (p *Pool) usable() error {
	if p.closing == nil {
		return newError(KindClosed, "this Pool was not made by pynox.New, so it runs nothing")
	}
	return nil
}

// Cgroups returns the per-job cgroup backend in use: "v2", "v1" or
// "none" (see Config.Cgroups).
func (p *Pool) Cgroups() string {
	if p.remote != nil {
		return p.remoteInfo.cgroups
	}
	return p.cg.Backend()
}

// CgroupDirs returns the directories the pool creates its jobs' cgroups
// in (empty without cgroups): a pool that confines itself must keep write
// access to them.
func (p *Pool) CgroupDirs() []string {
	if p.remote != nil {
		return nil
	}
	return p.cg.WritableDirs()
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	if p.remote != nil {
		return p.remoteStats()
	}
	s := p.stats.snapshot()
	if !p.start.IsZero() {
		s.UptimeMS = time.Since(p.start).Milliseconds()
	}
	s.Workers = p.cfg.Workers
	p.coMu.Lock()
	s.SessionsActive = len(p.checkouts)
	p.coMu.Unlock()
	return s
}

// jobLogMessage is the message of the record the pool logs per finished
// job (see Config.Logger).
const jobLogMessage = "job"

// finish counts a result and logs it as a finished job.
// cpuAttr is the cpu_ms of a job's log line: the kernel's count of its CPU
// time in milliseconds, absent when it has none.
func cpuAttr(res *Result) slog.Attr {
	if res.Usage == nil {
		return slog.Attr{}
	}
	return slog.Float64("cpu_ms", res.Usage.CPUMS)
}

func (p *Pool) finish(job *Job, res *Result) {
	p.stats.record(res)
	errType, msg := "", ""
	if res.Error != nil {
		errType, msg = res.Error.Type, res.Error.Message
	}
	network := "deny"
	if res.Policy != nil {
		network = res.Policy.Network
	}
	var session, step slog.Attr
	if res.Session != "" {
		session, step = slog.String("session", res.Session), slog.Int("step", res.Step)
	}
	p.log.LogAttrs(context.Background(), slog.LevelInfo, jobLogMessage,
		slog.Any("id", job.ID),
		session, step,
		slog.Int("exit", res.Exit),
		slog.String("error", errType),
		slog.String("message", msg),
		slog.Int64("duration_ms", res.DurationMS),
		slog.Int64("queue_us", res.QueueUS),
		cpuAttr(res),
		traceAttr(job),
		slog.String("network", network),
		slog.Bool("truncated", res.StdoutTruncated || res.StderrTruncated),
	)
}
