//go:build linux

package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Data mirrors the kernel's struct seccomp_data, the input of a seccomp filter.
type Data struct {
	// Nr is the system call number.
	Nr int32
	// Arch is the AUDIT_ARCH_* value of the calling convention.
	Arch uint32
	// InstructionPointer is the address of the system call instruction.
	InstructionPointer uint64
	// Args are the six system call arguments.
	Args [6]uint64
}

// seccompDataSize is sizeof(struct seccomp_data).
const seccompDataSize = 64

// bytes lays d out exactly as the kernel does, in native byte order.
func (d *Data) bytes() [seccompDataSize]byte {
	var buf [seccompDataSize]byte
	ne := binary.NativeEndian
	ne.PutUint32(buf[offNr:], uint32(d.Nr))
	ne.PutUint32(buf[offArch:], d.Arch)
	ne.PutUint64(buf[offIP:], d.InstructionPointer)
	for i, a := range d.Args {
		ne.PutUint64(buf[offArgs+8*i:], a)
	}
	return buf
}

// errInvalid is wrapped by every error Run returns for a program the kernel
// would reject.
var errInvalid = errors.New("invalid seccomp program")

func invalid(pc int, format string, args ...any) error {
	return fmt.Errorf("%w: pc %d: %s", errInvalid, pc, fmt.Sprintf(format, args...))
}

// validate applies the checks of the kernel's bpf_check_classic,
// check_load_and_stores and seccomp_check_filter, restricted to the
// instruction subset Run implements.
func (p Program) validate() error {
	if len(p) == 0 {
		return fmt.Errorf("%w: empty program", errInvalid)
	}
	if len(p) > unix.BPF_MAXINSNS {
		return fmt.Errorf("%w: %d instructions, more than %d", errInvalid, len(p), unix.BPF_MAXINSNS)
	}
	n := len(p)
	for pc, ins := range p {
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if ins.K >= seccompDataSize {
				return invalid(pc, "load at offset %d outside seccomp_data", ins.K)
			}
			if ins.K&3 != 0 {
				return invalid(pc, "unaligned load at offset %d", ins.K)
			}
		case unix.BPF_LD | unix.BPF_W | unix.BPF_LEN,
			unix.BPF_LDX | unix.BPF_W | unix.BPF_LEN,
			unix.BPF_LD | unix.BPF_IMM,
			unix.BPF_LDX | unix.BPF_IMM,
			unix.BPF_MISC | unix.BPF_TAX,
			unix.BPF_MISC | unix.BPF_TXA,
			unix.BPF_RET | unix.BPF_K,
			unix.BPF_RET | unix.BPF_A,
			unix.BPF_ALU | unix.BPF_AND | unix.BPF_K,
			unix.BPF_ALU | unix.BPF_OR | unix.BPF_K,
			unix.BPF_ALU | unix.BPF_ADD | unix.BPF_K,
			unix.BPF_ALU | unix.BPF_SUB | unix.BPF_K:
		case unix.BPF_ALU | unix.BPF_LSH | unix.BPF_K,
			unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K:
			if ins.K >= 32 {
				return invalid(pc, "shift by %d", ins.K)
			}
		case unix.BPF_LD | unix.BPF_MEM,
			unix.BPF_LDX | unix.BPF_MEM,
			unix.BPF_ST,
			unix.BPF_STX:
			if ins.K >= unix.BPF_MEMWORDS {
				return invalid(pc, "scratch memory index %d out of range", ins.K)
			}
		case unix.BPF_JMP | unix.BPF_JA:
			if ins.K >= uint32(n-pc-1) {
				return invalid(pc, "jump out of range (ja +%d)", ins.K)
			}
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			if pc+int(ins.Jt)+1 >= n || pc+int(ins.Jf)+1 >= n {
				return invalid(pc, "jump out of range (jt %d, jf %d)", ins.Jt, ins.Jf)
			}
		default:
			return invalid(pc, "unsupported opcode %#04x", ins.Code)
		}
	}
	if p[n-1].Code&0x07 != unix.BPF_RET {
		return invalid(n-1, "program does not end with a return")
	}

	// Every scratch-memory load must follow a store on all paths.
	masks := make([]uint16, n)
	for i := range masks {
		masks[i] = 0xffff
	}
	var valid uint16
	for pc, ins := range p {
		valid &= masks[pc]
		switch ins.Code {
		case unix.BPF_ST, unix.BPF_STX:
			valid |= 1 << ins.K
		case unix.BPF_LD | unix.BPF_MEM, unix.BPF_LDX | unix.BPF_MEM:
			if valid&(1<<ins.K) == 0 {
				return invalid(pc, "load of scratch word %d before any store", ins.K)
			}
		case unix.BPF_JMP | unix.BPF_JA:
			masks[pc+1+int(ins.K)] &= valid
			valid = 0xffff
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			masks[pc+1+int(ins.Jt)] &= valid
			masks[pc+1+int(ins.Jf)] &= valid
			valid = 0xffff
		}
	}
	return nil
}

