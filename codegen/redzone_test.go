package codegen

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// TestRedZone: with a red zone, a patch that pushes moves %rsp below it
// first and back after, with lea (the flags stay as they were); one that
// never touches the stack is unchanged; VerifyPatch refuses a patch that
// pushes into the red zone or does not move %rsp back.
func TestRedZone(t *testing.T) {
	const at = 0x401000
	site := Site{Addr: at - 0x100, Bytes: []byte{0x48, 0x89, 0xe5}} // mov %rsp,%rbp
	for _, tc := range []struct {
		name  string
		flags bool
		want  []string // instrumentation in AT&T syntax, as objdump prints it
	}{
		{"flags live", true, []string{"lea -0x80(%rsp),%rsp", "pushfq", "lock incq ", "popfq", "lea 0x80(%rsp),%rsp"}},
		{"flags dead", false, []string{"lock incq "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := PatchSpec{Site: site, Live: Live{Regs: 0xffff, Flags: tc.flags}, Snippets: []Snippet{Counter{Addr: at + 0x800}}, RedZone: 128}
			p, err := BuildPatch(at, spec)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for off := 0; off < p.Instr; {
				in, err := x86dec.Decode(p.Code[off:])
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, x86asm.GNUSyntax(in, uint64(at+off), nil))
				off += in.Len
			}
			if len(got) != len(tc.want) {
				t.Fatalf("instrumentation %q, want %q", got, tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("instruction %d: %q, want %q", i, got[i], tc.want[i])
				}
			}
			if err := VerifyPatch(p, spec); err != nil {
				t.Fatalf("VerifyPatch: %v", err)
			}
			if !tc.flags {
				return
			}
			// Without the restore, and without the skip: refused.
			up := leaRSP(128)
			bad := *p
			bad.Code = append(bytes.Clone(p.Code[:p.Instr-len(up)]), p.Code[p.Instr:]...)
			bad.Instr -= len(up)
			if err := VerifyPatch(&bad, spec); !errors.Is(err, ErrVerify) {
				t.Errorf("a patch that does not move %%rsp back: %v", err)
			}
			noSkip, err := BuildPatch(at, PatchSpec{Site: site, Live: spec.Live, Snippets: spec.Snippets})
			if err != nil {
				t.Fatal(err)
			}
			if err := VerifyPatch(noSkip, spec); !errors.Is(err, ErrVerify) {
				t.Errorf("a patch that pushes into the red zone: %v", err)
			}
		})
	}
}
