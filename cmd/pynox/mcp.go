package main

import (
	"context"
	"errors"
	"io"
	"runtime/debug"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/mcpserver"
)

// mcpUsage is `pynox mcp --help`: the server's own text, then the pool's
// flags, which it shares.
var mcpUsage = `Usage: pynox mcp [flags]

Serves the Model Context Protocol (MCP) on stdin and stdout, for one MCP
client that starts it (Claude Desktop, an IDE, an agent framework). Its
tools:
  run_python     {"code", "session"?, "inputs"?, "profile"?, "timeout_seconds"?}:
                 run Python and return stdout, stderr, the last expression's
                 value and the error; with "session", variables persist
                 between calls
  reset_session  {"session"}: end a session, discarding its variables
A client cannot widen the ceiling: it passes no paths, memory or network
switch, only the name of one of the configured profiles and a timeout up to
the ceiling's. Sessions belong to the MCP session that opened them. Nothing
but MCP messages is written to stdout; --log=json lines go to stderr.

Register it with a client (Claude Desktop's claude_desktop_config.json):
  {"mcpServers": {"pynox": {"command": "/usr/local/bin/pynox",
    "args": ["mcp", "--config=/etc/pynox/mcp.toml"]}}}

` + poolUsage[strings.Index(poolUsage, "Flags (each"):]

// mcpCommand is `pynox mcp`: the pool of `pynox pool`, served to an MCP
// client on stdin and stdout until the client disconnects (end of input)
// or a SIGTERM or SIGINT arrives.
func mcpCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return servePool("mcp", mcpUsage, args, stdout, stderr, func(ctx context.Context, p *pynox.Pool) error {
		t := &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
		err := mcpserver.New(p, buildVersion()).Run(ctx, t)
		if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
			return nil // a signal, or the client closed its end
		}
		return err
	})
}

// nopWriteCloser is stdout as an io.WriteCloser whose Close does nothing:
// the command's stdout outlives the MCP connection.
type nopWriteCloser struct{ io.Writer }

// Close does nothing (io.Closer).
func (nopWriteCloser) Close() error { return nil }

// buildVersion is the version the MCP server reports: the module's, or
// "(devel)" for a build outside a module version.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
