package debuginfo

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// FindModule: the first file of the module's name (either spelling,
// .ko or .ko.debug) under the directories in order, passing over one of
// another build id and one without DWARF.
func TestFindModule(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is not installed")
	}
	build := func(flags ...string) (string, string) {
		out := filepath.Join(t.TempDir(), "m.ko")
		args := append([]string{"-O2", "-nostdlib", "-r", "-Wl,--build-id=sha1"}, flags...)
		cmd := exec.Command("gcc", append(args, "-o", out, "src/cold.c")...)
		cmd.Dir = "testdata"
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, b)
		}
		f, err := Open(out)
		if err != nil {
			if errors.Is(err, ErrNoDebugInfo) {
				return out, ""
			}
			t.Fatal(err)
		}
		defer f.Close()
		return out, f.BuildID
	}
	a, idA := build("-g")
	b, idB := build("-g", "-fno-inline")
	stripped, _ := build()
	if idA == "" || idB == "" || idA == idB {
		t.Skipf("gcc -r gave build ids %q and %q", idA, idB)
	}
	root := t.TempDir()
	put := func(src, rel string) string {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(p, data, 0o644)
		return p
	}
	noDwarf := put(stripped, "first/snd_foo.ko")
	inA := put(a, "second/sound/snd-foo.ko")
	inB := put(b, "third/snd_foo.ko.debug")
	dirs := []string{filepath.Join(root, "first"), filepath.Join(root, "second"), filepath.Join(root, "third")}
	for _, c := range []struct {
		id, want string
	}{{"", inA}, {idA, inA}, {idB, inB}} {
		f, err := FindModule("snd_foo", ModuleSearch{Dirs: dirs, BuildID: c.id})
		if err != nil {
			t.Errorf("build id %q: %v", c.id, err)
			continue
		}
		if f.Path != c.want {
			t.Errorf("build id %q: %s, want %s", c.id, f.Path, c.want)
		}
		f.Close()
	}
	_, err := FindModule("snd_foo", ModuleSearch{Dirs: dirs, BuildID: "00ff"})
	var nf *NotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, ErrNoDebugInfo) || nf.Module != "snd_foo" {
		t.Fatalf("another build: %v, want a NotFoundError of module snd_foo", err)
	}
	msg := err.Error()
	for _, want := range []string{noDwarf, inA + ": build id " + idA + ", the loaded module's is 00ff", "--module-debug"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if _, err := FindModule("snd_foo", ModuleSearch{Root: root, Release: "6.1.0-9-amd64"}); !errors.Is(err, ErrNoDebugInfo) {
		t.Errorf("no such release: %v", err)
	}
}
