package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/output"
)

// TestUnwindTableNamesFromDebugPackage: with Debian's libc6-dbg, the rows
// of libc's internal functions, which its .dynsym does not cover, are
// named as gdb (reading the same debug file) names them.
func TestUnwindTableNamesFromDebugPackage(t *testing.T) {
	syms, err := elfsym.Open(libc)
	if err != nil {
		t.Skip(err)
	}
	id := syms.BuildID()
	debug := filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")
	if _, err := os.Stat(debug); err != nil {
		t.Skipf("no libc debug file (apt-get install libc6-dbg): %v", err)
	}
	dsyms, err := elfsym.Open(debug)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := ShowUnwindTable(libc, nil, true, &out, SymbolOptions{NoDemangle: true}); err != nil {
		t.Fatal(err)
	}
	var rep output.UnwindTable
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	var fresh []output.UnwindRow
	for _, r := range rep.Rows {
		var pc uint64
		fmt.Sscanf(r.PC, "0x%x", &pc)
		if _, _, ok := syms.Lookup(pc); !ok && r.Symbol != "" && r.CFA != "u" {
			fresh = append(fresh, r)
		}
	}
	t.Logf("%d of %d rows named only by the debug file", len(fresh), len(rep.Rows))
	if len(fresh) < 100 {
		t.Fatalf("only %d rows named by the debug file", len(fresh))
	}
	if _, err := exec.LookPath("gdb"); err != nil {
		t.Skip("no gdb to compare names with")
	}
	args := []string{"-batch", "-nx", "-iex", "set debuginfod enabled off"}
	step := len(fresh) / 20
	var picked []output.UnwindRow
	for i := 0; i < len(fresh); i += step {
		picked = append(picked, fresh[i])
		args = append(args, "-ex", "info symbol "+fresh[i].PC)
	}
	b, err := exec.Command("gdb", append(args, libc)...).CombinedOutput()
	if err != nil {
		t.Fatalf("gdb: %v\n%s", err, b)
	}
	var answers []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, " in section ") {
			name, _, _ := strings.Cut(line, " in section ")
			name = strings.Replace(name, " + ", "+", 1)
			answers = append(answers, name)
		}
	}
	if len(answers) != len(picked) {
		t.Fatalf("gdb answered %d of %d:\n%s", len(answers), len(picked), b)
	}
	// Of aliases (local symbols at one address: modff128 and
	// __modff128), gdb's choice is its own: the name must be one of
	// them, at the offset gdb gives.
	for i, r := range picked {
		var off int
		want := answers[i]
		if n, o, ok := strings.Cut(want, "+"); ok {
			fmt.Sscanf(o, "%d", &off)
			want = n
		}
		name, gotOff, _ := strings.Cut(r.Symbol, "+")
		wantOff := ""
		if off != 0 {
			wantOff = fmt.Sprintf("%#x", off)
		}
		a1, ok1 := dsyms.Addr(name)
		a2, ok2 := dsyms.Addr(want)
		if gotOff != wantOff || !ok1 || !ok2 || a1 != a2 {
			t.Errorf("row %s: %q, gdb says %s+%d", r.PC, r.Symbol, want, off)
		}
	}
}
