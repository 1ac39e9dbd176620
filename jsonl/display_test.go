package jsonl

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// A streamed request's rich outputs arrive as display events before its
// result, in order and equal to the result's outputs; a session step's
// carry the session's name; a request without "stream" gets none. The Go
// client passes them to OnDisplay.
func TestServeStreamDisplay(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "stream": true, "code": "from pynox_display import display, HTML\ndisplay(HTML('<b>1</b>'))\nprint('between', flush=True)\ndisplay(HTML('<b>2</b>'))"}`)
	var displays []map[string]any
	var res map[string]any
	for {
		m := ls.take("a line for id 1", func(m map[string]any) bool { return fmt.Sprint(m["id"]) == "1" })
		if m["event"] == "display" {
			displays = append(displays, m)
			continue
		}
		if m["event"] == "output" {
			continue
		}
		res = m
		break
	}
	require.Nil(t, res["error"], "%v", res)
	require.Len(t, displays, 2)
	require.Equal(t, "text/html", displays[0]["mime"])
	require.Equal(t, "<b>1</b>", displays[0]["data"])
	require.Equal(t, "<b>2</b>", displays[1]["data"])
	require.NotContains(t, displays[0], "session")
	outs := res["outputs"].([]any)
	require.Len(t, outs, 2)
	require.Equal(t, map[string]any{"mime": "text/html", "data": "<b>2</b>"}, outs[1])

	ls.send(`{"id": 2, "session": "nb", "stream": true, "code": "from pynox_display import display\ndisplay({'a': 1})"}`)
	events, res := ls.untilResultDisplay("2")
	require.Len(t, events, 1)
	require.Equal(t, "nb", events[0]["session"])
	require.Equal(t, "text/plain", events[0]["mime"])
	require.Equal(t, "{'a': 1}", events[0]["data"])
	require.Len(t, res["outputs"], 1)

	ls.send(`{"id": 3, "code": "from pynox_display import display\ndisplay(3)"}`)
	events, res = ls.untilResultDisplay("3")
	require.Empty(t, events)
	require.Equal(t, []any{map[string]any{"mime": "text/plain", "data": "3"}}, res["outputs"])
	require.Empty(t, ls.finish())
}

// untilResultDisplay is untilResult with display events too.
func (ls *liveServe) untilResultDisplay(id string) (events []map[string]any, result map[string]any) {
	ls.t.Helper()
	for {
		m := ls.take("a line for id "+id, func(m map[string]any) bool { return fmt.Sprint(m["id"]) == id })
		if m["event"] == "display" || m["event"] == "output" {
			if m["event"] == "display" {
				events = append(events, m)
			}
			continue
		}
		return events, m
	}
}

func TestClientStreamDisplay(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	ctx := context.Background()
	var got []pynox.Output
	res, err := c.Run(ctx, pynox.Job{Code: "from pynox_display import display, Markdown\ndisplay(Markdown('# hi'))",
		OnDisplay: func(o pynox.Output) { got = append(got, o) }})
	require.NoError(t, err)
	require.Nil(t, res.Error, "%+v", res.Error)
	require.Equal(t, []pynox.Output{{MIME: "text/markdown", Data: "# hi"}}, got)
	require.Equal(t, got, res.Outputs)

	got = nil
	s := c.Session("cd", pynox.Job{})
	res, err = s.Run(ctx, pynox.Step{Code: "from pynox_display import display\ndisplay(7)", OnDisplay: func(o pynox.Output) { got = append(got, o) }})
	require.NoError(t, err)
	require.Equal(t, []pynox.Output{{MIME: "text/plain", Data: "7"}}, got)
	require.NoError(t, s.Close(ctx))
}
