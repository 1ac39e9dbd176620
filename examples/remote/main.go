// Command remote runs Python on a `pynox serve` server through the Go API:
// jsonl.Dial returns a *pynox.Pool whose Run and Checkout work as a local
// pool's, over the server's WebSocket.
//
//	pynox serve --listen=127.0.0.1:8080 --token-file=tokens &
//	PYNOX_TOKEN=... go run ./examples/remote -url=ws://127.0.0.1:8080/v1/pool
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/jsonl"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8080/v1/pool", "the server's WebSocket endpoint")
	flag.Parse()
	if err := run(os.Stdout, *url, os.Getenv("PYNOX_TOKEN")); err != nil {
		log.Fatal(err)
	}
}

// run connects, runs a job with a host function, then a two-step session.
func run(out io.Writer, url, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := jsonl.Dial(ctx, url, jsonl.DialOptions{Token: token})
	if err != nil {
		return err // matches pynox.ErrDisconnected
	}
	defer pool.Close()

	// A job whose code calls a function of this program.
	res, err := pool.Run(ctx, pynox.Job{
		Code:      "from pynox_host import greet\nprint(greet('remote'))",
		Functions: []string{"greet"},
		Host: func(_ context.Context, call *pynox.Call) (any, error) {
			return "hello from the host, " + string(call.Args), nil
		},
	})
	if errors.Is(err, pynox.ErrDisconnected) {
		return fmt.Errorf("the connection dropped under the job; retry: %w", err)
	} else if err != nil {
		return err
	}
	fmt.Fprint(out, res.Stdout)

	// A session keeps its variables between steps.
	session, err := pool.Checkout(ctx, pynox.Job{})
	if err != nil {
		return err
	}
	defer session.Finish(ctx)
	if _, err := session.Feed(ctx, pynox.Step{Code: "total = 40"}); err != nil {
		return err
	}
	ev, err := session.Feed(ctx, pynox.Step{Code: "total + 2"})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "value: %s\n", ev.Result.Value)
	return nil
}
