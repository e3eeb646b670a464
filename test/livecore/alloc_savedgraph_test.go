package livecore

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSavedGraph: a type graph saved for a dump of the guest and loaded
// again reports what the built one did; istype on the loaded graph
// (incremental) types what a full rebuild with that type set by hand
// types; whattype through the saved graph answers as without it; a
// second dump of the guest, whose heap has moved, is refused the first
// one's graph.
func TestSavedGraph(t *testing.T) {
	path := dumpGuest(t, "savedgraph.elf", "elf")
	g := filepath.Join(t.TempDir(), "graph")
	type report struct {
		Objects       int `json:"objects"`
		Typed         int `json:"typed"`
		ByHand        int `json:"by_hand"`
		Conflicts     int `json:"conflicts"`
		Claims        int `json:"claims"`
		GreatestReach *struct {
			Object string `json:"object"`
			Reach  int    `json:"reach"`
		} `json:"greatest_reach"`
	}
	var built, loaded report
	if err := json.Unmarshal(kinst(t, "core", path, "typegraph", "--graph-file", g, "--json"), &built); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(kinst(t, "core", path, "typegraph", "--graph-file", g, "--json"), &loaded); err != nil {
		t.Fatal(err)
	}
	bj, _ := json.Marshal(built)
	lj, _ := json.Marshal(loaded)
	if string(bj) != string(lj) || built.Objects == 0 || built.GreatestReach == nil {
		t.Fatalf("built %s, loaded %s", bj, lj)
	}
	obj := built.GreatestReach.Object
	// The full rebuild, with the object typed by hand.
	var full report
	if err := json.Unmarshal(kinst(t, "core", path, "istype", obj, "sock", "--json"), &full); err != nil {
		t.Fatal(err)
	}
	var inc struct {
		NewlyTyped int `json:"newly_typed"`
		Typed      int `json:"typed"`
		NS         int64
	}
	if err := json.Unmarshal(kinst(t, "core", path, "istype", obj, "sock", "--graph-file", g, "--json"), &inc); err != nil {
		t.Fatal(err)
	}
	// The incremental graph keeps every type it had and runs the later
	// passes once more from the new one, so it may type a few objects a
	// full rebuild types otherwise or not at all: never more than it
	// newly typed, and the object itself is one of those.
	diff := inc.Typed - full.Typed
	if full.ByHand != 1 || inc.NewlyTyped < 1 || inc.Typed != built.Typed+inc.NewlyTyped || diff < -inc.NewlyTyped || diff > inc.NewlyTyped {
		t.Errorf("istype %s sock: incremental %+v; full rebuild typed %d (before %d)", obj, inc, full.Typed, built.Typed)
	}
	t.Logf("istype %s sock: %d newly typed, incremental %.1f ms; %d typed", obj, inc.NewlyTyped, float64(inc.NS)/1e6, inc.Typed)
	// whattype of that object, through the saved graph: by istype now.
	var w whatJSON
	if err := json.Unmarshal(kinst(t, "core", path, "whattype", obj, "--graph-file", g, "--json"), &w); err != nil {
		t.Fatal(err)
	}
	if w.Type == nil || *w.Type != "sock" || w.Source == nil || *w.Source != "istype" {
		t.Errorf("whattype %s with the saved graph: %+v", obj, w)
	}
	// The shell, on the saved graph: one JSON value a line per command.
	sh := exec.Command(filepath.Join(bin, "kinst"), "core", path, "shell", "--graph-file", g, "--json")
	sh.Stdin = strings.NewReader("whattype " + obj + "\nreach\nbogus\n" +
		"p ((struct task_struct *)&init_task)->comm\nstruct task_struct init_task -m pid,comm\n" +
		"list task_struct.tasks ((struct task_struct *)&init_task)->tasks -s pid\nquit\nwhattype " + obj + "\n")
	so, err := sh.Output()
	if err != nil {
		t.Fatalf("shell: %v\n%s", err, so)
	}
	lines := strings.Split(strings.TrimSpace(string(so)), "\n")
	var sw whatJSON
	var reach struct {
		GreatestReach *struct {
			Object string `json:"object"`
		} `json:"greatest_reach"`
	}
	var bad struct{ Error string }
	var comm struct{ Value string }
	var task struct {
		Members []struct {
			Name  string
			Value any
		}
	}
	var list []struct {
		Members []struct{ Value float64 }
	}
	if len(lines) != 6 || json.Unmarshal([]byte(lines[0]), &sw) != nil || json.Unmarshal([]byte(lines[1]), &reach) != nil ||
		json.Unmarshal([]byte(lines[2]), &bad) != nil || json.Unmarshal([]byte(lines[3]), &comm) != nil ||
		json.Unmarshal([]byte(lines[4]), &task) != nil || json.Unmarshal([]byte(lines[5]), &list) != nil {
		t.Fatalf("shell output: %s", so)
	}
	if comm.Value != "swapper/0" || len(task.Members) != 2 || task.Members[1].Value != "swapper/0" || len(list) < 10 || list[0].Members[0].Value != 1 {
		t.Errorf("shell: p %+v, struct %+v, list of %d (first %+v)", comm, task, len(list), list[:min(len(list), 1)])
	}
	if sw.Type == nil || *sw.Type != "sock" || reach.GreatestReach == nil || reach.GreatestReach.Object == obj || bad.Error == "" {
		t.Errorf("shell: whattype %+v, reach %+v, bogus %+v", sw, reach.GreatestReach, bad)
	}
	// Another dump: the guest has run a command since.
	gsh(t, t.Context(), "ls / > /dev/null")
	other := dumpGuest(t, "savedgraph2.elf", "elf")
	out, err := exec.Command(filepath.Join(bin, "kinst"), "core", other, "typegraph", "--graph-file", g).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another dump") {
		t.Errorf("another dump's graph: %v\n%s", err, out)
	}
}
