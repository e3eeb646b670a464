package codegen

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kinst/kinst/internal/x86dec"
)

// TestCorpus runs every instruction of real kernel code through the
// package: set KINST_CODEGEN_CORPUS to a directory of kernel ELF objects
// (a vmlinux, or lib/modules/VERSION/kernel of an unpacked linux-image
// package). For each instruction of each executable section: our ModRM
// walk must agree with objdump about RIP-relative operands, x86asm and
// the walk must not disagree, and anything relocatable must relocate to
// code that passes the tests' semantic rules and Verify.
func TestCorpus(t *testing.T) {
	dir := os.Getenv("KINST_CODEGEN_CORPUS")
	if dir == "" {
		t.Skip("KINST_CODEGEN_CORPUS not set")
	}
	useObjdump := true
	if _, err := exec.LookPath("objdump"); err != nil {
		useObjdump = false
	}
	reasons := map[string]int{}
	var files, insns, relocated, ripChecked int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".ko") || filepath.Base(path) == "vmlinux") {
			return err
		}
		f, err := elf.Open(path)
		if err != nil {
			return nil
		}
		defer f.Close()
		if f.Machine != elf.EM_X86_64 {
			return nil
		}
		files++
		var od map[string]map[uint64]odInsnInfo
		if useObjdump {
			od = objdumpRIP(t, path)
		}
		for _, sec := range f.Sections {
			if sec.Flags&elf.SHF_EXECINSTR == 0 || sec.Type != elf.SHT_PROGBITS {
				continue
			}
			text, err := sec.Data()
			if err != nil {
				continue
			}
			base := sec.Addr
			if base == 0 {
				base = siteAddr &^ 0xfffff // relocatable object: place it in kernel text
			}
			for off := 0; off < len(text); {
				end := min(off+15, len(text))
				inst, err := x86dec.Decode(text[off:end])
				if err != nil || inst.Op == 0 {
					off++
					continue
				}
				insns++
				b := text[off : off+inst.Len]
				site := Site{Addr: base + uint64(off), Bytes: b}
				if o, ok := od[sec.Name][sec.Addr+uint64(off)]; ok && o.len == inst.Len {
					if l, err := parseLayout(b); err == nil && (l.rip >= 0) != o.rip {
						t.Errorf("%s %s+%#x % x (%s): ModRM walk says RIP-relative %v, objdump %v",
							filepath.Base(path), sec.Name, off, b, gnu(inst, 0), l.rip >= 0, o.rip)
					}
					ripChecked++
				}
				in, err := analyze(site)
				if err != nil {
					var ue *UnsupportedError
					if !errors.As(err, &ue) {
						t.Fatalf("% x: %v", b, err)
					}
					r := ue.Reason
					if i := strings.IndexAny(r, ":("); i > 0 {
						r = r[:i]
					}
					reasons[r]++
					if strings.Contains(ue.Reason, "disagree") || strings.Contains(ue.Reason, "cannot locate") {
						t.Errorf("%s %s+%#x: %v", filepath.Base(path), sec.Name, off, err)
					}
					off += inst.Len
					continue
				}
				addr := patchAddrs[0] + uint64(off)%0x1000
				code, err := in.relocateBack(nil, addr, true)
				if err == nil {
					relocated++
					if err := checkSemantics(site, addr, code); err != nil {
						t.Errorf("%s %s+%#x % x (%s): %v", filepath.Base(path), sec.Name, off, b, gnu(inst, site.Addr), err)
					} else if err := VerifyRelocation(code, addr, site); err != nil {
						t.Errorf("%s %s+%#x % x: %v", filepath.Base(path), sec.Name, off, b, err)
					}
				} else if !errors.Is(err, ErrOutOfReach) {
					t.Errorf("%s %s+%#x % x: %v", filepath.Base(path), sec.Name, off, b, err)
				}
				off += inst.Len
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files, %d instructions, %d relocated, %d RIP checks against objdump", files, insns, relocated, ripChecked)
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return reasons[keys[i]] > reasons[keys[j]] })
	for _, k := range keys {
		t.Logf("%8d refused: %s", reasons[k], k)
	}
}

type odInsnInfo struct {
	len int
	rip bool
}

var (
	odSection = regexp.MustCompile(`^Disassembly of section (\S+):`)
	odLineRaw = regexp.MustCompile(`^\s*([0-9a-f]+):\t(.*)$`)
)

// objdumpRIP disassembles every executable section of an object and
// returns, by section and address, the length of each instruction and
// whether objdump shows a RIP-relative operand.
func objdumpRIP(t *testing.T, path string) map[string]map[uint64]odInsnInfo {
	out, err := exec.Command("objdump", "-d", "-w", "--no-show-raw-insn", "-z", path).Output()
	if err != nil {
		t.Logf("objdump %s: %v", path, err)
		return nil
	}
	res := map[string]map[uint64]odInsnInfo{}
	var cur map[uint64]odInsnInfo
	var prev uint64
	var prevRIP, have bool
	flush := func(next uint64) {
		if have && cur != nil && next > prev {
			cur[prev] = odInsnInfo{len: int(next - prev), rip: prevRIP}
		}
		have = false
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := odSection.FindStringSubmatch(line); m != nil {
			flush(prev)
			cur = map[uint64]odInsnInfo{}
			res[m[1]] = cur
			continue
		}
		m := odLineRaw.FindStringSubmatch(line)
		if m == nil || cur == nil {
			continue
		}
		a, _ := strconv.ParseUint(m[1], 16, 64)
		flush(a)
		if strings.Contains(m[2], "(bad)") {
			continue
		}
		prev, prevRIP, have = a, strings.Contains(m[2], "(%rip)"), true
	}
	return res
}
