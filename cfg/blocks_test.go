package cfg

import (
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// assemble builds testdata/NAME.s with as and returns the text and its
// symbols (text is linked at address 0).
func assemble(t *testing.T, name string) ([]byte, map[string]uint64) {
	t.Helper()
	if _, err := exec.LookPath("as"); err != nil {
		t.Skip("as not installed")
	}
	obj := filepath.Join(t.TempDir(), name+".o")
	if out, err := exec.Command("as", "--64", "-o", obj, filepath.Join("testdata", name+".s")).CombinedOutput(); err != nil {
		t.Fatalf("as: %v\n%s", err, out)
	}
	f, err := elf.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text, err := f.Section(".text").Data()
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.Symbols()
	m := map[string]uint64{}
	for _, s := range syms {
		if s.Section < elf.SHN_LORESERVE && int(s.Section) < len(f.Sections) && f.Sections[s.Section].Name == ".text" {
			m[s.Name] = s.Value
		}
	}
	return text, m
}

// assembleFunction decodes function f of testdata/NAME.s (it ends where
// g begins) and names the fixture's symbols.
func assembleFunction(t *testing.T, name string) (*Function, NameAt) {
	t.Helper()
	text, syms := assemble(t, name)
	fn, err := Decode("f", "", 0, text[:syms["g"]])
	if err != nil {
		t.Fatal(err)
	}
	return fn, func(a uint64) (string, bool) {
		for n, v := range syms {
			if v == a {
				return n, true
			}
		}
		return "", false
	}
}

func TestBlocks(t *testing.T) {
	fn, names := assembleFunction(t, "blocks")
	blocks := fn.Blocks(names)
	// One line per block: first instruction, exit, successors, padding.
	var got []string
	for _, b := range blocks {
		var succ []string
		for _, e := range b.Succs {
			succ = append(succ, fmt.Sprintf("%s:%d", e.Kind, e.To))
		}
		got = append(got, fmt.Sprintf("%d %s exit=%s succ=[%s] pad=%v", b.Index,
			strings.Fields(fn.Insns[b.First].String())[0], b.Exit, strings.Join(succ, " "), b.Padding))
	}
	want := []string{
		"0 nopl exit= succ=[taken:2 fallthrough:1] pad=false",  // ftrace nop … je 1f
		"1 callq exit= succ=[taken:3 fallthrough:2] pad=false", // call g (no block end); test; jne 2f
		"2 pop exit=return succ=[] pad=false",                  // 1: pop; jmp __x86_return_thunk
		"3 callq exit= succ=[taken:5 fallthrough:4] pad=false", // 2: retpoline call; cmp; ja 3f
		"4 jmp exit=indirect-jump succ=[] pad=false",           // jmp *%rax
		"5 ud2 exit= succ=[fallthrough:6] pad=false",           // 3: WARN's ud2 resumes
		"6 pop exit=tail-call succ=[] pad=false",               // pop; jmp g
		"7 int3 exit=trap succ=[] pad=true",                    // padding
		"8 int3 exit=trap succ=[] pad=true",
		"9 nopw exit= succ=[] pad=true",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("blocks:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Predecessors mirror successors.
	for _, b := range blocks {
		for _, e := range b.Succs {
			found := false
			for _, p := range blocks[e.To].Preds {
				found = found || p == b.Index
			}
			if !found {
				t.Errorf("block %d → %d has no matching predecessor", b.Index, e.To)
			}
		}
	}
}

func TestBlocksEndAtNoReturnCalls(t *testing.T) {
	fn, names := assembleFunction(t, "live")
	// Pretend g never returns: the block with "call g" ends there.
	g := uint64(0)
	for _, in := range fn.Insns {
		if t, ok := BranchTarget(&in); ok && in.Inst.Op.String() == "CALL" {
			g = t
		}
	}
	blocks := fn.BlocksWith(names, func(a uint64) bool { return a == g })
	found := false
	for _, b := range blocks {
		if b.Exit == NoReturnCall {
			found = true
			if len(b.Succs) != 0 || b.Last(fn).Inst.Op.String() != "CALL" {
				t.Errorf("noreturn block: %+v", b)
			}
		}
	}
	if !found {
		t.Fatal("no block ends at the noreturn call")
	}
	lv := fn.Live(blocks, names, nil)
	for bi, b := range blocks {
		if b.Exit == NoReturnCall && lv.LiveOut[bi] != 0 {
			t.Errorf("live after a noreturn call: %v", lv.LiveOut[bi])
		}
	}
}

// TestBlocksUserFaults: in user code (BlockOptions.User) hlt and ud2
// fault and never fall through, so the nops or int3s a linker puts after
// _start's hlt are padding, not a block no run could cover; in the
// kernel hlt resumes after an interrupt and WARN()'s ud2 after its
// report, and both fall through.
func TestBlocksUserFaults(t *testing.T) {
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		code string
		user bool
		// want: each block as its first instruction's offset, whether it
		// is padding, and its successors' (taken before fall-through).
		want string
	}{
		{"start hlt nops kernel", "ff 15 0a 00 00 00 f4 66 2e 0f 1f 84 00 00 00 00 00", false, "0:[7] 7:[]"},
		{"start hlt nops user", "ff 15 0a 00 00 00 f4 66 2e 0f 1f 84 00 00 00 00 00", true, "0:[] 7:pad[]"},
		{"start hlt int3s user", "ff 15 0a 00 00 00 f4 cc cc cc", true, "0:[] 7:pad[] 8:pad[] 9:pad[]"},
		{"ud2 kernel", "85 ff 74 02 0f 0b c3", false, "0:[6 4] 4:[6] 6:[]"},
		{"ud2 user", "85 ff 74 02 0f 0b c3", true, "0:[6 4] 4:[] 6:[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fn, err := Decode("f", "", 0x1000, unhex(tt.code))
			if err != nil {
				t.Fatal(err)
			}
			blocks := fn.BlocksOpt(BlockOptions{User: tt.user})
			var got []string
			for _, b := range blocks {
				s := fmt.Sprint(b.Start(fn) - 0x1000)
				if b.Padding {
					s += ":pad["
				} else {
					s += ":["
				}
				var succs []string
				for _, e := range b.Succs {
					succs = append(succs, fmt.Sprint(blocks[e.To].Start(fn)-0x1000))
				}
				got = append(got, s+strings.Join(succs, " ")+"]")
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("blocks %s, want %s", g, tt.want)
			}
		})
	}
}
