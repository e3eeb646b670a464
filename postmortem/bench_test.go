package postmortem_test

import (
	"os"
	"testing"

	"github.com/kinst/kinst/postmortem"
)

// BenchmarkTyped times what a crash or drgn user does most, on a dump
// opened once (KINST_BENCH_DUMP; KINST_BENCH_VMLINUX for a debug
// vmlinux), after the first answer has read the types: p of a global's
// member (cast: BTF types no global but per-CPU ones), struct of a task
// printed whole, and the task list walked with each task's comm, as
// `kinst core DUMP shell` answers them.
//
//	KINST_BENCH_DUMP=guest.elf go test -run - -bench Typed ./postmortem
func BenchmarkTyped(b *testing.B) {
	path := os.Getenv("KINST_BENCH_DUMP")
	if path == "" {
		b.Skip("KINST_BENCH_DUMP names no dump")
	}
	k, err := postmortem.Open(path, postmortem.Options{Vmlinux: os.Getenv("KINST_BENCH_VMLINUX")})
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	init, ok := k.Symbol("init_task")
	if !ok {
		b.Fatal("no init_task")
	}
	b.Run("p ((struct task_struct *)&init_task)->comm", func(b *testing.B) {
		for b.Loop() {
			o, err := k.Eval("((struct task_struct *)&init_task)->comm")
			if err != nil {
				b.Fatal(err)
			}
			if s, err := o.String(); err != nil || s == "" {
				b.Fatalf("comm %q, %v", s, err)
			}
		}
	})
	b.Run("struct task_struct", func(b *testing.B) {
		for b.Loop() {
			o, err := k.Object("task_struct", init)
			if err != nil {
				b.Fatal(err)
			}
			if o.Format("init_task") == "" {
				b.Fatal("nothing printed")
			}
		}
	})
	b.Run("list task_struct.tasks -s comm", func(b *testing.B) {
		for b.Loop() {
			first, _ := k.Object("task_struct", init)
			tl, _ := first.Member("tasks")
			at, _ := tl.Address()
			tasks, err := k.Entries(at, "task_struct", "tasks")
			if err != nil || len(tasks) == 0 {
				b.Fatalf("%d tasks, %v", len(tasks), err)
			}
			for _, t := range tasks {
				c, _ := t.Member("comm")
				c.String()
			}
		}
	})
}
