package pynox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
)

// exampleRoot holds the examples' scratch directories; TestMain removes
// it when the tests and examples have run (an example has no t.TempDir).
var exampleRoot struct {
	once sync.Once
	dir  string
	err  error
}

// TestMain runs the package's tests and examples, then closes the tests'
// shared pools and removes the examples' scratch directories.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	code := m.Run()
	pynox.CloseSharedTestPools()
	if exampleRoot.dir != "" {
		os.RemoveAll(exampleRoot.dir)
	}
	os.Exit(code)
}

// exampleConfig keeps the examples' ceiling in a scratch directory, and
// runs the tests' interpreter (testenv.Python: the first python3 on PATH
// may be a launcher such as a pyenv shim, which costs every template a
// shell and the launcher's start).
func exampleConfig() pynox.Config {
	exampleRoot.once.Do(func() {
		exampleRoot.dir, exampleRoot.err = os.MkdirTemp("", "pynox-example")
	})
	if exampleRoot.err != nil {
		log.Fatal(exampleRoot.err)
	}
	dir, err := os.MkdirTemp(exampleRoot.dir, "example")
	if err != nil {
		log.Fatal(err)
	}
	return pynox.Config{Workers: 1, Dir: dir, Python: testenv.Python()}
}

func Example() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res, err := pool.Run(context.Background(), pynox.Job{
		Code: "import json\nprint(json.dumps({'ok': True}))",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	fmt.Println("exit:", res.Exit)
	// Output:
	// {"ok": true}
	// exit: 0
}

func ExamplePool_Run_denied() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res, err := pool.Run(context.Background(), pynox.Job{
		Code: "print(open('/etc/passwd').read())",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Error.Type)
	fmt.Println(errors.Is(res.Err(), pynox.ErrRuntime))
	// Output:
	// PermissionError
	// true
}

func ExamplePool_Run_timeout() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res, err := pool.Run(context.Background(), pynox.Job{
		Code:    "while True: pass",
		Timeout: 200 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(res.Err(), pynox.ErrTimeout))
	// Output:
	// true
}

func ExamplePool_Checkout() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()

	// A session: the job fixes permissions and limits; steps bring code.
	session, err := pool.Checkout(ctx, pynox.Job{Timeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer session.Finish(ctx)
	for _, code := range []string{"x = 41", "x += 1", "print(x)"} {
		ev, err := session.Feed(ctx, pynox.Step{Code: code})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(ev.Result.Stdout)
	}
	ev, err := session.Feed(ctx, pynox.Step{Code: "raise SystemExit(3)"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit:", ev.Result.Exit, "ended:", ev.Result.SessionEnded)
	// Output:
	// 42
	// exit: 3 ended: true
}

func ExampleCheckout_Resume() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()

	// Without a Host, each host-function call surfaces as a TurnEvent.
	session, err := pool.Checkout(ctx, pynox.Job{Functions: []string{"search"}})
	if err != nil {
		log.Fatal(err)
	}
	defer session.Finish(ctx)
	ev, err := session.Feed(ctx, pynox.Step{Code: "from pynox_host import search\nprint(search('pynox', limit=2))"})
	for err == nil && ev.Call != nil {
		fmt.Printf("call %s%s %s\n", ev.Call.Function, ev.Call.Args, ev.Call.Kwargs)
		ev, err = session.Resume(ctx, ev.Call.ID, pynox.Return([]string{"first hit", "second hit"}))
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ev.Result.Stdout)
	// Output:
	// call search["pynox"] {"limit":2}
	// ['first hit', 'second hit']
}

func ExampleHostFunc() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// CodeAct: the job's code calls a function of this program.
	weather := func(ctx context.Context, call *pynox.Call) (any, error) {
		var args []string
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, errors.New("weather(city) takes one city")
		}
		return map[string]any{"city": args[0], "celsius": 21}, nil
	}
	res, err := pool.Run(context.Background(), pynox.Job{
		Functions: []string{"weather"},
		Host:      weather,
		Code: "from pynox_host import weather, HostError\n" +
			"print(weather('Lyon')['celsius'])\n" +
			"try:\n    weather()\nexcept HostError as e:\n    print('HostError:', e)",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	// Output:
	// 21
	// HostError: weather(city) takes one city
}
