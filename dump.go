package pynox

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/pynox/pynox/internal/worker"
)

// MaxDumpSize bounds a session dump ([Dump.Data]) in bytes: 64 MiB.
// [Checkout.Dump] fails for a session whose dump would be larger, and
// [Pool.Restore] refuses a larger one. A dump is made and loaded inside
// the session's process, within its memory allowance: a session whose
// memory limit is smaller than its dump (plus the objects it rebuilds)
// fails to dump or to restore with a MemoryError rather than exceed it.
const MaxDumpSize = 64 << 20

// dumpMagic starts every dump; the step count follows it (8 bytes, little
// endian), then the pickle the session's process wrote.
const dumpMagic = "pynoxd\x00\x01"

const dumpHeader = len(dumpMagic) + 8

// Dump is a session's state as [Checkout.Dump] made it.
//
// Data is what [Pool.Restore] takes: a short header the pool writes (a
// magic string and Steps) and a pickle of the session's __main__ globals
// that the session's own process wrote. Modules are pickled by name and
// imported again; functions defined in the session are pickled by value
// (their code objects, so a dump restores only under the same Python
// major.minor version); classes defined in the session, and instances of
// them, are not dumped. The pool never unpickles a dump: it is loaded by
// the restoring session's process, inside its sandbox, so a dump must be
// treated as the code of whoever wrote it, which can do no more there
// than that session's own code could.
type Dump struct {
	// Data is the dump, at most MaxDumpSize bytes.
	Data []byte
	// Skipped names the globals that were left out because they do not
	// pickle (a generator, an open file, a lock, a class defined in the
	// session, ...), at most 1000 of them. Names of the form __x__ are
	// the module's own and are never dumped nor listed.
	Skipped []string
	// Steps is the number of steps the session's process had run; the
	// first step of a session restored from the dump is step Steps+1.
	Steps int
}

// Dump returns the session's state: the globals of its __main__ that
// pickle, and its step count. The session's process makes the pickle
// between steps, in its sandbox, under the session's timeout and limits
// (pickling may run the session's own __reduce__ methods); the session
// then goes on as before. A checkout with no live process (before its
// first step, or after its process ended) has an empty dump, or — for a
// restored checkout before its first step — the dump it was restored
// from. A pool makes at most two dumps at once (each may hold a few times
// MaxDumpSize of its memory while it is read); a further Dump waits for
// one to end, as long as ctx allows.
//
// Dump fails with ErrProtocol while a host call waits for Resume, with a
// KindRuntime error whose Type is the Python exception's when the pickle
// could not be made (a dump larger than MaxDumpSize among them: the
// session lives on), with KindTimeout or KindCrashed when the dump ended
// the session's process (the next Feed starts a new one), with
// ErrFinished or ErrClosed for an ended checkout, and with ctx.Err() when
// ctx ends (while the dump runs, that kills the session's process).
func (c *Checkout) Dump(ctx context.Context) (*Dump, error) {
	if c.remote != nil {
		return c.remote.Dump(ctx)
	}
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	if c.turn != nil {
		return nil, newError(KindProtocol, "host call %d is waiting for Resume; a session is dumped between steps", c.turn.pending[0].ID)
	}
	child := c.child
	if child == nil {
		c.loadIdleDump()
		if c.restore != nil {
			return &Dump{Data: encodeDump(c.restoreSteps, c.restore), Steps: c.restoreSteps}, nil
		}
		return &Dump{Data: encodeDump(0, nil)}, nil
	}
	c.mu.Lock()
	c.idle.Stop()
	c.lastUse = time.Now()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.armIdle()
		c.mu.Unlock()
	}()
	return c.dump(ctx, child)
}

// dump makes the dump of the live process child; the caller holds the
// turn.
// maxDumpsInFlight bounds the dumps a pool makes at once.
const maxDumpsInFlight = 2

