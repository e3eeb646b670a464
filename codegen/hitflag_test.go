package codegen

import "testing"

// TestHitFlagPatch: a hit flag needs no register and saves nothing, even
// with every register and flag live; the patch verifies, the flag's Check
// accepts only its own store, and a guarded flag saves the flags.
func TestHitFlagPatch(t *testing.T) {
	flag := uint64(testBase + 0x8000)
	spec := PatchSpec{Site: movSite, Live: AllLive, Snippets: []Snippet{HitFlag{Addr: flag}}}
	p, err := BuildPatch(testBase, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyPatch(p, spec); err != nil {
		t.Fatal(err)
	}
	if p.SavedFlags || len(p.Spilled) != 0 || p.Instr != lenMovbImmRIP {
		t.Errorf("saved flags %v, spilled %v, %d bytes of instrumentation; want none, none, %d", p.SavedFlags, p.Spilled, p.Instr, lenMovbImmRIP)
	}
	if err := (HitFlag{Addr: flag + 8}).Check(p.Code[:p.Instr], testBase); err == nil {
		t.Error("Check accepted a store to another address")
	}
	if err := (HitFlag{Addr: flag}).Check([]byte{0xc6, 0x05, 0, 0, 0, 0, 2}, testBase); err == nil {
		t.Error("Check accepted movb $2")
	}
	guarded := PatchSpec{Site: movSite, Live: AllLive, Snippets: []Snippet{Guard{
		If: TaskField32{CurrentTask: 0x32d00, Offset: 0x5c8, Value: 42}, Then: []Snippet{HitFlag{Addr: flag}}}}}
	g, err := BuildPatch(testBase, guarded)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyPatch(g, guarded); err != nil {
		t.Fatal(err)
	}
	if !g.SavedFlags || len(g.Spilled) != 1 {
		t.Errorf("guarded: saved flags %v, spilled %v; want flags and one register", g.SavedFlags, g.Spilled)
	}
}
