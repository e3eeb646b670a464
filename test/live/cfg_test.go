package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

var objdumpInsn = regexp.MustCompile(`^\s*([0-9a-f]+):\t`)

// TestCFGBoundariesMatchObjdump decodes a sample of the live kernel's
// functions through kerninstd and checks every instruction boundary
// against objdump run on the same bytes.
func TestCFGBoundariesMatchObjdump(t *testing.T) {
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("objdump not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := gsh(t, ctx, "grep -E ' [tT] ' /proc/kallsyms | grep -v '\\[' | awk '{print $3}'")
	names := strings.Fields(out)
	const sample = 300
	step := max(1, len(names)/sample)
	dir := t.TempDir()
	checked, insns := 0, 0
	for i := 0; i < len(names); i += step {
		g, err := client.CFG(ctx, names[i])
		if err != nil {
			continue // e.g. a duplicate static name that resolved elsewhere, or unreadable text
		}
		var ours []uint64
		for _, b := range g.Blocks {
			for _, in := range b.Instructions {
				ours = append(ours, uint64(in.Address))
			}
		}
		if len(ours) == 0 {
			continue
		}
		last := g.Blocks[len(g.Blocks)-1].Instructions
		end := uint64(last[len(last)-1].Address) + uint64(last[len(last)-1].Length)
		m, err := client.Read(ctx, fmt.Sprintf("%#x", uint64(g.Address)), int(end-uint64(g.Address)))
		if err != nil {
			t.Fatalf("read %s: %v", g.Function, err)
		}
		code, _ := hex.DecodeString(m.Bytes)
		f := filepath.Join(dir, "fn.bin")
		os.WriteFile(f, code, 0o600)
		dump, err := exec.Command("objdump", "-D", "-b", "binary", "-mi386:x86-64", "-w",
			fmt.Sprintf("--adjust-vma=%#x", uint64(g.Address)), f).Output()
		if err != nil {
			t.Fatalf("objdump: %v", err)
		}
		var theirs []uint64
		sc := bufio.NewScanner(bytes.NewReader(dump))
		for sc.Scan() {
			if mm := objdumpInsn.FindStringSubmatch(sc.Text()); mm != nil {
				a, _ := strconv.ParseUint(mm[1], 16, 64)
				theirs = append(theirs, a)
			}
		}
		if fmt.Sprint(ours) != fmt.Sprint(theirs) {
			t.Errorf("%s: %d boundaries, objdump %d; first difference at %s", g.Function, len(ours), len(theirs), firstDiff(ours, theirs))
			continue
		}
		checked++
		insns += len(ours)
	}
	t.Logf("%d functions, %d instructions: boundaries identical to objdump's", checked, insns)
	if checked < sample/2 {
		t.Errorf("only %d functions checked", checked)
	}
}

func firstDiff(a, b []uint64) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return fmt.Sprintf("%#x (ours) vs %#x (objdump)", a[i], b[i])
		}
	}
	return "the end"
}

