package unwind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildC compiles testdata/blocker.c with gcc and the given flags.
func buildC(t testing.TB, flags ...string) string {
	t.Helper()
	return buildCFile(t, "testdata/blocker.c", flags...)
}

// buildCFile compiles one C file with gcc -O2 and the given flags.
func buildCFile(t testing.TB, src string, flags ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c"))
	args := append([]string{"-O2", "-o", out, src}, flags...)
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, b)
	}
	return out
}

// buildGo builds a small Go program with DWARF (a compressed .debug_frame
// and no .eh_frame).
func buildGo(t testing.TB) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not in PATH")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/hello.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"main.go": string(src), "go.mod": "module hello\n\ngo 1.21\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "hello")
	cmd := exec.Command(goCmd, "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// TestBuiltBinariesMatchReadelf compares with readelf directly: the bytes
// of these binaries depend on the compiler, so they have no golden file.
func TestBuiltBinariesMatchReadelf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		build    func(t testing.TB) string
		sections []string
	}{
		{"c-frame-pointers", func(t testing.TB) string { return buildC(t, "-fno-omit-frame-pointer") }, []string{".eh_frame"}},
		{"c-no-frame-pointers", func(t testing.TB) string { return buildC(t, "-fomit-frame-pointer") }, []string{".eh_frame"}},
		{"c-static", func(t testing.TB) string { return buildC(t, "-static", "-fomit-frame-pointer") }, []string{".eh_frame"}},
		{"c-debug-frame", func(t testing.TB) string {
			return buildC(t, "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables")
		}, []string{".eh_frame", ".debug_frame"}}, // crt1.o brings .eh_frame
		{"go", buildGo, []string{".debug_frame"}},
		// Relocatable objects: the FDE addresses are relocations against
		// the text sections, which readelf applies.
		{"c-object", func(t testing.TB) string { return buildCFile(t, "testdata/drap.c", "-c") }, []string{".eh_frame"}},
		{"c-object-debug-frame", func(t testing.TB) string {
			return buildCFile(t, "testdata/blocker.c", "-c", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables")
		}, []string{".debug_frame"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := compareWithReadelf(t, tc.build(t))
			if tc.sections != nil && !equalStrings(tab.Sections, tc.sections) {
				t.Errorf("sections %q, want %q", tab.Sections, tc.sections)
			}
		})
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