// Run interprets the program in user space against d, as the kernel would,
// and returns the seccomp return value (action|data). It returns an error
// wrapping an "invalid seccomp program" error, without running anything, if
// the kernel would reject the program: an unsupported opcode, a jump out of
// range, a load outside struct seccomp_data or not 4-byte aligned, a scratch
// load before a store, or a program that can fall off its end. The supported
// subset is BPF_LD|BPF_W|BPF_ABS, BPF_LD/BPF_LDX with BPF_IMM, BPF_MEM and
// BPF_W|BPF_LEN, BPF_ST, BPF_STX, BPF_ALU AND/OR/ADD/SUB/LSH/RSH with BPF_K,
// BPF_JMP JA and JEQ/JGT/JGE/JSET with BPF_K, BPF_RET with BPF_K or BPF_A,
// and BPF_MISC TAX/TXA.
func (p Program) Run(d Data) (uint32, error) {
	if err := p.validate(); err != nil {
		return 0, err
	}
	data := d.bytes()
	var a, x uint32
	var mem [unix.BPF_MEMWORDS]uint32
	for pc := 0; pc < len(p); pc++ {
		ins := p[pc]
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			a = binary.NativeEndian.Uint32(data[ins.K:])
		case unix.BPF_LD | unix.BPF_W | unix.BPF_LEN:
			a = seccompDataSize
		case unix.BPF_LDX | unix.BPF_W | unix.BPF_LEN:
			x = seccompDataSize
		case unix.BPF_LD | unix.BPF_IMM:
			a = ins.K
		case unix.BPF_LDX | unix.BPF_IMM:
			x = ins.K
		case unix.BPF_LD | unix.BPF_MEM:
			a = mem[ins.K]
		case unix.BPF_LDX | unix.BPF_MEM:
			x = mem[ins.K]
		case unix.BPF_ST:
			mem[ins.K] = a
		case unix.BPF_STX:
			mem[ins.K] = x
		case unix.BPF_MISC | unix.BPF_TAX:
			x = a
		case unix.BPF_MISC | unix.BPF_TXA:
			a = x
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			a &= ins.K
		case unix.BPF_ALU | unix.BPF_OR | unix.BPF_K:
			a |= ins.K
		case unix.BPF_ALU | unix.BPF_ADD | unix.BPF_K:
			a += ins.K
		case unix.BPF_ALU | unix.BPF_SUB | unix.BPF_K:
			a -= ins.K
		case unix.BPF_ALU | unix.BPF_LSH | unix.BPF_K:
			a <<= ins.K
		case unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K:
			a >>= ins.K
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(ins.K)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += cond(a == ins.K, ins)
		case unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K:
			pc += cond(a > ins.K, ins)
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += cond(a >= ins.K, ins)
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			pc += cond(a&ins.K != 0, ins)
		case unix.BPF_RET | unix.BPF_K:
			return ins.K, nil
		case unix.BPF_RET | unix.BPF_A:
			return a, nil
		default:
			// Unreachable after validate.
			return 0, invalid(pc, "unsupported opcode %#04x", ins.Code)
		}
	}
	// Unreachable after validate: the last instruction is a return and every
	// jump lands inside the program.
	return 0, fmt.Errorf("%w: fell off the end of the program", errInvalid)
}

func cond(ok bool, ins unix.SockFilter) int {
	if ok {
		return int(ins.Jt)
	}
	return int(ins.Jf)
}
