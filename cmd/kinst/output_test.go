package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every command with -o FILE, made to fail after it has started: an
// existing FILE is left as it was (the report goes to a temporary file
// renamed over FILE only on success). Each command fails where it first
// needs something that is not there: kerninstd, a file, a process, the
// test VM.
func TestOutputKeptOnFailure(t *testing.T) {
	dir := t.TempDir()
	dead := filepath.Join(dir, "kerninstd.sock") // nothing listens
	t.Setenv("KINST_VM_STATE", filepath.Join(dir, "no-vm"))
	missing := filepath.Join(dir, "missing")
	fails := map[string][]string{
		"count":             {"lookuppn"},
		"cover":             {"vfs_read"},
		"cover report":      {"x"},
		"cover diff":        {missing, missing},
		"cover lcov":        {missing},
		"time":              {"vfs_read"},
		"waiters":           {"jiffies_lock"},
		"drilldown":         {"vfs_read", "--", "true"},
		"watch":             nil,
		"ls":                nil,
		"detach":            {"x"},
		"rd":                {"jiffies"},
		"cfg":               {"vfs_read"},
		"lines":             {"vfs_read"},
		"annotate":          {"vfs_read", "-d", "1s"},
		"bench splice":      {"vfs_read"},
		"bench hit":         nil,
		"bench churn":       {"vfs_read", "-n", "1"},
		"bench arm":         {"vfs_read", "-n", "1"},
		"bench cover-decay": {"vfs_read"},
		"offcpu":            {"-p", "999999999", "-d", "1s"},
		"unwind table":      {missing},
		"unwind stack":      {"999999999"},
		"core":              {missing, "info"},
		"vm status":         nil,
		"vm bisect":         {missing},
	}
	// These report the state of things and succeed without kerninstd or
	// a driver: they overwrite the file.
	succeed := map[string][]string{"version": nil, "driver status": nil}
	eachCommand(true, func(path string, c *command) {
		if !c.report {
			return
		}
		args, fail := fails[path]
		if !fail {
			if args, ok := succeed[path]; ok {
				out := filepath.Join(dir, strings.ReplaceAll(path, " ", "-")+".out")
				os.WriteFile(out, []byte("old\n"), 0o644)
				argv := append(append(strings.Fields(path), args...), "-o", out)
				if status, _, stderr := kinst(t, argv...); status != 0 {
					t.Errorf("kinst %s: status %d: %s", strings.Join(argv, " "), status, stderr)
				} else if b, _ := os.ReadFile(out); string(b) == "old\n" || len(b) == 0 {
					t.Errorf("kinst %s succeeded and left the file %q", strings.Join(argv, " "), b)
				}
				return
			}
			t.Errorf("kinst %s takes -o: add it to this test", path)
			return
		}
		out := filepath.Join(dir, strings.ReplaceAll(path, " ", "-")+".out")
		if err := os.WriteFile(out, []byte("keep me\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		argv := append(strings.Fields(path), "-o", out)
		if c.daemon {
			argv = append(argv, "--addr", dead)
		}
		// Flags go before a -- CMD.
		for i, a := range args {
			if a == "--" {
				argv = append(append(argv, args[:i]...), args[i:]...)
				args = nil
				break
			}
		}
		argv = append(argv, args...)
		status, _, stderr := kinst(t, argv...)
		if status != 1 {
			// 2 would be a usage error: the command never started.
			t.Errorf("kinst %s: status %d (%s), want 1: a failure once it ran", strings.Join(argv, " "), status, strings.TrimSpace(stderr))
		}
		if b, err := os.ReadFile(out); err != nil || string(b) != "keep me\n" {
			t.Errorf("kinst %s (status %d: %s) left the file %q (%v), want it as it was", strings.Join(argv, " "), status, strings.TrimSpace(stderr), b, err)
		}
		if st, err := os.Stat(out); err == nil && st.Mode().Perm() != 0o600 {
			t.Errorf("kinst %s changed the file's mode to %v", path, st.Mode().Perm())
		}
	})
	left, _ := filepath.Glob(filepath.Join(dir, ".*kinst-*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
