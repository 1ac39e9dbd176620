package pynox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/pynox/pynox"
)

// Concurrent tool calls: the job's code awaits three host calls together
// through pynox_host.aio, and the host answers them concurrently, each on
// its own goroutine. A tool declared with a signature checks its calls
// before they reach the host, and a host error can keep a builtin type.
func ExampleHostFunc_concurrent() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	fetch := func(ctx context.Context, call *pynox.Call) (any, error) {
		var args []string
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, pynox.RaiseAs("TypeError", "fetch(url) takes one url")
		}
		if !strings.HasPrefix(args[0], "https://") {
			return nil, pynox.RaiseAs("PermissionError", "only https is allowed")
		}
		select { // a slow backend: the three calls wait together
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return "page of " + args[0], nil
	}
	res, err := pool.Run(context.Background(), pynox.Job{
		Tools: []pynox.Tool{{Name: "fetch", Doc: "Fetches a page.", Signature: "(url: str) -> str"}},
		Host:  fetch,
		Code: `import asyncio
from pynox_host import aio, fetch

async def main():
    urls = ['https://a.example', 'https://b.example', 'https://c.example']
    return await asyncio.gather(*(aio.fetch(u) for u in urls))

for page in asyncio.run(main()):
    print(page)
try:
    fetch('http://plain.example')
except PermissionError as e:
    print('PermissionError:', e)
try:
    fetch('https://a.example', link=True)
except TypeError as e:
    print('TypeError:', e)
`,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	fmt.Println(res.Calls, "calls reached the host")
	// Output:
	// page of https://a.example
	// page of https://b.example
	// page of https://c.example
	// PermissionError: only https is allowed
	// TypeError: fetch(): got an unexpected keyword argument 'link'
	// 4 calls reached the host
}
