package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/pynox/pynox"
)

// Interleaved pairs. A ratio of two rows measured one after the other
// mixes the machine's drift with the difference it is meant to show: on a
// shared 2-vCPU VM the speed moves by 10-30% over minutes. So the rows a
// ratio compares (pynox against the limit loop for R1-R10, rows 28 and
// 29) are measured as a pair: both servers running, each row warmed up as
// usual, then the pair's rows take turns in blocks of about n/blocks
// requests, in ABBA order (A B B A A B ...), which cancels a linear trend
// exactly for an even number of blocks. A row's samples are pooled over
// its blocks; its CPU per job is what its server's process tree used over
// its own blocks only, each block read from its start until the tree is
// quiet again after its last answer (the spare refill it caused
// included); a throughput row's jobs/s is its jobs over the sum of its
// blocks' wall time.

// defaultBlocks is --blocks' default: 6 blocks per row, 12 per pair.
const defaultBlocks = 6

// acc gathers one row's samples over the blocks it is measured in.
type acc struct {
	row          *Row
	durs, queues []float64
	cpu          cpuTimes
	n            int
	elapsed      time.Duration // throughput rows: the sum of the blocks' wall time
	throughput   bool
}

// finish writes what a gathered into its row.
func (a *acc) finish() {
	a.row.summarize(a.durs, a.queues)
	a.row.setCPU(a.cpu, a.n)
	if a.throughput && a.elapsed > 0 {
		a.row.JobsPerS = float64(a.n) / a.elapsed.Seconds()
	}
}

// leg is one row of an interleaved pair: the server it runs on, its
// warm-up, and a block of k measured requests gathered into acc.
type leg struct {
	s     *server
	acc   *acc
	warm  func() error
	block func(k int) error
}

// blockRecord is one measured block of an interleaved pair, in the order
// the blocks ran (for the tests and the verbose log).
type blockRecord struct {
	Row string
	N   int
}

// blockOrder is the order of 2*blocks blocks of a pair: 0 for its first
// row, 1 for its second, in ABBA order.
func blockOrder(blocks int) []int {
	order := make([]int, 0, 2*blocks)
	for r := range blocks {
		if r%2 == 0 {
			order = append(order, 0, 1)
		} else {
			order = append(order, 1, 0)
		}
	}
	return order
}

// blockSizes splits n requests into blocks (at most n of them) whose sizes
// differ by at most one.
func blockSizes(n, blocks int) []int {
	blocks = max(1, min(blocks, n))
	sizes := make([]int, blocks)
	for i := range sizes {
		sizes[i] = n / blocks
		if i < n%blocks {
			sizes[i]++
		}
	}
	return sizes
}

// interleave measures the rows of legs a and b, n requests each, in
// alternating blocks (see the top of this file). Each leg is warmed up
// first, and each server is left to settle before the first block.
func interleave(rep *Report, a, b *leg, n, blocks int, logf func(string, ...any)) error {
	legs := [2]*leg{a, b}
	last := map[*server]cpuTimes{}
	for _, l := range legs {
		if err := l.warm(); err != nil {
			return err
		}
		last[l.s] = l.s.settle()
	}
	for _, l := range legs {
		last[l.s] = l.s.cpu()
	}
	sizes := blockSizes(n, blocks)
	next := [2]int{}
	between := map[*server]float64{}
	for _, w := range blockOrder(len(sizes)) {
		l := legs[w]
		k := sizes[next[w]]
		next[w]++
		c0 := l.s.cpu()
		between[l.s] += c0.sub(last[l.s]).total()
		first := len(l.acc.row.rtts)
		if err := l.block(k); err != nil {
			return err
		}
		c1 := l.s.settle()
		l.acc.cpu = l.acc.cpu.add(c1.sub(c0))
		last[l.s] = c1
		rep.blocks = append(rep.blocks, blockRecord{Row: l.acc.row.ID, N: k})
		us := make([]float64, 0, k)
		for _, d := range l.acc.row.rtts[first:] {
			us = append(us, float64(d.Microseconds()))
		}
		logf("  block #%s: %d requests, median %s, cpu/job %s", l.acc.row.ID, k, fmtMS(percentile(us, 50)), fmtMS(1e6*c1.sub(c0).total()/float64(k)))
	}
	for _, l := range legs {
		l.acc.finish()
	}
	idle := fmt.Sprintf("%s %.2f ms", a.s.name, 1e3*between[a.s])
	if b.s != a.s {
		idle += fmt.Sprintf(", %s %.2f ms", b.s.name, 1e3*between[b.s])
	}
	logf("#%s and #%s: %d blocks each of %d-%d requests; CPU used outside the blocks measured on it (idle): %s",
		a.acc.row.ID, b.acc.row.ID, len(sizes), sizes[len(sizes)-1], sizes[0], idle)
	return nil
}

