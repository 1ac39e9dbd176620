package pynox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pynox/pynox"
)

// Inputs become globals before the code runs; the value of the code's
// last expression comes back as JSON, or as its repr when it has no JSON
// form.
func ExampleJob_inputs() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res, err := pool.Run(context.Background(), pynox.Job{
		Code:   "kept = [r for r in rows if r['n'] > limit]\nkept",
		Inputs: map[string]any{"rows": []map[string]int{{"n": 1}, {"n": 5}}, "limit": 2},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Value))

	res, err = pool.Run(context.Background(), pynox.Job{Code: "{3, 1, 2}"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.ValueRepr)
	// Output:
	// [{"n":5}]
	// {1, 2, 3}
}
