package codegen

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the code generates now; review the change and run go test -update:\n%s", path, lineDiff(want, got))
	}
}

func lineDiff(want, got []byte) string {
	w, g := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var b bytes.Buffer
	for i := range max(len(w), len(g)) {
		var wl, gl []byte
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if !bytes.Equal(wl, gl) {
			fmt.Fprintf(&b, "line %d:\n-%s\n+%s\n", i+1, wl, gl)
		}
	}
	return b.String()
}

// disasm lists code at addr, one instruction a line, with the absolute
// address of a RIP-relative operand after '#' as objdump prints it (x86asm
// itself shows VEX ones as absolute).
func disasm(b *bytes.Buffer, code []byte, addr uint64) {
	out, err := decodeAll(code, addr)
	if err != nil {
		fmt.Fprintf(b, "\t%v\n", err)
		return
	}
	for _, d := range out {
		fmt.Fprintf(b, "\t%x: %-30s %s", d.pc, fmt.Sprintf("% x", d.enc), gnu(d.inst, d.pc))
		if l, err := parseLayout(d.enc); err == nil && l.rip >= 0 {
			fmt.Fprintf(b, "  # %#x", d.pc+uint64(d.inst.Len)+uint64(int64(le32(d.enc, l.rip))))
		}
		b.WriteByte('\n')
	}
}

// TestGoldenPatches pins the exact bytes of every patch in the table.
func TestGoldenPatches(t *testing.T) {
	var b bytes.Buffer
	addr := patchAddrs[0]
	fmt.Fprintf(&b, "Counter patches (flags saved) at %#x for sites at %#x, counter at %#x.\n", addr, uint64(siteAddr), uint64(counter))
	for _, tc := range relocCases {
		site := Site{Addr: siteAddr, Bytes: tc.code}
		code, err := CounterPatch(addr, site, counter, true)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "\n%s\n  site:\n", tc.name)
		disasm(&b, tc.code, siteAddr)
		b.WriteString("  patch:\n")
		disasm(&b, code, addr)
	}
	golden(t, "patches.golden", b.Bytes())
}

// TestGoldenRefusals pins the reasons given for refused instructions.
func TestGoldenRefusals(t *testing.T) {
	var b bytes.Buffer
	names := make([]string, 0, len(refusedCases))
	for name, code := range refusedCases {
		if code != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		_, err := Relocate(patchAddrs[0], Site{Addr: siteAddr, Bytes: refusedCases[name]})
		fmt.Fprintf(&b, "%-30s % -30x %v\n", name, refusedCases[name], err)
	}
	golden(t, "refusals.golden", b.Bytes())
}

// TestGoldenSharedPatches pins BuildPatch's output for several snippets
// sharing one patch: scratch registers from liveness, spills, saved
// flags, predicate groups, over a plain and a branch site.
func TestGoldenSharedPatches(t *testing.T) {
	addr := patchAddrs[0]
	pid := TaskField32{CurrentTask: 0x1fb80, Offset: 0x5c8, Value: 42}
	cases := []struct {
		name string
		live Live
		sn   []Snippet
	}{
		{"two counters, flags dead", Live{Regs: 0xffff}, []Snippet{Counter{counter}, Counter{counter + 8}}},
		{"two counters, flags live", AllLive, []Snippet{Counter{counter}, Counter{counter + 8}}},
		{"counter and tsc sum, rcx dead", Live{Regs: 0xffff &^ RCX.Bit(), Flags: true}, []Snippet{Counter{counter}, tsc{counter + 8}}},
		{"tsc sum, everything dead", Live{}, []Snippet{tsc{counter}}},
		{"pid-guarded counters, all live", AllLive, []Snippet{Guard{If: pid, Then: []Snippet{Counter{counter}, Counter{counter + 8}}}}},
	}
	sites := []struct {
		name string
		code []byte
	}{
		{"mov 0x10(%rdi),%rax", []byte{0x48, 0x8b, 0x47, 0x10}},
		{"je rel8", []byte{0x74, 0x10}},
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "Shared patches at %#x for sites at %#x, counters from %#x.\n", addr, uint64(siteAddr), uint64(counter))
	for _, st := range sites {
		for _, c := range cases {
			spec := PatchSpec{Site: Site{Addr: siteAddr, Bytes: st.code}, Live: c.live, Snippets: c.sn}
			p, err := BuildPatch(addr, spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := VerifyPatch(p, spec); err != nil {
				t.Errorf("%s / %s: %v", st.name, c.name, err)
			}
			fmt.Fprintf(&b, "\n%s / %s: scratch %v spilled %v flags saved %v\n", st.name, c.name, p.Scratch, p.Spilled, p.SavedFlags)
			disasm(&b, p.Code, addr)
		}
	}
	golden(t, "shared.golden", b.Bytes())
}
