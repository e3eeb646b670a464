package dump

import (
	"encoding/binary"
	"fmt"
)

// ELF note types and names found in kernel dumps.
const (
	ntPRStatus = 1 // NT_PRSTATUS, owner "CORE": struct elf_prstatus
	// ntPRPSInfo is NT_PRPSINFO, owner "CORE": struct elf_prpsinfo, a
	// process core's command (/proc/kcore's is zeroed).
	ntPRPSInfo = 3
	// prpsinfoPID, prpsinfoFname and prpsinfoArgs are offsets in struct
	// elf_prpsinfo on x86-64 (pr_fname 16 bytes, pr_psargs 80).
	prpsinfoPID, prpsinfoFname, prpsinfoArgs, prpsinfoSize = 24, 40, 56, 136
	// prstatusSize is sizeof(struct elf_prstatus) on x86-64.
	prstatusSize = 336
	// prstatusPID and prstatusRegs are offsets in struct elf_prstatus.
	prstatusPID  = 32
	prstatusRegs = 112
	// qemuCPUStateMin is the size of QEMU's QEMUCPUState up to and
	// including cr[0..4] (version 1 of the structure).
	qemuCPUStateMin = 432
)

// Notes is what a dump's ELF notes say about the machine.
type Notes struct {
	CPUs       []CPU
	VMCoreInfo string
	// QEMU is set when QEMU wrote the notes (dump-guest-memory): its
	// NT_PRSTATUS pid is then the CPU number plus one, not a task.
	QEMU bool
	// Process is the command of a user process's core (gdb's gcore, the
	// kernel's core dump): NT_PRPSINFO naming one. Kernel dumps have
	// none (/proc/kcore's is zeroed).
	Process *ProcessInfo
}

// ProcessInfo is what a process core's NT_PRPSINFO says of it.
type ProcessInfo struct {
	PID        int
	Name, Args string // pr_fname (comm), pr_psargs (the command line, cut at 80 bytes)
}

// ParseNotes decodes a blob of little-endian 64-bit ELF notes (a PT_NOTE
// segment, or the notes a kdump-compressed header carries): one CPU per
// NT_PRSTATUS, control registers from QEMU's "QEMU" notes when present
// (matched to NT_PRSTATUS in order), and the VMCOREINFO text. Unknown
// notes are skipped; a note running past the blob is corrupt. fileOff is
// the blob's offset in the file, for error messages.
func ParseNotes(blob []byte, format string, fileOff int64) (*Notes, error) {
	n := &Notes{}
	var qemu []Regs
	for off := 0; off < len(blob); {
		if len(blob)-off < 12 {
			// Trailing padding (zeros) is common; anything else is not.
			if allZero(blob[off:]) {
				break
			}
			return nil, &CorruptError{format, fileOff + int64(off), "truncated note header"}
		}
		namesz := binary.LittleEndian.Uint32(blob[off:])
		descsz := binary.LittleEndian.Uint32(blob[off+4:])
		typ := binary.LittleEndian.Uint32(blob[off+8:])
		if namesz == 0 && descsz == 0 && typ == 0 {
			break // zero padding after the last note
		}
		nameEnd := uint64(off) + 12 + uint64(namesz)
		descOff := align4(nameEnd)
		descEnd := descOff + uint64(descsz)
		if descEnd > uint64(len(blob)) {
			return nil, &CorruptError{format, fileOff + int64(off), fmt.Sprintf("note of %d+%d bytes runs past the %d-byte note segment", namesz, descsz, len(blob))}
		}
		name := cstring(blob[off+12 : nameEnd])
		desc := blob[descOff:descEnd]
		switch {
		case name == "CORE" && typ == ntPRStatus:
			if len(desc) < prstatusRegs+23*8 {
				return nil, &CorruptError{format, fileOff + int64(descOff), fmt.Sprintf("NT_PRSTATUS of %d bytes, want %d", len(desc), prstatusSize)}
			}
			cpu := CPU{Index: len(n.CPUs), PID: int(int32(binary.LittleEndian.Uint32(desc[prstatusPID:])))}
			cpu.Regs = prstatusRegsOf(desc[prstatusRegs:])
			n.CPUs = append(n.CPUs, cpu)
		case name == "QEMU":
			if len(desc) < qemuCPUStateMin {
				return nil, &CorruptError{format, fileOff + int64(descOff), fmt.Sprintf("QEMU CPU note of %d bytes, want at least %d", len(desc), qemuCPUStateMin)}
			}
			n.QEMU = true
			qemu = append(qemu, qemuRegsOf(desc))
		case name == "CORE" && typ == ntPRPSInfo && len(desc) >= prpsinfoSize:
			if fname := cstring(desc[prpsinfoFname:prpsinfoArgs]); fname != "" {
				n.Process = &ProcessInfo{PID: int(int32(binary.LittleEndian.Uint32(desc[prpsinfoPID:]))),
					Name: fname, Args: cstring(desc[prpsinfoArgs:prpsinfoSize])}
			}
		case name == "VMCOREINFO":
			n.VMCoreInfo = cstring(desc)
		}
		off = int(align4(descEnd))
	}
	for i := range n.CPUs {
		if i < len(qemu) {
			r := &n.CPUs[i].Regs
			r.CR0, r.CR2, r.CR3, r.CR4 = qemu[i].CR0, qemu[i].CR2, qemu[i].CR3, qemu[i].CR4
		}
		if n.QEMU {
			n.CPUs[i].PID = 0 // QEMU writes the CPU number there
		}
	}
	if len(n.CPUs) == 0 {
		// A QEMU dump always has NT_PRSTATUS; take QEMU's own notes if a
		// dumper wrote only those.
		for i, r := range qemu {
			n.CPUs = append(n.CPUs, CPU{Index: i, Regs: r})
		}
	}
	return n, nil
}