func (c *Checkout) dump(ctx context.Context, child *worker.Child) (*Dump, error) {
	stepDone, err := c.pool.beginStep()
	if err != nil {
		return nil, err
	}
	defer stepDone()
	// At most maxDumpsInFlight dumps run at once in a pool: each may hold
	// a few times MaxDumpSize of the pool's memory while it is read (idle
	// sessions are dumped on their own, up to MaxSessions at once).
	select {
	case c.pool.dumps <- struct{}{}:
		defer func() { <-c.pool.dumps }()
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.life.Done():
		return nil, c.endErr()
	}
	cancel := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(cancel) }) }
	defer context.AfterFunc(ctx, stop)()
	defer context.AfterFunc(c.life, stop)()
	timeout := c.pl.job.Timeout
	o := child.Dump(MaxDumpSize-dumpHeader, timeout, cpuBackstop(timeout), cancel)
	steps := c.steps + c.base
	if !o.Alive {
		c.endProcess()
		switch {
		case o.Canceled:
			if err := c.endErr(); err != nil {
				return nil, err
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, context.Canceled
		case o.TimedOut || o.CPUExceeded:
			return nil, newError(KindTimeout, "the dump took longer than the session's timeout (%s); the session's process was killed", formatDuration(int64(timeout)))
		case o.Violation != "":
			return nil, newError(KindCrashed, "the session's process broke the protocol during the dump (%s) and was killed", o.Violation)
		}
		return nil, newError(KindCrashed, "the session's process ended during the dump")
	}
	if o.Error != nil {
		return nil, &Error{Kind: KindRuntime, Type: o.Error.Type, Message: "the session could not be dumped: " + o.Error.Message}
	}
	if o.StdoutTrunc {
		return nil, &Error{Kind: KindRuntime, Type: "ValueError", Message: fmt.Sprintf("the session could not be dumped: its dump exceeds %d bytes", MaxDumpSize)}
	}
	return &Dump{Data: encodeDump(steps, o.Stdout), Skipped: o.Skipped, Steps: steps}, nil
}

// encodeDump prefixes a session process's pickle with the dump header.
func encodeDump(steps int, pickle []byte) []byte {
	b := make([]byte, dumpHeader, dumpHeader+len(pickle))
	copy(b, dumpMagic)
	binary.LittleEndian.PutUint64(b[len(dumpMagic):], uint64(steps))
	return append(b, pickle...)
}

// decodeDump checks a dump's size and header and returns its step count
// and pickle. It reads nothing of the pickle.
func decodeDump(d []byte) (int, []byte, *Error) {
	if len(d) > MaxDumpSize {
		return 0, nil, requestErrorf("restore: the dump is %d bytes; the limit is %d (MaxDumpSize)", len(d), MaxDumpSize)
	}
	if len(d) < dumpHeader || string(d[:len(dumpMagic)]) != dumpMagic {
		return 0, nil, requestErrorf("restore: this is not a pynox session dump (a dump starts with the header Checkout.Dump writes)")
	}
	steps := binary.LittleEndian.Uint64(d[len(dumpMagic):dumpHeader])
	if steps > 1<<31 {
		return 0, nil, requestErrorf("restore: the dump's step count %d is out of range", steps)
	}
	return int(steps), d[dumpHeader:], nil
}

// Restore starts a session, like [Pool.Checkout] with job, whose process
// loads the dump d (made by [Checkout.Dump], by this pool or another)
// into its __main__ before its first step runs, and numbers its steps on
// from the dump's. The dump is loaded inside the new session's sandbox,
// with job's grants and limits, never by the pool: a tampered dump can do
// no more than the code of the session that loads it. When the dump
// fails to load, the first step's result carries that exception (its
// code does not run), and the session goes on with an empty __main__.
//
// Restore fails with a KindRequest error for a dump larger than
// MaxDumpSize or one that does not start with a dump's header, and as
// Pool.Checkout does otherwise. The dump is handed to the first process
// only: a process started after that one ended starts empty.
func (p *Pool) Restore(ctx context.Context, job Job, d []byte) (*Checkout, error) {
	if p.remote != nil {
		if _, _, rerr := decodeDump(d); rerr != nil {
			return nil, rerr
		}
		return p.remoteCheckoutOf(p.remote.Checkout(ctx, job, d))
	}
	return p.restoreCheckout(ctx, job, "", nil, d)
}

// restoreCheckout is Restore for a session of the pool protocol.
func (p *Pool) restoreCheckout(ctx context.Context, job Job, name string, onEnd func(*Checkout), d []byte) (*Checkout, error) {
	if _, _, rerr := decodeDump(d); rerr != nil {
		return nil, rerr
	}
	c, err := p.checkout(ctx, job, name, onEnd)
	if err != nil {
		return nil, err
	}
	if err := c.setRestore(d); err != nil {
		c.Finish(context.Background())
		return nil, err
	}
	return c, nil
}

// setRestore makes the checkout's next process load the dump d; the
// checkout must have no live process.
func (c *Checkout) setRestore(d []byte) error {
	steps, pickle, rerr := decodeDump(d)
	if rerr != nil {
		return rerr
	}
	if err := c.acquire(context.Background()); err != nil {
		return err
	}
	defer c.release()
	if c.child != nil || c.turn != nil {
		return newError(KindProtocol, "the session's process is alive: a dump is restored only into a new one")
	}
	c.restore = append([]byte{}, pickle...)
	c.restoreSteps = steps
	return nil
}

// takeRestore hands the pending dump, if any, to the process just taken;
// the caller holds the turn.
func (c *Checkout) takeRestore() []byte {
	c.loadIdleDump()
	r := c.restore
	c.base = c.restoreSteps
	c.restore, c.restoreSteps = nil, 0
	return r
}
