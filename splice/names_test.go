package splice

import (
	"strings"
	"testing"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
)

// The retpoline thunks share their address with linker-script markers,
// which kallsyms lists after them (as Debian's 6.1 kernel does):
// whatever order the aliases come in, a call to the address is a call
// through the thunk's register.
func TestThunkAliasesKeepRegisterLive(t *testing.T) {
	const thunk = 0xffffffff81e01580
	for _, order := range [][]string{
		{"__x86_indirect_thunk_rax", "__x86_indirect_thunk_array", "__indirect_thunk_start", "__static_call_text_end"},
		{"__static_call_text_end", "__indirect_thunk_start", "__x86_indirect_thunk_array", "__x86_indirect_thunk_rax"},
	} {
		var ks strings.Builder
		ks.WriteString("ffffffff81000000 T lookup_fast\nffffffff81000100 T tailer\n")
		for _, n := range order {
			ks.WriteString("ffffffff81e01580 T " + n + "\n")
		}
		ks.WriteString("ffffffff81e015a0 T __x86_indirect_thunk_rcx\n")
		syms, err := kernel.ParseKallsyms(strings.NewReader(ks.String()))
		if err != nil {
			t.Fatal(err)
		}
		k := &Facts{Symbols: syms, Text: zeroReader{}}
		if name, _ := k.BlockOptions().Names(thunk); name != "__x86_indirect_thunk_rax" {
			t.Errorf("%v: the thunk is named %q, want __x86_indirect_thunk_rax", order, name)
		}

		// lookup_fast's indirect call: mov 0x60(%rbp),%rax; mov (%rax),%rax;
		// call __x86_indirect_thunk_rax; mov %eax,%r12d; ret. The call is
		// the block's only 5-byte instruction, so a block probe lands on it.
		call := []byte{0x48, 0x8b, 0x45, 0x60, 0x48, 0x8b, 0x00, 0xe8, 0, 0, 0, 0, 0x41, 0x89, 0xc4, 0xc3}
		putRel(call[8:], 0xffffffff81000000+12, thunk)
		fn, err := cfg.Decode("lookup_fast", "", 0xffffffff81000000, call)
		if err != nil {
			t.Fatal(err)
		}
		f := k.Func(fn, nil)
		if live := f.Live(2); live&liveRAX == 0 {
			t.Errorf("%v: before call __x86_indirect_thunk_rax: %v live, want RAX", order, live)
		}
		if live := f.Live(0); live&liveRAX != 0 {
			t.Errorf("%v: before mov 0x60(%%rbp),%%rax: %v live, want RAX dead", order, live)
		}

		// A retpolined indirect tail call: mov (%rdi),%rax; jmp __x86_indirect_thunk_rax.
		tail := []byte{0x48, 0x8b, 0x07, 0xe9, 0, 0, 0, 0}
		putRel(tail[4:], 0xffffffff81000100+8, thunk)
		fn, err = cfg.Decode("tailer", "", 0xffffffff81000100, tail)
		if err != nil {
			t.Fatal(err)
		}
		f = k.Func(fn, nil)
		if live := f.Live(1); live&liveRAX == 0 {
			t.Errorf("%v: before jmp __x86_indirect_thunk_rax: %v live, want RAX", order, live)
		}
	}
}

const liveRAX cfg.LiveSet = 1 // bit 0: RAX

type zeroReader struct{}

func (zeroReader) Read(addr uint64, b []byte) error {
	clear(b)
	return nil
}

func putRel(b []byte, end, target uint64) {
	r := uint32(int32(int64(target - end)))
	b[0], b[1], b[2], b[3] = byte(r), byte(r>>8), byte(r>>16), byte(r>>24)
}
