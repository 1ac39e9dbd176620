package pynox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/pynox/pynox"
)

// exampleConfig keeps the examples' ceiling in a scratch directory.
func exampleConfig() pynox.Config {
	dir, err := os.MkdirTemp("", "pynox-example")
	if err != nil {
		log.Fatal(err)
	}
	return pynox.Config{Workers: 1, Dir: dir}
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
		Timeout: pynox.Duration(200 * time.Millisecond),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(res.Err(), pynox.ErrTimeout))
	// Output:
	// true
}
