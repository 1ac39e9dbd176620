#!/bin/sh
# Runs $PYNOX_REAL with these arguments and copies its output, putting lines
# Python's json module cannot read after the ready line: invalid UTF-8,
# 5,000-deep nesting, a 5,000-digit integer, a call event and a result that
# do not decode.
"$PYNOX_REAL" "$@" | /usr/bin/python3 -c '
import sys
out = sys.stdout.buffer
lines = iter(sys.stdin.buffer.readline, b"")
out.write(next(lines))
out.write(b"{\"id\":\"x\",\"stdout\":\"\xff\xfe\"}\n")
out.write(b"[" * 5000 + b"]" * 5000 + b"\n")
out.write(b"{\"id\":\"py-77\",\"n\":" + b"7" * 5000 + b"}\n")
out.write(b"{\"event\":\"call\",\"id\":\"py-9\",\"call_id\":123456,\"function\":\"f\",\"args\":[\"\xff\"],\"kwargs\":{}}\n")
out.write(b"not json at all\n")
out.flush()
for line in lines:
    out.write(line)
    out.flush()
'
