package codegen

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// odLine is one instruction as objdump prints it.
type odLine struct {
	addr    uint64
	text    string // mnemonic and operands
	comment string // what follows '#': the absolute address of a RIP-relative operand
}

var (
	odInsn   = regexp.MustCompile(`^\s*([0-9a-f]+):\t([^#]*?)\s*(?:#\s*(.*))?$`)
	odBranch = regexp.MustCompile(`^(?:(?:bnd|notrack|ds|cs)\s+)*(j[a-z]+|loop[a-z]*|call)(?:,p[tn])?\s+0x([0-9a-f]+)$`)
	odPush   = regexp.MustCompile(`^push\s+\$0x([0-9a-f]+)$`)
	odRIP    = regexp.MustCompile(`-?0x[0-9a-f]+\(%rip\)`)
)

// objdump disassembles code as if loaded at vma, with GNU objdump: a
// decoder independent of x86asm.
func objdump(t *testing.T, code []byte, vma uint64) []odLine {
	t.Helper()
	f := filepath.Join(t.TempDir(), "code.bin")
	if err := os.WriteFile(f, code, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("objdump", "-D", "-b", "binary", "-mi386:x86-64", "-w", "--no-show-raw-insn",
		fmt.Sprintf("--adjust-vma=%#x", vma), f).Output()
	if err != nil {
		t.Fatalf("objdump: %v", err)
	}
	var lines []odLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := odInsn.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		a, _ := strconv.ParseUint(m[1], 16, 64)
		lines = append(lines, odLine{addr: a, text: strings.Join(strings.Fields(m[2]), " "), comment: m[3]})
	}
	if len(lines) == 0 {
		t.Fatalf("objdump printed no instructions:\n%s", out)
	}
	return lines
}

func hex64(s string) uint64 {
	v, _ := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	return v
}

// TestObjdumpAgrees disassembles every patch with objdump and checks, in
// objdump's own words, the counter address, the RIP-relative address the
// relocated instruction uses (including VEX and EVEX ones, which x86asm
// does not show as RIP-relative), the branch targets that leave the patch,
// the pushed return address, and that a copied instruction reads the same
// as the original but for its displacement.
func TestObjdumpAgrees(t *testing.T) {
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("objdump not installed")
	}
	for _, tc := range relocCases {
		site := Site{Addr: siteAddr, Bytes: tc.code}
		nextAddr := siteAddr + uint64(len(tc.code))
		orig := objdump(t, tc.code, siteAddr)
		if len(orig) != 1 {
			t.Fatalf("%s: objdump sees %d instructions in the original", tc.name, len(orig))
		}
		for _, addr := range patchAddrs {
			code, err := CounterPatch(addr, site, counter, true)
			if err != nil {
				t.Fatal(err)
			}
			lines := objdump(t, code, addr)
			dump := func() string {
				var b strings.Builder
				for _, l := range lines {
					fmt.Fprintf(&b, "\n\t%x: %s  # %s", l.addr, l.text, l.comment)
				}
				return b.String()
			}
			name := fmt.Sprintf("%s@%#x", tc.name, addr)
			if len(lines) < 4 || lines[0].text != "pushf" || !strings.HasPrefix(lines[1].text, "lock incq") || lines[2].text != "popf" {
				t.Errorf("%s: want pushf; lock incq; popf first:%s", name, dump())
				continue
			}
			if hex64(lines[1].comment) != counter {
				t.Errorf("%s: increment of %s, want %#x:%s", name, lines[1].comment, uint64(counter), dump())
			}
			var rips, exits []uint64
			var pushed uint64
			end := addr + uint64(len(code))
			for _, l := range lines[3:] {
				if strings.Contains(l.text, "(%rip)") {
					rips = append(rips, hex64(l.comment))
				}
				if m := odBranch.FindStringSubmatch(l.text); m != nil {
					if to := hex64(m[2]); to < addr || to >= end {
						exits = append(exits, to)
					}
				}
				if m := odPush.FindStringSubmatch(l.text); m != nil {
					pushed = hex64(m[1])
				}
			}
			wantRIPs := []uint64{}
			if tc.mem != 0 {
				wantRIPs = append(wantRIPs, tc.mem)
			}
			if !slices.Equal(append([]uint64{}, rips...), wantRIPs) {
				t.Errorf("%s: RIP-relative operands at %#x, want %#x:%s", name, rips, wantRIPs, dump())
			}
			wantExits := slices.Clone(tc.exits)
			for i, e := range wantExits {
				if e == next {
					wantExits[i] = nextAddr
				}
			}
			if !slices.Equal(exits, wantExits) {
				t.Errorf("%s: leaves to %#x, want %#x:%s", name, exits, wantExits, dump())
			}
			if tc.push && pushed != nextAddr || !tc.push && pushed != 0 {
				t.Errorf("%s: pushes %#x (want the return address: %v):%s", name, pushed, tc.push, dump())
			}
			// A copied instruction: same text but for the displacement,
			// same absolute address in the comment.
			rel := lines[3]
			if tc.push {
				rel = lines[4]
			}
			if odBranch.MatchString(orig[0].text) { // direct branches are re-encoded
				continue
			}
			want := odRIP.ReplaceAllString(orig[0].text, "D(%rip)")
			if tc.push { // call → jmp through the same operand
				want = strings.Replace(want, "call", "jmp", 1)
			}
			if got := odRIP.ReplaceAllString(rel.text, "D(%rip)"); got != want || rel.comment != orig[0].comment {
				t.Errorf("%s: relocated %q # %s, original %q # %s:%s", name, rel.text, rel.comment, orig[0].text, orig[0].comment, dump())
			}
		}
	}
}
