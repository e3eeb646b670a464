package att

import (
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

// The expected operands are what objdump -d prints for the same bytes
// (mnemonic suffixes such as retq stay x86asm's).
func TestSyntaxMatchesObjdump(t *testing.T) {
	for _, c := range []struct {
		bytes []byte
		want  string
	}{
		{[]byte{0x49, 0x89, 0x44, 0x24, 0x40}, "mov %rax,0x40(%r12)"},
		{[]byte{0x49, 0x8b, 0x04, 0x24}, "mov (%r12),%rax"},
		{[]byte{0x48, 0x8b, 0x04, 0x24}, "mov (%rsp),%rax"},
		{[]byte{0x48, 0x8b, 0x44, 0x24, 0x08}, "mov 0x8(%rsp),%rax"},
		{[]byte{0x4a, 0x8b, 0x04, 0xe0}, "mov (%rax,%r12,8),%rax"},
		{[]byte{0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0}, "mov 0x0,%rax"},
		{[]byte{0x65, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0}, "mov %gs:0x0,%rax"},
		{[]byte{0x65, 0x48, 0x8b, 0x04, 0x25, 0x40, 0x0b, 0x02, 0}, "mov %gs:0x20b40,%rax"},
		{[]byte{0x48, 0x89, 0x04, 0x25, 0, 0, 0, 0}, "mov %rax,0x0"},
	} {
		inst, err := x86asm.Decode(c.bytes, 64)
		if err != nil {
			t.Fatalf("% x: %v", c.bytes, err)
		}
		if got := Syntax(inst, 0, nil); got != c.want {
			t.Errorf("% x: got %q, want %q", c.bytes, got, c.want)
		}
	}
}