func prstatusRegsOf(b []byte) Regs {
	var v [23]uint64
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return Regs{R15: v[0], R14: v[1], R13: v[2], R12: v[3], RBP: v[4], RBX: v[5], R11: v[6], R10: v[7],
		R9: v[8], R8: v[9], RAX: v[10], RCX: v[11], RDX: v[12], RSI: v[13], RDI: v[14],
		OrigRAX: v[15], RIP: v[16], CS: v[17], EFLAGS: v[18], RSP: v[19], SS: v[20], FSBase: v[21], GSBase: v[22]}
}

// qemuRegsOf decodes QEMU's QEMUCPUState (target/i386/arch_dump.c):
// version, size, rax rbx rcx rdx rsi rdi rsp rbp r8–r15 rip rflags, ten
// 24-byte segment descriptors (cs ds es fs gs ss ldt tr gdt idt), cr[5].
func qemuRegsOf(b []byte) Regs {
	q := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8+i*8:]) }
	seg := func(i int) (sel uint64, base uint64) {
		o := 152 + i*24
		return uint64(binary.LittleEndian.Uint32(b[o:])), binary.LittleEndian.Uint64(b[o+16:])
	}
	r := Regs{RAX: q(0), RBX: q(1), RCX: q(2), RDX: q(3), RSI: q(4), RDI: q(5), RSP: q(6), RBP: q(7),
		R8: q(8), R9: q(9), R10: q(10), R11: q(11), R12: q(12), R13: q(13), R14: q(14), R15: q(15),
		RIP: q(16), EFLAGS: q(17)}
	r.CS, _ = seg(0)
	r.SS, _ = seg(5)
	_, r.FSBase = seg(3)
	_, r.GSBase = seg(4)
	cr := func(i int) uint64 { return binary.LittleEndian.Uint64(b[392+i*8:]) }
	r.CR0, r.CR2, r.CR3, r.CR4 = cr(0), cr(2), cr(3), cr(4)
	return r
}

func align4(v uint64) uint64 { return (v + 3) &^ 3 }

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
