package unwind

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kinst/kinst/internal/elfsym"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the installed libraries")

// summary describes a table for a golden file: counts of each rule, every
// row the unwinder cannot follow (named by symbol), and a digest of all
// rows, so that any change shows up without the library's bytes in the
// repository.
func summary(name, path string, tab *Table) (string, error) {
	syms, err := elfsym.Open(path)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# unwind table of %s; regenerate with: go test ./unwind -run Golden -update\n", name)
	fmt.Fprintf(&b, "build-id %s\nsections %s\nfdes %d\nrows %d\nbytes-per-row %d\n",
		syms.BuildID(), strings.Join(tab.Sections, " "), tab.FDEs, tab.Len(), RowBytes)
	counts := map[string]int{}
	var unsupported []string
	h := sha256.New()
	for i := 0; i < tab.Len(); i++ {
		r := tab.Row(i)
		fmt.Fprintf(h, "%x %s %s %s\n", r.PC, r.CFA, r.RBP, r.RA)
		counts["cfa "+ruleClass(r.CFA.String())+kindNote(r.CFA)]++
		counts["rbp "+ruleClass(r.RBP.String())]++
		counts["ra "+ruleClass(r.RA.String())]++
		if why := unsupportedRow(r); why != "" {
			where := "(no symbol)"
			if s, off, ok := syms.Lookup(r.PC); ok {
				where = fmt.Sprintf("%s+%#x", s.Name, off)
			}
			unsupported = append(unsupported, fmt.Sprintf("%#x %s: %s", r.PC, where, why))
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %d\n", k, counts[k])
	}
	fmt.Fprintf(&b, "rows-sha256 %x\n", h.Sum(nil))
	fmt.Fprintf(&b, "unsupported %d\n", len(unsupported))
	for _, u := range unsupported {
		fmt.Fprintf(&b, "  %s\n", u)
	}
	return b.String(), nil
}

// ruleClass replaces the number of a rule by N: "rsp+8" → "rsp+N".
func ruleClass(s string) string {
	return strings.TrimRight(strings.NewReplacer("+", "+N", "-", "-N").Replace(s), "0123456789")
}

func kindNote(c CFA) string {
	if c.Kind == CFAPLT {
		return fmt.Sprintf(" (plt, threshold %d)", c.Threshold)
	}
	return ""
}

// unsupportedRow says why Stack cannot follow a row with CFI, or "".
func unsupportedRow(r Row) string {
	var why []string
	switch {
	case r.CFA.Kind == CFAExpression:
		why = append(why, "CFA expression")
	case r.CFA.Kind == CFARegOffset && r.CFA.Reg != RegRSP && r.CFA.Reg != RegRBP:
		why = append(why, "CFA based on "+r.CFA.Reg.String())
	}
	if k := r.RBP.Kind; k == RuleExpression || k == RuleValExpression || k == RuleRegister {
		why = append(why, "rbp "+r.RBP.String())
	}
	if k := r.RA.Kind; r.CFA.Kind != CFANone && k != RuleOffset && k != RuleUndefined {
		why = append(why, "return address "+r.RA.String())
	}
	return strings.Join(why, ", ")
}

func TestGolden(t *testing.T) {
	for _, lib := range systemLibraries {
		t.Run(lib.name, func(t *testing.T) {
			path := existing(t, lib.path)
			tab, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := summary(lib.name, path, tab)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", lib.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if id := buildIDLine(string(want)); id != buildIDLine(got) {
				t.Skipf("installed %s (%s) is not the one in %s (%s): run with -update", lib.name, buildIDLine(got), golden, id)
			}
			if got != string(want) {
				t.Errorf("%s differs from the table of %s:\n--- got\n%s\n--- want\n%s", golden, path, got, want)
			}
		})
	}
}

func buildIDLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "build-id ") {
			return l
		}
	}
	return ""
}