// settle waits until the server's process tree is quiet (its CPU moved by
// less than 50 µs over 10 ms and no process came or went; checked for at
// most half a second), so that
// what a block's last jobs set off (a spare's refill) is counted in that
// block and does not run during the next; it returns the last reading.
func (s *server) settle() cpuTimes {
	c := s.cpu()
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		d := s.cpu()
		if math.Abs(d.total()-c.total()) < 50e-6 && d.procs == c.procs {
			return d
		}
		c = d
	}
	return c
}

func (c cpuTimes) add(o cpuTimes) cpuTimes {
	return cpuTimes{host: c.host + o.host, templates: c.templates + o.templates, children: c.children + o.children}
}

// latencyLeg is a leg of sequential round trips of job, each after a
// think time of gap, warmed up by warm unmeasured ones (as latency).
func (s *server) latencyLeg(row *Row, job pynox.Job, want string, warm int, gap time.Duration) *leg {
	a := &acc{row: row}
	once := func(int) (*pynox.Result, time.Duration, error) { return s.run(job, want) }
	i := 0
	return &leg{s: s, acc: a,
		warm: func() error {
			err := s.latencyBlock(nil, i, warm, gap, once)
			i += warm
			return err
		},
		block: func(k int) error {
			err := s.latencyBlock(a, i, k, gap, once)
			i += k
			return err
		},
	}
}

// throughputLeg is a leg of trivial jobs kept inflight in flight, warmed
// up by warm sequential ones (as throughput).
func (s *server) throughputLeg(row *Row, warm, inflight int) *leg {
	a := &acc{row: row, throughput: true}
	return &leg{s: s, acc: a,
		warm: func() error {
			for range warm {
				if _, _, err := s.run(pynox.Job{Code: trivialCode}, trivialOut); err != nil {
					return err
				}
			}
			return nil
		},
		block: func(k int) error { return s.throughputBlock(a, trivialCode, trivialOut, k, inflight) },
	}
}

// latencyBlock makes k sequential round trips of once (numbered from i0),
// sleeping gap before each, and gathers them into a (nil: unmeasured).
func (s *server) latencyBlock(a *acc, i0, k int, gap time.Duration, once func(i int) (*pynox.Result, time.Duration, error)) error {
	for i := i0; i < i0+k; i++ {
		if gap > 0 {
			time.Sleep(gap)
		}
		r, d, err := once(i)
		if err != nil {
			return err
		}
		if a == nil {
			continue
		}
		a.row.rtts = append(a.row.rtts, d)
		a.durs = append(a.durs, float64(r.DurationUS))
		a.queues = append(a.queues, float64(r.QueueUS))
		a.n++
	}
	return nil
}

// throughputBlock keeps inflight requests of code outstanding until k have
// completed, and gathers them, and the block's wall time, into a.
func (s *server) throughputBlock(a *acc, code, want string, k, inflight int) error {
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range k {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, d, err := s.run(pynox.Job{Code: code}, want)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			a.row.rtts = append(a.row.rtts, d)
			a.durs = append(a.durs, float64(r.DurationUS))
		}()
	}
	wg.Wait()
	a.elapsed += time.Since(t0)
	a.n += k
	return firstErr
}

// limitPairs measures pynox's trivial-job rows on the running pool p
// against the limit loop's, started here with preload and stopped at the
// end: ids are pynox's rows with think time, back to back and at
// throughput, then the loop's same three. Each pair is interleaved; the
// latency pairs come first, then between (pynox rows measured alone, nil
// for none), then the throughput pair.
func limitPairs(ctx context.Context, rep *Report, o options, p *server, python, preload, tmp, work string, ids [6]string,
	between func() error, logf func(string, ...any)) error {
	name := "limit"
	if preload != "" {
		name += "+" + preload
	}
	logf("limit loop (%s), interleaved with %s", name, p.name)
	l, err := startLimit(ctx, rep, name, python, preload, o.workers, tmp, work)
	if err != nil {
		return err
	}
	defer l.close()
	job := pynox.Job{Code: trivialCode}
	for i, gap := range []time.Duration{o.gap, 0} {
		err := interleave(rep, p.latencyLeg(rep.row(ids[i]), job, trivialOut, o.warm, gap),
			l.latencyLeg(rep.row(ids[3+i]), job, trivialOut, o.warm, gap), o.n, o.blocks, logf)
		if err != nil {
			return err
		}
	}
	if between != nil {
		if err := between(); err != nil {
			return err
		}
	}
	return interleave(rep, p.throughputLeg(rep.row(ids[2]), o.warm, o.inflight),
		l.throughputLeg(rep.row(ids[5]), o.warm, o.inflight), o.n, o.blocks, logf)
}
