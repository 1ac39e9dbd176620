// Command agent is a small agent loop on pynox's Go API: one checkout (a
// session) per conversation, the cells a model would write run in it one
// after another, their output streamed as it comes, a host tool the code
// calls, and a runaway cell interrupted without losing the session's
// variables.
//
// There is no model here: each conversation replays cells a model could
// have written, so the example runs anywhere pynox does:
//
//	go run ./examples/agent
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pynox/pynox"
)

// cell is one piece of code the model wrote, and how long the agent lets
// it run before it interrupts it (zero: let it finish).
type cell struct {
	code      string
	interrupt time.Duration
}

// conversations are what two users' models wrote.
var conversations = map[string][]cell{
	"alice": {
		{code: "prices = {'apple': 1.2, 'pear': 0.8}\nsum(prices.values())"},
		{code: "from pynox_host import stock\nfor fruit in prices:\n    print(fruit, stock(fruit), flush=True)"},
		// The model wrote a loop that never ends: the agent stops it.
		{code: "import time\nwhile True:\n    time.sleep(0.01)", interrupt: 300 * time.Millisecond},
		// The session lives on, with its variables.
		{code: "sorted(prices)"},
	},
	"bob": {
		{code: "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.05)"},
		{code: "print(prices)"}, // not Alice's: a NameError in Bob's own session
	},
}

// stock is the host tool: the code calls pynox_host.stock(name).
func stock(ctx context.Context, call *pynox.Call) (any, error) {
	var args []string
	if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
		return nil, pynox.RaiseAs("TypeError", "stock(name) takes one name")
	}
	levels := map[string]int{"apple": 12, "pear": 0}
	n, ok := levels[args[0]]
	if !ok {
		return nil, pynox.RaiseAs("KeyError", args[0])
	}
	return n, nil
}

func main() {
	if err := run(os.Stdout, os.Getenv("PYNOX_PYTHON")); err != nil {
		log.Fatal(err)
	}
}

// run serves every conversation at once, each in its own checkout, and
// writes one conversation's transcript after the other to w.
func run(w io.Writer, python string) error {
	dir, err := os.MkdirTemp("", "pynox-agent")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pool, err := pynox.New(pynox.Config{Python: python, Dir: dir, Workers: 2})
	if err != nil {
		return err
	}
	defer pool.Close()

	names := []string{"alice", "bob"}
	transcripts := make([]strings.Builder, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = converse(pool, conversations[name], &transcripts[i])
		}()
	}
	wg.Wait()
	for i, name := range names {
		fmt.Fprintf(w, "== %s\n%s", name, transcripts[i].String())
	}
	return errors.Join(errs...)
}

// converse runs one conversation's cells in a checkout of its own.
func converse(pool *pynox.Pool, cells []cell, out *strings.Builder) error {
	ctx := context.Background()
	co, err := pool.Checkout(ctx, pynox.Job{Functions: []string{"stock"}, Host: stock})
	if err != nil {
		return err
	}
	defer co.Finish(ctx)
	for _, c := range cells {
		fmt.Fprintf(out, ">>> %s\n", strings.ReplaceAll(c.code, "\n", "\n... "))
		if c.interrupt > 0 {
			// A user pressing "stop": the cell gets KeyboardInterrupt.
			stop := time.AfterFunc(c.interrupt, func() { co.Interrupt() })
			defer stop.Stop()
		}
		var lines lineWriter
		ev, err := co.Feed(ctx, pynox.Step{
			Code: c.code,
			// The user sees output while the cell runs, not at its end:
			// here each line as soon as it is whole.
			OnOutput: func(s pynox.Stream, text string) { lines.write(out, s, text) },
		})
		if err != nil {
			return err
		}
		res := ev.Result // the stock tool answers calls, so a turn ends with its result
		switch {
		case res.Error != nil:
			fmt.Fprintf(out, "%s: %s\n", res.Error.Type, res.Error.Message)
		case res.Value != nil:
			fmt.Fprintf(out, "= %s\n", res.Value)
		}
	}
	return nil
}

// lineWriter writes streamed output a whole line at a time, tagged with
// its stream (pieces of output may end anywhere in a line).
type lineWriter struct{ partial [2]string }

func (l *lineWriter) write(out io.Writer, s pynox.Stream, text string) {
	i := 0
	if s == pynox.Stderr {
		i = 1
	}
	text = l.partial[i] + text
	for {
		n := strings.IndexByte(text, '\n')
		if n < 0 {
			break
		}
		fmt.Fprintf(out, "[%s] %s\n", s, text[:n])
		text = text[n+1:]
	}
	l.partial[i] = text
}
