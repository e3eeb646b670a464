package offcpu

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kinst/kinst/unwind"
)

// userFrame is one user pc, kept raw until the profile is symbolised (the
// key of a stack includes the pid, so a pc names the same code every time
// it is seen).
type userFrame struct{ pc uint64 }

func appendFrame(key []byte, f userFrame) []byte {
	return binary.LittleEndian.AppendUint64(key, f.pc)
}

// maxUserFrames bounds a user stack.
const maxUserFrames = 64

// reloadAfter is how long a process's mappings are trusted before a pc
// outside all of them makes the sampler read them again (dlopen).
const reloadAfter = time.Second

// userStacks unwinds the user stacks of threads blocked in system calls
// and names their frames. Files (CFI tables and symbols) are cached by
// build id across processes; each process's mappings are read once and
// kept until the profile is symbolised, so a process that exits in the
// meantime still gets names.
type userStacks struct {
	files *unwind.Cache
	procs map[int]*userProcess
	seen  []*unwind.Process // every process read, for debugNotes
}

type userProcess struct {
	p      *unwind.Process
	err    error
	loaded time.Time
}

func newUserStacks() *userStacks {
	return &userStacks{files: unwind.NewCache(), procs: map[int]*userProcess{}}
}

func (u *userStacks) process(pid int) (*unwind.Process, error) {
	up := u.procs[pid]
	if up == nil {
		up = &userProcess{loaded: time.Now()}
		up.p, up.err = u.files.Process(pid)
		u.procs[pid] = up
		if up.p != nil {
			u.seen = append(u.seen, up.p)
		}
	}
	return up.p, up.err
}

// forget drops what is known of pid's mappings: the pid now names
// another process. Stacks already taken keep the Process they used.
func (u *userStacks) forget(pid int) { delete(u.procs, pid) }

// errNoUserFrames is reported when a stack could not be unwound at all.
var errNoUserFrames = errors.New("user stack: pc outside any mapped file")

// unwind appends the frames of the thread of pid blocked at pc with stack
// pointer sp, innermost first, and returns the view of the process that
// names them.
func (u *userStacks) unwind(pid int, pc, sp uint64, out []userFrame) ([]userFrame, *unwind.Process, error) {
	p, err := u.process(pid)
	if err != nil {
		return out, nil, err
	}
	if !p.Mapped(pc) {
		// New code mapped since we read the mappings?
		if up := u.procs[pid]; time.Since(up.loaded) > reloadAfter {
			delete(u.procs, pid)
			if p, err = u.process(pid); err != nil {
				return out, nil, err
			}
		}
	}
	pcs := p.Unwind(unwind.Regs{PC: pc, SP: sp}, maxUserFrames)
	if len(pcs) == 0 {
		return out, p, errNoUserFrames
	}
	for _, x := range pcs {
		out = append(out, userFrame{pc: x})
	}
	return out, p, nil
}

// names symbolises frames unwound in p, innermost first.
func names(p *unwind.Process, fs []userFrame) []string {
	if len(fs) == 0 {
		return nil
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = symbolName(p, i, f.pc)
	}
	return out
}

// framePointerNames names a user stack that BPF unwound by frame
// pointers in process pid, as it is mapped now. Through code built
// without frame pointers that walk reads arbitrary words: the stack ends
// at the first address outside the process's mapped files, marked
// "[unknown]" as BCC does.
func (u *userStacks) framePointerNames(pid int, pcs []uint64) []string {
	p, err := u.process(pid)
	var out []string
	for i, pc := range pcs {
		if err != nil {
			out = append(out, "0x"+strconv.FormatUint(pc, 16))
			continue
		}
		if _, ok := p.Symbolize(callerPC(i, pc)); !ok {
			return append(out, "[unknown]")
		}
		out = append(out, symbolName(p, i, pc))
	}
	return out
}

// symbolName names frame i of a stack, whose pc is pc: the function, else
// file+offset of the pc itself, else the address.
func symbolName(p *unwind.Process, i int, pc uint64) string {
	lookup := callerPC(i, pc)
	if p != nil {
		if s, ok := p.Symbolize(lookup); ok {
			if s.Name != "" {
				return s.Name
			}
			return filepath.Base(s.File) + "+0x" + strconv.FormatUint(s.Offset+pc-lookup, 16)
		}
	}
	return "0x" + strconv.FormatUint(pc, 16)
}

// callerPC is the address to symbolise for frame i of a stack: the pc
// itself for the innermost frame, and the byte before a return address
// for the others, which is inside the call (a call to a function that
// never returns may be the last instruction of its caller).
func callerPC(i int, pc uint64) uint64 {
	if i > 0 && pc > 0 {
		return pc - 1
	}
	return pc
}
