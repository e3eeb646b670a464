package unwind

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The oracle: readelf --debug-dump=frames-interp, which prints for every
// FDE a row per location its CFA program reaches, with the CFA, each
// register the FDE mentions, and the return address ("ra"), in the
// notation Rule.String and CFA.String reproduce.

type refRow struct {
	pc           uint64
	cfa, rbp, ra string
}

func (r refRow) String() string { return fmt.Sprintf("%#x %s %s %s", r.pc, r.cfa, r.rbp, r.ra) }

type refEntry struct {
	section    string
	begin, end uint64
	cie        string
	rows       []refRow
}

var (
	reSection = regexp.MustCompile(`^Contents of the (\S+) section`)
	reCIE     = regexp.MustCompile(`^([0-9a-f]{8}) [0-9a-f]+ [0-9a-f]+ CIE`)
	reFDE     = regexp.MustCompile(`^([0-9a-f]{8}) [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]{8}) pc=([0-9a-f]+)\.\.([0-9a-f]+)`)
	reRow     = regexp.MustCompile(`^[0-9a-f]{16} `)
	reToken   = regexp.MustCompile(`r\d+ \([^)]*\)|\S+`)
)

// readelfFDEs runs readelf and returns its FDEs with their rows. An FDE
// whose instructions are all nops prints no rows: its rows are its CIE's.
func readelfFDEs(t testing.TB, path string) []*refEntry {
	t.Helper()
	// readelf exits 1 on some libraries (libc.so.6) after printing the
	// whole dump; only a missing dump is a failure.
	out, err := exec.Command("readelf", "--debug-dump=frames-interp", path).Output()
	if err != nil && !bytes.Contains(out, []byte("Contents of the")) {
		t.Skipf("readelf: %v", err)
	}
	var fdes []*refEntry
	cies := map[string]*refEntry{}
	var section string
	var cols []string
	var cur *refEntry
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case reSection.MatchString(line):
			section = reSection.FindStringSubmatch(line)[1]
			cur = nil
		case reCIE.MatchString(line):
			cur = &refEntry{section: section}
			cies[section+"/"+reCIE.FindStringSubmatch(line)[1]] = cur
		case reFDE.MatchString(line):
			m := reFDE.FindStringSubmatch(line)
			cur = &refEntry{section: section, cie: section + "/" + m[2]}
			cur.begin, _ = strconv.ParseUint(m[3], 16, 64)
			cur.end, _ = strconv.ParseUint(m[4], 16, 64)
			fdes = append(fdes, cur)
		case strings.Contains(line, "LOC") && strings.Contains(line, "CFA"):
			cols = strings.Fields(line)
		case reRow.MatchString(line):
			if cur == nil {
				t.Fatalf("row outside an entry: %q", line)
			}
			tok := reToken.FindAllString(line, -1)
			if len(tok) != len(cols) {
				t.Fatalf("row %q has %d columns, header %q", line, len(tok), cols)
			}
			r := refRow{rbp: "u", ra: "u"}
			r.pc, _ = strconv.ParseUint(tok[0], 16, 64)
			for i, c := range cols[1:] {
				switch c {
				case "CFA":
					r.cfa = tok[i+1]
				case "rbp":
					r.rbp = tok[i+1]
				case "ra":
					r.ra = tok[i+1]
				}
			}
			cur.rows = append(cur.rows, r)
		}
	}
	for _, f := range fdes {
		if len(f.rows) == 0 {
			c := cies[f.cie]
			if c == nil || len(c.rows) == 0 {
				t.Fatalf("FDE %#x..%#x has no rows and its CIE %s none", f.begin, f.end, f.cie)
			}
			r := c.rows[len(c.rows)-1]
			r.pc = f.begin
			f.rows = []refRow{r}
		}
	}
	return fdes
}

// readelfTable joins readelf's FDEs into the rows a Table must have: the
// FDEs by start (.eh_frame before .debug_frame at one start, a duplicate
// start dropped, empty FDEs dropped), each FDE's rows clipped to its
// range, a later row at one pc replacing an earlier one, a row equal to
// the one before it dropped, and "u u u" rows over the gaps.
func readelfTable(fdes []*refEntry) []refRow {
	rank := func(s string) int {
		if s == ".eh_frame" {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(fdes, func(a, b *refEntry) int {
		if c := cmp.Compare(a.begin, b.begin); c != 0 {
			return c
		}
		return rank(a.section) - rank(b.section)
	})
	var out []refRow
	add := func(r refRow) {
		for len(out) > 0 && out[len(out)-1].pc >= r.pc {
			out = out[:len(out)-1]
		}
		if n := len(out); n > 0 && out[n-1].cfa == r.cfa && out[n-1].rbp == r.rbp && out[n-1].ra == r.ra {
			return
		}
		out = append(out, r)
	}
	var prev *refEntry
	for _, f := range fdes {
		if f.begin >= f.end || (prev != nil && f.begin == prev.begin) {
			continue
		}
		if prev != nil && prev.end < f.begin {
			add(refRow{prev.end, "u", "u", "u"})
		}
		for _, r := range f.rows {
			if r.pc >= f.begin && r.pc < f.end {
				add(r)
			}
		}
		prev = f
	}
	if prev != nil {
		add(refRow{prev.end, "u", "u", "u"})
	}
	return out
}

// tableRows is t in the oracle's form.
func tableRows(t *Table) []refRow {
	out := make([]refRow, t.Len())
	for i := range out {
		r := t.Row(i)
		out[i] = refRow{r.PC, r.CFA.String(), r.RBP.String(), r.RA.String()}
	}
	return out
}

// compareWithReadelf checks that the table of path has exactly the rows
// readelf gives, and returns the number of rows.
func compareWithReadelf(t *testing.T, path string) *Table {
	t.Helper()
	tab, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	fdes := readelfFDEs(t, path)
	want := readelfTable(fdes)
	got := tableRows(tab)
	if len(fdes) == 0 || len(want) == 0 {
		t.Fatalf("readelf shows no FDEs for %s", path)
	}
	bad := 0
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w refRow
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("row %d: got %v, readelf %v", i, g, w)
			if bad++; bad > 10 {
				t.Fatalf("more differences; %d rows vs readelf's %d", len(got), len(want))
			}
		}
	}
	if tab.Skipped != 0 || tab.Unfit != 0 {
		t.Errorf("%d FDEs skipped, %d rows unfit", tab.Skipped, tab.Unfit)
	}
	t.Logf("%s: %d FDEs, %d rows (%d bytes) equal readelf's", path, tab.FDEs, tab.Len(), tab.Bytes())
	return tab
}

func TestSystemLibrariesMatchReadelf(t *testing.T) {
	for _, lib := range systemLibraries {
		t.Run(lib.name, func(t *testing.T) {
			compareWithReadelf(t, existing(t, lib.path))
		})
	}
}
