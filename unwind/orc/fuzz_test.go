package orc

import (
	"errors"
	"sort"
	"testing"
)

// FuzzORC: any .orc_unwind_ip and .orc_unwind bytes parse into a table
// whose Lookup agrees with a linear search, or fail with ErrCorrupt; an
// unwind over any stack ends with frames within the limit and a typed
// reason. The seeds in testdata/fuzz come from a Debian kernel module's
// ORC sections (relocated) and the tables of the unit tests.
func FuzzORC(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 4, 0, 0, 0}, uint64(k), []byte{8, 0, 0, 0, 0x32, 0, 0, 0, 0, 0, 0x23, 0}, uint64(k+2), uint64(stk), uint64(0), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, ips []byte, ipBase uint64, ents []byte, ip, sp, bp uint64, stack []byte) {
		tab, err := Parse(ips, ipBase, ents)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		n := len(ips) / 4
		if tab.Len() != n {
			t.Fatalf("Len %d, want %d", tab.Len(), n)
		}
		// The oracle: entries in file order, stably sorted by address;
		// the last one at or below ip covers it.
		type ent struct {
			ip uint64
			e  Entry
		}
		all := make([]ent, n)
		for i := range all {
			off := int32(uint32(ips[4*i]) | uint32(ips[4*i+1])<<8 | uint32(ips[4*i+2])<<16 | uint32(ips[4*i+3])<<24)
			all[i] = ent{ipBase + uint64(4*i) + uint64(int64(off)), DecodeEntry(ents[EntrySize*i:])}
		}
		sort.SliceStable(all, func(i, j int) bool { return all[i].ip < all[j].ip })
		for _, q := range []uint64{ip, all[0].ip, all[n-1].ip, all[n/2].ip - 1, all[n/2].ip} {
			var want Entry
			found := false
			for _, a := range all {
				if a.ip <= q {
					want, found = a.e, true
				}
			}
			got, ok := tab.Lookup(q)
			if ok != found || got != want {
				t.Fatalf("Lookup(%#x) = %+v, %v; want %+v, %v", q, got, ok, want, found)
			}
		}
		if lo, hi := tab.Range(); lo != all[0].ip || hi != all[n-1].ip {
			t.Fatalf("Range %#x..%#x, want %#x..%#x", lo, hi, all[0].ip, all[n-1].ip)
		}
		mem := memory{}
		for i := 0; i+8 <= len(stack); i += 8 {
			var w uint64
			for j := 7; j >= 0; j-- {
				w = w<<8 | uint64(stack[i+j])
			}
			mem[sp+uint64(i)] = w
		}
		for _, signal := range []bool{false, true} {
			frames, err := Unwind(tab, mem, State{IP: ip, SP: sp, BP: bp, Signal: signal, Regs: &Regs{IP: ip, SP: sp, BP: bp, DX: sp, DI: bp, R10: sp + 8, R13: bp + 8}})
			if len(frames) > MaxFrames {
				t.Fatalf("%d frames", len(frames))
			}
			var se *StopError
			if err != nil && !errors.As(err, &se) {
				t.Fatalf("untyped error %v", err)
			}
		}
	})
}
