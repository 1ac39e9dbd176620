package worker

// Session dumps: the picklable state of a session's __main__, made by the
// session's own process between steps and loaded by a new session's
// process before its first step. The host only moves the bytes.

import (
	"encoding/json"
	"time"

	"golang.org/x/sys/unix"
)

// MaxSkipped bounds how many names a dump's report lists as skipped.
const MaxSkipped = 1000

// dumpFrame asks a session's process, between steps, for its dump.
type dumpFrame struct {
	T    string `json:"t"` // "dump"
	Step int    `json:"step"`
	Max  int    `json:"max"`
	CPU  int64  `json:"cpu"`
}

// Dump asks a session whose process is alive (the last Outcome had Alive
// set) for the pickle of its __main__ globals, of at most max bytes. The
// process answers between steps, in its sandbox, under timeout and
// cpuSecs like a step, and lives on. The pickle is Outcome.Stdout (cut at
// max: StdoutTrunc), and Outcome.Skipped names the globals that did not
// pickle; Outcome.Error is set when the dump failed (the process lives
// on). When the dump ends the process (a crash, a timeout), the child is
// closed and Outcome.Alive is false.
func (c *Child) Dump(max int, timeout time.Duration, cpuSecs int64, cancel <-chan struct{}) *Outcome {
	// The dump's own CPU time is no step's: the next step's base is read
	// afresh.
	c.lastUsage = nil
	out, errp, ended := c.betweenSteps()
	if ended != nil {
		return ended
	}
	// The step number stays: a dump is not a step.
	payload, _ := json.Marshal(&dumpFrame{T: "dump", Step: c.step, Max: max, CPU: cpuSecs})
	o := c.turn(turnSpec{
		send: func() error {
			err := c.sendRaw(payload, []int{out[1], errp[1]})
			unix.Close(out[1])
			unix.Close(errp[1])
			if err == nil {
				err = c.signal(unix.SIGCONT)
			}
			return err
		},
		timeout:   timeout,
		maxOutput: max,
		maxCalls:  0,
		cpu:       cpuSecs,
		continued: true,
		// What the session's code writes to its stderr during the dump
		// is dropped: the pool holds the dump's bytes only.
		dropStderr: true,
	}, cancel)
	if len(o.Skipped) > MaxSkipped {
		o.Skipped = o.Skipped[:MaxSkipped]
	}
	c.noteOOM(o)
	if !o.Alive {
		c.Close()
	}
	return o
}

// dumpMemfd returns a sealed memfd holding data, for a restoring
// session's process to read.
func dumpMemfd(data []byte) (int, error) {
	fd, err := unix.MemfdCreate("pynox-dump", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, err
	}
	for n := 0; n < len(data); {
		m, err := unix.Write(fd, data[n:])
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		n += m
	}
	_, err = unix.Seek(fd, 0, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE|unix.F_SEAL_SEAL)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
