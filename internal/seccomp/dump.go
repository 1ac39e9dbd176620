//go:build linux

package seccomp

import (
	"encoding/binary"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sockFilterSize is sizeof(struct sock_filter).
const sockFilterSize = 8

// Bytes returns the program as the kernel's struct sock_filter array in native
// byte order, 8 bytes per instruction (u16 code, u8 jt, u8 jf, u32 k); this is
// the buffer the Python side points a struct sock_fprog at.
func (p Program) Bytes() []byte {
	buf := make([]byte, sockFilterSize*len(p))
	for i, ins := range p {
		b := buf[sockFilterSize*i:]
		binary.NativeEndian.PutUint16(b[0:], ins.Code)
		b[2] = ins.Jt
		b[3] = ins.Jf
		binary.NativeEndian.PutUint32(b[4:], ins.K)
	}
	return buf
}

// What the accumulator is known to hold, for annotating the disassembly.
type accState uint8

const (
	accUnknown accState = iota
	accNr
	accArch
	accNone // no path reaches this instruction yet
)

// String returns a readable disassembly, one instruction per line with
// absolute jump targets, naming the system call wherever a comparison is made
// against the syscall number and decoding seccomp return values.
func (p Program) String() string {
	var names map[uint32]string
	var archNames map[uint32]string
	if nativeTable != nil {
		names = nativeTable.syscallNames()
	}
	archNames = map[uint32]string{
		unix.AUDIT_ARCH_X86_64:  "AUDIT_ARCH_X86_64",
		unix.AUDIT_ARCH_AARCH64: "AUDIT_ARCH_AARCH64",
		unix.AUDIT_ARCH_I386:    "AUDIT_ARCH_I386",
		unix.AUDIT_ARCH_ARM:     "AUDIT_ARCH_ARM",
	}

	// Forward data flow over the (forward-only) control flow graph.
	state := make([]accState, len(p)+1)
	for i := range state {
		state[i] = accNone
	}
	if len(p) > 0 {
		state[0] = accUnknown
	}
	merge := func(to int, s accState) {
		if to < 0 || to >= len(state) {
			return
		}
		switch state[to] {
		case accNone:
			state[to] = s
		case s:
		default:
			state[to] = accUnknown
		}
	}

	var sb strings.Builder
	for pc, ins := range p {
		in := state[pc]
		out := in
		var text, note string
		k := ins.K
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			text = fmt.Sprintf("ld [%d]", k)
			note = fieldName(k)
			switch k {
			case offNr:
				out = accNr
			case offArch:
				out = accArch
			default:
				out = accUnknown
			}
		case unix.BPF_LD | unix.BPF_W | unix.BPF_LEN:
			text, out = "ld #len", accUnknown
		case unix.BPF_LDX | unix.BPF_W | unix.BPF_LEN:
			text = "ldx #len"
		case unix.BPF_LD | unix.BPF_IMM:
			text, out = fmt.Sprintf("ld #%#x", k), accUnknown
		case unix.BPF_LDX | unix.BPF_IMM:
			text = fmt.Sprintf("ldx #%#x", k)
		case unix.BPF_LD | unix.BPF_MEM:
			text, out = fmt.Sprintf("ld M[%d]", k), accUnknown
		case unix.BPF_LDX | unix.BPF_MEM:
			text = fmt.Sprintf("ldx M[%d]", k)
		case unix.BPF_ST:
			text = fmt.Sprintf("st M[%d]", k)
		case unix.BPF_STX:
			text = fmt.Sprintf("stx M[%d]", k)
		case unix.BPF_MISC | unix.BPF_TAX:
			text = "tax"
		case unix.BPF_MISC | unix.BPF_TXA:
			text, out = "txa", accUnknown
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			text, out = fmt.Sprintf("and #%#x", k), accUnknown
		case unix.BPF_ALU | unix.BPF_OR | unix.BPF_K:
			text, out = fmt.Sprintf("or #%#x", k), accUnknown
		case unix.BPF_ALU | unix.BPF_ADD | unix.BPF_K:
			text, out = fmt.Sprintf("add #%#x", k), accUnknown
		case unix.BPF_ALU | unix.BPF_SUB | unix.BPF_K:
			text, out = fmt.Sprintf("sub #%#x", k), accUnknown
		case unix.BPF_ALU | unix.BPF_LSH | unix.BPF_K:
			text, out = fmt.Sprintf("lsh #%d", k), accUnknown
		case unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K:
			text, out = fmt.Sprintf("rsh #%d", k), accUnknown
		case unix.BPF_JMP | unix.BPF_JA:
			text = fmt.Sprintf("ja %d", pc+1+int(k))
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			op := map[uint16]string{
				unix.BPF_JEQ: "jeq", unix.BPF_JGT: "jgt", unix.BPF_JGE: "jge", unix.BPF_JSET: "jset",
			}[ins.Code&0xf0]
			switch {
			case in == accNr && ins.Code&0xf0 == unix.BPF_JEQ:
				text = fmt.Sprintf("%s #%d", op, k)
				if n, ok := names[k]; ok {
					note = n
				} else {
					note = fmt.Sprintf("syscall %d", k)
				}
			case in == accNr && ins.Code&0xf0 == unix.BPF_JGE && k == x32SyscallBit:
				text, note = fmt.Sprintf("%s #%#x", op, k), "__X32_SYSCALL_BIT"
			case in == accArch:
				text, note = fmt.Sprintf("%s #%#x", op, k), archNames[k]
			default:
				text = fmt.Sprintf("%s #%#x", op, k)
			}
			text += fmt.Sprintf(" jt %d jf %d", pc+1+int(ins.Jt), pc+1+int(ins.Jf))
		case unix.BPF_RET | unix.BPF_K:
			text, note = fmt.Sprintf("ret #%#x", k), retName(k)
		case unix.BPF_RET | unix.BPF_A:
			text = "ret a"
		default:
			text = fmt.Sprintf("unknown code=%#04x jt=%d jf=%d k=%#x", ins.Code, ins.Jt, ins.Jf, k)
			out = accUnknown
		}

		// Propagate to successors.
		switch {
		case ins.Code&0x07 == unix.BPF_RET:
		case ins.Code == unix.BPF_JMP|unix.BPF_JA:
			merge(pc+1+int(k), out)
		case ins.Code&0x07 == unix.BPF_JMP:
			merge(pc+1+int(ins.Jt), out)
			merge(pc+1+int(ins.Jf), out)
		default:
			merge(pc+1, out)
		}

		if note != "" {
			fmt.Fprintf(&sb, "%04d: %-36s ; %s\n", pc, text, note)
		} else {
			fmt.Fprintf(&sb, "%04d: %s\n", pc, text)
		}
	}
	return sb.String()
}

