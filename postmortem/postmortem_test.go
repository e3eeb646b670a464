package postmortem_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/internal/dumpgen"
	"github.com/kinst/kinst/kernel/typed"
	"github.com/kinst/kinst/postmortem"
)

// A kdump of a tiny kernel (init_task alone, "swapper/0"), its types
// from a BTF file: every entry point of the package reads what the dump
// holds, and bad input says what is wrong.
func TestOpen(t *testing.T) {
	k, err := postmortem.Open(dumpgen.LinuxKdump(t, false), postmortem.Options{BTF: btftest.TaskFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if r := k.Release(); r != "6.1.0-test" {
		t.Errorf("release %q", r)
	}
	addr, ok := k.Symbol("init_task")
	if !ok || addr != dumpgen.LinuxInitTask {
		t.Fatalf("init_task at %#x, %v; want %#x", addr, ok, uint64(dumpgen.LinuxInitTask))
	}
	if name, ok := k.SymbolAt(addr + 0x60); !ok || name != "init_task+0x60" {
		t.Errorf("SymbolAt: %q, %v", name, ok)
	}
	tasks, err := k.Tasks()
	if err != nil || len(tasks) != 1 || tasks[0].PID != 0 || tasks[0].Comm != "swapper/0" {
		t.Errorf("tasks %+v, %v", tasks, err)
	}
	task, err := k.Object("task_struct", addr)
	if err != nil {
		t.Fatal(err)
	}
	comm, err := task.Member("comm")
	if err != nil {
		t.Fatal(err)
	}
	if s, err := comm.String(); err != nil || s != "swapper/0" {
		t.Errorf("init_task.comm = %q, %v", s, err)
	}
	if typ := comm.Type(); typ != "char [16]" {
		t.Errorf("comm's type %q", typ)
	}
	// The same through an expression, a cast of the untyped symbol.
	pid, err := k.Eval("((struct task_struct *)&init_task)->pid")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := pid.Int(); err != nil || v != 0 {
		t.Errorf("pid = %d, %v", v, err)
	}
	if out := task.Format("init_task"); !strings.Contains(out, `comm = "swapper/0"`) {
		t.Errorf("Format:\n%s", out)
	}
	// init_task's list holds no other task.
	head, _ := task.Member("tasks")
	ha, err := head.Address()
	if err != nil {
		t.Fatal(err)
	}
	if es, err := k.Entries(ha, "task_struct", "tasks"); err != nil || len(es) != 0 {
		t.Errorf("entries %v, %v; want none", es, err)
	}
	// Bad input: a member, a type, an expression, the variable BTF does not type.
	if _, err := task.Member("nope"); !errors.Is(err, typed.ErrNoType) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("member nope: %v", err)
	}
	if _, err := k.Object("no_such_struct", addr); err == nil {
		t.Error("Object of an unknown type: no error")
	}
	if _, err := k.Eval("init_task.comm"); !errors.Is(err, typed.ErrNoType) {
		t.Errorf("an untyped variable: %v; want ErrNoType", err)
	}
	if _, err := k.Eval("init_task +"); err == nil {
		t.Error("a broken expression: no error")
	}
}

func TestOpenBadInput(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, []byte("not a dump at all"), 0o600)
	for _, path := range []string{junk, filepath.Join(t.TempDir(), "missing")} {
		if k, err := postmortem.Open(path, postmortem.Options{}); err == nil {
			k.Close()
			t.Errorf("Open(%s): no error", path)
		}
	}
}
