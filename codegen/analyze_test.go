package codegen

import (
	"errors"
	"testing"
)

// TestAnalysisMemo: the kept analysis answers only for the same address
// and bytes, and never from bytes the caller changed afterwards.
func TestAnalysisMemo(t *testing.T) {
	const at = 0xffffffff81000000
	b := []byte{0x48, 0x89, 0xe5} // mov %rsp,%rbp
	if _, err := analyze(Site{Addr: at, Bytes: b}); err != nil {
		t.Fatal(err)
	}
	first, _ := analyze(Site{Addr: at, Bytes: b})
	again, err := analyze(Site{Addr: at, Bytes: b})
	if err != nil || again != first {
		t.Fatalf("same site: got %p, %v; want the kept %p", again, err, first)
	}
	if other, _ := analyze(Site{Addr: at + 16, Bytes: b}); other == first || other.site.Addr != at+16 {
		t.Errorf("another address answered with the kept analysis")
	}
	// The caller's buffer now holds another instruction at the same
	// address: it must be analysed afresh.
	if _, err := analyze(Site{Addr: at, Bytes: b}); err != nil {
		t.Fatal(err)
	}
	copy(b, []byte{0xe8, 0x00, 0x00}) // not a whole call rel32
	if in, err := analyze(Site{Addr: at, Bytes: b}); err == nil {
		t.Fatalf("changed bytes answered from the memo: %+v", in.inst)
	}
	var ue *UnsupportedError
	if _, err := analyze(Site{Addr: at, Bytes: []byte{0xcc}}); !errors.As(err, &ue) {
		t.Errorf("int3: %v, want an UnsupportedError", err)
	}
	// The same answers as a fresh analysis.
	for _, site := range []Site{{Addr: at, Bytes: []byte{0x55}}, {Addr: at, Bytes: []byte{0xe8, 1, 2, 3, 4}}, {Addr: at + 1, Bytes: []byte{0x74, 0x10}}} {
		analyze(site)
		memo, err1 := analyze(site)
		fresh, err2 := analyzeSite(site)
		memo2, err3 := analyze(site)
		if (err1 == nil) != (err2 == nil) || err1 != nil {
			t.Fatalf("% x: %v vs %v", site.Bytes, err1, err2)
		}
		if memo.kind != fresh.kind || memo.l != fresh.l || memo.target() != fresh.target() || memo2 != memo || err3 != nil {
			t.Errorf("% x: kept analysis differs from a fresh one", site.Bytes)
		}
	}
}
