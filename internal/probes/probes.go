// Package probes holds the Python sources of hostile probes that the
// tests of more than one package run (the root package drives them through
// the Go API, package jsonl through the JSON Lines stream). Only tests
// import it.
package probes

// Forger writes forged pool results, host-call events and control
// frames to every descriptor it can reach, raw, newline-delimited and
// length-prefixed, naming the ids of other jobs in the same stream.
const Forger = `import json, os, socket, struct, time
victims = json.loads(os.environ["VICTIMS"])
objs = [{"t": "done", "exit": 0, "error": None}, {"t": "started"}, {"t": "setup_error", "msg": "x"},
        {"t": "spare", "pid": 1}, {"t": "exit", "pid": os.getppid(), "code": 0}, {"t": "fatal", "msg": "x"},
        {"t": "call", "call_id": 1, "function": "rm", "args": ["-rf", "/"]}, {"t": "fork"},
        {"event": "ready", "workers": 99, "runtime": "pynox"},
        {"id": "forged-stats", "event": "stats", "jobs": 0},
        {"event": "call", "id": "forged-call", "call_id": 7, "function": "rm", "args": ["/"], "kwargs": {}}]
for i, v in enumerate(victims):
    objs.append({"id": v, "exit": 0, "stdout": "FORGED", "stderr": "", "error": None})
    objs.append({"event": "call", "id": v, "call_id": i, "function": "exfiltrate", "args": [], "kwargs": {}})
    objs.append({"id": "forged-%d" % i, "exit": 0, "stdout": "FORGED", "error": None})
forgeries = []
for o in objs:
    data = json.dumps(o).encode()
    forgeries += [data, b"\n" + data + b"\n", struct.pack("<I", len(data)) + data]
hit = 0
for fd in range(0, 1024):
    if fd == 3:
        continue  # the control channel last: breaking it ends this job
    for f in forgeries:
        try:
            os.write(fd, f)
            hit += 1
        except OSError:
            pass
mode = os.environ["MODE"]
if mode == "rights":
    s = socket.socket(fileno=3)
    for _ in range(200):
        try:
            socket.send_fds(s, [b"\0\0\0\0"], [0, 1, 2])
        except OSError:
            break
elif mode == "huge":
    os.write(3, b"\xff\xff\xff\x7f" + b"A" * 4096)
elif mode == "frames":
    for f in forgeries:
        try:
            os.write(3, f)
        except OSError:
            break
print("wrote", hit, flush=True)
time.sleep(0.2)
`

// ForgeCall is Python defining call(payload): it writes payload (bytes, a
// whole "call" frame's JSON) on the control channel, rings the bell, and
// prints the host's reply frame.
const ForgeCall = "import os, struct\n" +
	"def read(n):\n" +
	"    b = b''\n" +
	"    while len(b) < n:\n" +
	"        c = os.read(3, n - len(b))\n" +
	"        if not c:\n" +
	"            raise SystemExit('channel closed')\n" +
	"        b += c\n" +
	"    return b\n" +
	"def call(payload):\n" +
	"    os.write(3, struct.pack('<I', len(payload)) + payload)\n" +
	"    os.write(4, b'!')\n" +
	"    n = struct.unpack('<I', read(4))[0]\n" +
	"    print(read(n).decode())\n"

// BadCallArgs are forged call frames (Python bytes expressions) whose
// arguments Go's JSON decoder accepts but Python's json module does not.
var BadCallArgs = []struct{ Name, Frame string }{
	{"invalid UTF-8 in args", `b'{"t":"call","step":1,"function":"f","args":["\xff\xfe"],"kwargs":{}}'`},
	{"invalid UTF-8 in kwargs", `b'{"t":"call","step":1,"function":"f","args":[],"kwargs":{"k":"a\xc3"}}'`},
	{"5,000-deep args", `b'{"t":"call","step":1,"function":"f","args":' + b'[' * 5000 + b']' * 5000 + b',"kwargs":{}}'`},
	{"5,000-deep kwargs", `b'{"t":"call","step":1,"function":"f","args":[],"kwargs":{"k":' + b'{"k":' * 4999 + b'1' + b'}' * 4999 + b'}}'`},
	{"5,000-digit integer", `b'{"t":"call","step":1,"function":"f","args":[' + b'7' * 5000 + b'],"kwargs":{}}'`},
	{"5,000-digit kwarg", `b'{"t":"call","step":1,"function":"f","args":[],"kwargs":{"n":-' + b'7' * 5000 + b'}}'`},
}
