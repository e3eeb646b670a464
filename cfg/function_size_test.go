package cfg

import (
	"testing"
)

// TestTrimToSize: a sized function ends at its size, keeping only a clean
// run of padding (nops, int3s) that fills the gap to the next 16-byte
// boundary or the next symbol.
func TestTrimToSize(t *testing.T) {
	const addr = 0x1000
	body := []byte{0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3} // push; mov; pop; ret: 6 bytes
	for _, tc := range []struct {
		name  string
		after []byte
		next  uint64 // the next symbol
		end   uint64 // f.End wanted
	}{
		{"nops to 16", []byte{0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x0f, 0x1f, 0x40, 0x00}, addr + 0x40, addr + 0x10},
		{"int3s to 16", []byte{0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc}, addr + 0x40, addr + 0x10},
		{"nops to the next symbol", []byte{0x90, 0x90}, addr + 8, addr + 8},
		{"a static function right after", []byte{0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3, 0x90, 0x90, 0x90, 0x90}, addr + 0x40, addr + 6},
		{"an endbr64 after two nops", []byte{0x90, 0x90, 0xf3, 0x0f, 0x1e, 0xfa, 0x90, 0x90, 0x90, 0x90}, addr + 0x40, addr + 6},
		{"nops that stop short", []byte{0x90, 0x90, 0x90, 0x55, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90}, addr + 0x40, addr + 6},
		{"a nop across the boundary", []byte{0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x0f, 0x1f, 0x40, 0x00}, addr + 0x40, addr + 6},
	} {
		code := append(append([]byte{}, body...), tc.after...)
		f, err := Decode("f", "", addr, code)
		if err != nil {
			t.Fatal(err)
		}
		f.TrimToSize(addr+uint64(len(body)), tc.next)
		if f.End != tc.end || f.Insns[len(f.Insns)-1].End() != f.End {
			t.Errorf("%s: End %#x (last instruction ends %#x), want %#x", tc.name, f.End, f.Insns[len(f.Insns)-1].End(), tc.end)
		}
	}
}