// TestCFGStats runs the whole-kernel census end to end in the guest.
func TestCFGStats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, errs, code := gexec(t, ctx, "kinst", "cfg", "--stats", "--json")
	if code != 0 {
		t.Fatalf("kinst cfg --stats: status %d: %s", code, errs)
	}
	var st struct {
		Modules          int            `json:"modules"`
		Functions        int            `json:"functions"`
		BasicBlocks      int            `json:"basic_blocks"`
		InstructionBytes int            `json:"instruction_bytes"`
		Instructions     int            `json:"instructions"`
		SpliceClasses    map[string]int `json:"splice_classes"`
		Coverable        int            `json:"coverable"`
		Springboard      *struct {
			Short    int `json:"short"`
			InReach  int `json:"in_reach"`
			Trap     int `json:"trap"`
			Covering int `json:"covering"`
			TrapOnly int `json:"trap_only"`
		} `json:"springboard"`
		NoSpliceSites *struct {
			ExTable     int `json:"ex_table"`
			JumpLabels  int `json:"jump_labels"`
			StaticCalls int `json:"static_calls"`
			Ftrace      int `json:"ftrace"`
			Modules     int `json:"modules"`
		} `json:"no_splice_sites"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("--stats --json: %v\n%s", err, out)
	}
	// The ftrace records walked must be the ones tracefs lists, and every
	// loaded module's tables must have been read (oracle: /proc/modules).
	if n := st.NoSpliceSites; n == nil {
		t.Error("no no_splice_sites in the census")
	} else {
		listed := strings.Count(gsh(t, ctx, "cat /sys/kernel/tracing/available_filter_functions"), "\n")
		modules := strings.Count(gsh(t, ctx, "cat /proc/modules"), "\n")
		if n.Ftrace != listed || n.Modules != modules || n.ExTable == 0 || n.JumpLabels == 0 || n.StaticCalls == 0 {
			t.Errorf("no_splice_sites %+v: want %d ftrace records (available_filter_functions) and %d modules (/proc/modules)", *n, listed, modules)
		}
	}
	t.Logf("%+v", st)
	// A Debian 6.1 kernel has tens of thousands of functions and ~10 MB of
	// instructions; the guest loads the virtio modules and kerninst.
	if st.Functions < 30000 || st.BasicBlocks < 10*st.Functions/2 || st.InstructionBytes < 5<<20 || st.Modules < 5 {
		t.Errorf("implausible census: %+v", st)
	}
	sum := 0
	for _, n := range st.SpliceClasses {
		sum += n
	}
	if sum != st.Instructions || st.SpliceClasses["direct"] == 0 || st.SpliceClasses["refused"] == 0 {
		t.Errorf("splice classes %v do not cover the %d instructions", st.SpliceClasses, st.Instructions)
	}
	// Covering splices: some short instructions can take one, never more
	// than there are short ones, and the traps left are the short
	// instructions with neither a slot nor a run to cover.
	short := st.SpliceClasses["springboard"] + st.SpliceClasses["trap"]
	if sb := st.Springboard; sb == nil || st.Coverable == 0 || st.Coverable > short ||
		sb.Covering > sb.Short || sb.Covering > st.Coverable || sb.TrapOnly > sb.Trap || sb.TrapOnly < sb.Trap-sb.Covering {
		t.Errorf("covering census implausible: coverable %d of %d short; springboard %+v", st.Coverable, short, st.Springboard)
	} else {
		t.Logf("covering: %d of %d short instructions (%.1f%%); of the 2-4-byte ones, %d have a slot in reach, %d can be covered, %d neither",
			st.Coverable, short, 100*float64(st.Coverable)/float64(short), sb.InReach, sb.Covering, sb.TrapOnly)
	}
	if !strings.Contains(errs, "analysing") {
		t.Errorf("no progress shown on stderr: %q", errs)
	}
}

// TestCFGJSONInterface checks the documented shape of `kinst cfg FUNC
// --json`, and that liveness at filename_lookup's entry follows its BTF
// prototype: five arguments (dfd, name, flags, path, root) live, R9 not.
func TestCFGJSONInterface(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := gsh(t, ctx, "kinst cfg filename_lookup --json")
	var g struct {
		Blocks []struct {
			Instructions []map[string]any `json:"instructions"`
		} `json:"blocks"`
	}
	if err := json.Unmarshal([]byte(out), &g); err != nil || len(g.Blocks) == 0 {
		t.Fatalf("cfg --json: %v\n%.500s", err, out)
	}
	first := g.Blocks[0].Instructions
	for _, in := range first {
		for _, k := range []string{"address", "length", "text", "live_in", "splice_class"} {
			if _, ok := in[k]; !ok {
				t.Fatalf("instruction %v lacks %q", in, k)
			}
		}
		if a, _ := in["address"].(string); !strings.HasPrefix(a, "0x") {
			t.Fatalf("address %v is not a 0x… string", in["address"])
		}
	}
	// The first instruction after the ftrace site.
	live := map[string]bool{}
	for _, r := range first[1]["live_in"].([]any) {
		live[r.(string)] = true
	}
	for _, r := range []string{"RDI", "RSI", "RDX", "RCX", "R8", "RSP", "RBX", "RBP", "R12"} {
		if !live[r] {
			t.Errorf("%s not live at filename_lookup's entry: %v", r, live)
		}
	}
	for _, r := range []string{"R9", "R10", "R11", "RAX", "ZF"} {
		if live[r] {
			t.Errorf("%s live at filename_lookup's entry, but the prototype has five arguments: %v", r, live)
		}
	}
}

// TestCFGCallGraph checks filename_lookup's place in the call graph: it
// calls path_lookupat (seen in its disassembly) and is called by several
// path-walking entry points.
func TestCFGCallGraph(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	g, err := client.Calls(ctx, "filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	has := func(refs []api.CallRef, fn string) bool {
		for _, r := range refs {
			if r.Function == fn {
				return true
			}
		}
		return false
	}
	if !has(g.Callees, "path_lookupat") {
		t.Errorf("callees %v lack path_lookupat", g.Callees)
	}
	if len(g.Callers) < 2 {
		t.Errorf("callers %v: want the path-walking entry points", g.Callers)
	}
	// Every caller's site really is a call to filename_lookup.
	for _, r := range g.Callers {
		m, err := client.Read(ctx, fmt.Sprintf("%#x", uint64(r.Site)), 5)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := hex.DecodeString(m.Bytes)
		rel := int32(uint32(b[1]) | uint32(b[2])<<8 | uint32(b[3])<<16 | uint32(b[4])<<24)
		if (b[0] != 0xe8 && b[0] != 0xe9) || uint64(r.Site)+5+uint64(int64(rel)) != uint64(g.Address) {
			t.Errorf("caller site %s (%x) does not call filename_lookup", r.At, b)
		}
	}
}
