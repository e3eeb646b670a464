package offcpu

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// userFrame is one user return address, kept raw until the profile is
// symbolised: obj indexes userStacks.objs, addr is the link-time address
// in that object (or the absolute address when obj < 0).
type userFrame struct {
	obj  int32
	addr uint64
}

func appendFrame(key []byte, f userFrame) []byte {
	key = binary.LittleEndian.AppendUint32(key, uint32(f.obj))
	return binary.LittleEndian.AppendUint64(key, f.addr)
}

// userStacks unwinds user stacks of threads blocked in system calls.
type userStacks struct{}

func newUserStacks() *userStacks { return &userStacks{} }

var errNoUnwinder = errors.New("user stacks: unwinder not available")

func (u *userStacks) unwind(pid int, pc, sp uint64, out []userFrame) ([]userFrame, error) {
	return out, errNoUnwinder
}

func (u *userStacks) names(fs []userFrame) []string { return nil }

func (u *userStacks) nameAt(pid int, addr uint64) string { return "0x" + strconv.FormatUint(addr, 16) }