// fieldName names the struct seccomp_data field at byte offset off.
func fieldName(off uint32) string {
	switch {
	case off == offNr:
		return "nr"
	case off == offArch:
		return "arch"
	case off == offIP:
		return "instruction_pointer (low)"
	case off == offIP+4:
		return "instruction_pointer (high)"
	case off >= offArgs && off < seccompDataSize:
		i := (off - offArgs) / 8
		if (off-offArgs)%8 == 0 {
			return fmt.Sprintf("args[%d] (low)", i)
		}
		return fmt.Sprintf("args[%d] (high)", i)
	}
	return ""
}

// retName decodes a seccomp return value.
func retName(v uint32) string {
	data := v & unix.SECCOMP_RET_DATA
	switch v & unix.SECCOMP_RET_ACTION_FULL {
	case unix.SECCOMP_RET_KILL_PROCESS:
		return "KILL_PROCESS"
	case unix.SECCOMP_RET_KILL_THREAD:
		return "KILL_THREAD"
	case unix.SECCOMP_RET_TRAP:
		return "TRAP"
	case unix.SECCOMP_RET_ERRNO:
		if name := unix.ErrnoName(syscall.Errno(data)); name != "" {
			return "ERRNO(" + name + ")"
		}
		return fmt.Sprintf("ERRNO(%d)", data)
	case unix.SECCOMP_RET_USER_NOTIF:
		return "USER_NOTIF"
	case unix.SECCOMP_RET_TRACE:
		return fmt.Sprintf("TRACE(%d)", data)
	case unix.SECCOMP_RET_LOG:
		return "LOG"
	case unix.SECCOMP_RET_ALLOW:
		return "ALLOW"
	}
	return ""
}
