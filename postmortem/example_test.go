package postmortem_test

import (
	"fmt"
	"log"

	"github.com/kinst/kinst/postmortem"
)

// Print every task's pid and command, then one task's scheduling state
// member by member, from a crash dump (postmortem.Live: the running
// kernel).
func Example() {
	k, err := postmortem.Open("/var/crash/vmcore", postmortem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer k.Close()
	tasks, err := k.Tasks()
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range tasks {
		fmt.Println(t.PID, t.Comm)
	}
	// Typed reading: CPU 1's runqueue, a per-CPU variable BTF types.
	nr, err := k.Eval("per_cpu(runqueues, 1).nr_running")
	if err != nil {
		log.Fatal(err)
	}
	n, _ := nr.Uint()
	fmt.Println("running on CPU 1:", n)
	// Walk a list as list_for_each_entry does: the tasks after init_task.
	head, _ := k.Symbol("init_task")
	first, _ := k.Object("task_struct", head)
	tl, _ := first.Member("tasks")
	at, _ := tl.Address()
	entries, err := k.Entries(at, "task_struct", "tasks")
	for _, e := range entries {
		comm, _ := e.Member("comm")
		s, _ := comm.String()
		fmt.Println(s)
	}
	if err != nil {
		log.Print("the list ended early: ", err)
	}
}
