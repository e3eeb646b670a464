package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/commands.md and docs/man from the command table")

const (
	referencePath = "../../docs/commands.md"
	manDir        = "../../docs/man"
)

// docs/commands.md and docs/man are what gendocs makes from the command
// table now: a flag or help text changed without go generate fails here.
// go test ./cmd/kinst -run TestDocs -update rewrites them.
func TestDocsMatchTable(t *testing.T) {
	ref, pages := referenceDocs()
	if *update {
		if err := os.WriteFile(referencePath, ref, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := writeManDir(manDir, pages); err != nil {
			t.Fatal(err)
		}
	}
	const fix = " (go generate ./cmd/kinst, or go test ./cmd/kinst -run TestDocs -update)"
	if got, err := os.ReadFile(referencePath); err != nil || !bytes.Equal(got, ref) {
		t.Errorf("docs/commands.md differs from the command table%s: %v", fix, err)
	}
	have, _ := filepath.Glob(filepath.Join(manDir, "*.1"))
	for _, p := range have {
		if _, ok := pages[filepath.Base(p)]; !ok {
			t.Errorf("docs/man/%s: no such command%s", filepath.Base(p), fix)
		}
	}
	for name, b := range pages {
		if got, err := os.ReadFile(filepath.Join(manDir, name)); err != nil || !bytes.Equal(got, b) {
			t.Errorf("docs/man/%s differs from the command table%s: %v", name, fix, err)
		}
	}
}

// The reference lists every command --help lists, each with its flags;
// each man page is well-formed roff (groff, where installed, warns of
// nothing).
func TestDocsComplete(t *testing.T) {
	ref, pages := referenceDocs()
	var usage bytes.Buffer
	writeUsage(&usage)
	for _, d := range visibleCommands() {
		if !bytes.Contains(ref, []byte("\n## kinst "+d.path+"\n")) {
			t.Errorf("reference: no section for kinst %s", d.path)
		}
		if !strings.Contains(usage.String(), "kinst "+d.path) {
			t.Errorf("kinst %s is in the reference but not in kinst --help", d.path)
		}
		page := string(pages[dashed(d.path)+".1"])
		if !strings.HasPrefix(page, `.\"`) || !strings.Contains(page, "\n.SH NAME\n") || !strings.Contains(page, "\n.SH SYNOPSIS\n") {
			t.Errorf("%s.1: no NAME or SYNOPSIS:\n%s", dashed(d.path), page)
		}
	}
	if bytes.Contains(ref, []byte("gendocs")) {
		t.Error("the hidden gendocs command is in the reference")
	}
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Skip("groff is not installed: man pages not rendered")
	}
	for name, b := range pages {
		cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
		cmd.Stdin = bytes.NewReader(b)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("groff %s: %v\n%s", name, err, out)
		}
	}
}
