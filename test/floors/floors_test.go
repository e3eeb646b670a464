// Package floors checks that the packages import downward only, as
// docs/ARCHITECTURE.md draws their floors.
package floors

import (
	"bufio"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	module = "github.com/kinst/kinst/"
	root   = "../.."
)

// floor is one floor of the drawing: its package names (a name ending in
// "/", or followed by "…", covers the packages under it as well).
type floor struct {
	exact, prefix []string
}

// readFloors parses the drawing under "## The floors": a fenced block
// whose floors are separated by rules of '─', each line's package names
// in its first column (up to the description's column).
func readFloors(t *testing.T) []floor {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs/ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var floors []floor
	section, fence := false, false
	cur := floor{}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## The floors"
			continue
		case !section:
			continue
		case strings.HasPrefix(line, "```"):
			if fence {
				floors = append(floors, cur)
				return floors
			}
			fence = true
			continue
		case !fence:
			continue
		case strings.HasPrefix(line, "─"):
			floors = append(floors, cur)
			cur = floor{}
			continue
		}
		col := line
		if i := strings.Index(line, "  "); i >= 0 {
			col = line[:i]
		}
		names := strings.FieldsFunc(col, func(r rune) bool { return r == ' ' || r == ',' })
		for i, n := range names {
			if n == "…" {
				continue
			}
			more := i+1 < len(names) && names[i+1] == "…"
			n = strings.TrimSuffix(n, "/")
			cur.exact = append(cur.exact, n)
			if strings.HasSuffix(names[i], "/") || more || n == "internal" {
				cur.prefix = append(cur.prefix, n+"/")
			}
		}
	}
	t.Fatal("docs/ARCHITECTURE.md: no floor drawing under ## The floors")
	return nil
}

// floorOf is the index of pkg's floor (0 is the top), by an exact name,
// else the longest prefix; -1 if the drawing does not place it.
func floorOf(floors []floor, pkg string) int {
	best, bestLen := -1, -1
	for i, f := range floors {
		if slices.Contains(f.exact, pkg) {
			return i
		}
		for _, p := range f.prefix {
			if strings.HasPrefix(pkg, p) && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	return best
}

// imports maps every package of the module (its non-test files; test/ is
// the live tests, above every floor) to the module's packages it imports.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || rel == "test" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if q, ok := strings.CutPrefix(p, module); ok && !slices.Contains(out[pkg], q) {
				out[pkg] = append(out[pkg], q)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestImportsGoDownward(t *testing.T) {
	floors := readFloors(t)
	if len(floors) < 5 {
		t.Fatalf("the drawing has %d floors: %+v", len(floors), floors)
	}
	graph := imports(t)
	if len(graph) < 30 {
		t.Fatalf("found %d packages", len(graph))
	}
	for pkg, deps := range graph {
		from := floorOf(floors, pkg)
		if from < 0 {
			t.Errorf("%s is on no floor of docs/ARCHITECTURE.md", pkg)
			continue
		}
		for _, dep := range deps {
			if to := floorOf(floors, dep); to >= 0 && to < from {
				t.Errorf("%s (floor %d) imports %s (floor %d): up a floor", pkg, from, dep, to)
			}
		}
	}
}

// The check itself: a made-up drawing places packages as documented and
// an upward import is one it reports.
func TestFloorOf(t *testing.T) {
	floors := []floor{
		{exact: []string{"cmd/kinst"}},
		{exact: []string{"api", "report"}},
		{exact: []string{"core", "core/dump"}, prefix: []string{"core/"}},
		{exact: []string{"internal"}, prefix: []string{"internal/"}},
	}
	for pkg, want := range map[string]int{"cmd/kinst": 0, "report": 1, "core/slab/slabtest": 2, "core": 2, "internal/att": 3, "nowhere": -1} {
		if got := floorOf(floors, pkg); got != want {
			t.Errorf("floorOf(%s) = %d, want %d", pkg, got, want)
		}
	}
}

// The public contract stands alone: api imports none of the module's
// packages and output only api, so a program can drive kerninstd or read
// kinst's reports without the rest of kinst.
func TestContractStandsAlone(t *testing.T) {
	graph := imports(t)
	for pkg, allowed := range map[string][]string{"api": nil, "output": {"api"}} {
		deps, ok := graph[pkg]
		if !ok {
			t.Errorf("no package %s", pkg)
		}
		for _, dep := range deps {
			if !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s: it may import only %v of the module", pkg, dep, allowed)
			}
		}
	}
}
