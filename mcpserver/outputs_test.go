package mcpserver_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/mcpserver"
)

// TestRichOutputsAsContent: a job's rich outputs come back as MCP
// content: a PNG as image content (the decoded bytes, starting with the
// PNG signature), HTML as an embedded resource with its MIME type.
func TestRichOutputsAsContent(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1, Limits: pynox.Limits{AllowRead: []string{dir}}})
	require.NoError(t, err)
	defer p.Close()
	cs := connect(t, ctx, mcpserver.New(p, "test"), "outputs")
	// A 1x1 PNG, shown through _repr_png_, and an HTML fragment.
	code := "import base64\nfrom pynox_display import display, HTML\n" +
		"png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==')\n" +
		"class P:\n    def _repr_png_(self):\n        return png\n" +
		"display(P())\ndisplay(HTML('<b>hi</b>'))\n"
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	var image *mcp.ImageContent
	var html *mcp.EmbeddedResource
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.ImageContent:
			image = c
		case *mcp.EmbeddedResource:
			html = c
		}
	}
	require.NotNil(t, image, "no image content")
	require.Equal(t, "image/png", image.MIMEType)
	require.True(t, bytes.HasPrefix(image.Data, []byte("\x89PNG\r\n\x1a\n")), "%q", image.Data)
	require.NotNil(t, html, "no embedded resource")
	require.Equal(t, "text/html", html.Resource.MIMEType)
	require.Equal(t, "<b>hi</b>", html.Resource.Text)
}
