package livecore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// leaksJSON is `kinst core findleaks --json --verbose`.
type leaksJSON struct {
	Objects    int            `json:"objects"`
	Reached    int            `json:"reached"`
	Leaked     int            `json:"leaked"`
	Leaks      int            `json:"leaks"`
	RootRanges map[string]int `json:"root_ranges"`
	Regions    int            `json:"regions"`
	Groups     []struct {
		Cache         string   `json:"cache"`
		Count         int      `json:"count"`
		AllocFunction string   `json:"alloc_function"`
		AllocFrames   []string `json:"alloc_frames"`
		Leaks         []struct {
			Addr  uint64 `json:"addr"`
			Cache string `json:"cache"`
			Size  uint64 `json:"size"`
		} `json:"leaks"`
	} `json:"groups"`
}

// anchored are caches whose every object the kernel keeps on a list or
// tree that a root reaches (the task list, a task's files table, the
// dentry tree, a super block's inodes, the pid idr): none may be a leak.
var anchored = map[string]bool{"task_struct": true, "filp": true, "dentry": true, "inode_cache": true,
	"mm_struct": true, "signal_cache": true, "files_cache": true, "sighand_cache": true, "pid": true}

// checkFindLeaks runs findleaks on a dump (or /proc/kcore through run)
// of the healthy guest, which has no known leak: nearly every object is
// reached; no object of an anchored cache, and not the task_struct of
// the test's own process (task), is a leak; the roots include every
// CPU's per-CPU area, the tasks' stacks and the vmalloc areas; and each
// leak reported in a frozen dump is, by whattype (a separate lookup), an
// allocated object of the cache findleaks names. maxLeaked is the share of objects
// (per mille) allowed unreached: a frozen dump's are the kernel's own
// (objects held only from memory outside the roots: boot-time tables);
// a live kernel's also those allocated while it was read.
func checkFindLeaks(t *testing.T, run func(t *testing.T, args ...string) []byte, task uint64, cpus, maxLeaked int, frozen bool) {
	var r leaksJSON
	if err := json.Unmarshal(run(t, "findleaks", "--json", "--verbose"), &r); err != nil {
		t.Fatal(err)
	}
	t.Logf("findleaks: %d objects, %d reached, %d unreached in %d leaks; roots %v", r.Objects, r.Reached, r.Leaked, r.Leaks, r.RootRanges)
	if r.Objects < 1000 || r.Reached+r.Leaked != r.Objects || r.Leaked*1000 > r.Objects*maxLeaked {
		t.Errorf("findleaks: %d objects, %d reached, %d leaked; want at most %d‰ unreached", r.Objects, r.Reached, r.Leaked, maxLeaked)
	}
	if r.RootRanges["per-CPU area"] != cpus || r.RootRanges["kernel data"] < 2 || r.RootRanges["task stack"] < 20 || r.RootRanges["vmalloc area"] < 10 {
		t.Errorf("findleaks roots %v; want %d per-CPU areas, the kernel's data, the tasks' stacks and the vmalloc areas", r.RootRanges, cpus)
	}
	checked := 0
	for _, g := range r.Groups {
		if anchored[g.Cache] {
			t.Errorf("findleaks: %d leaks in %s, whose objects the kernel keeps reachable", g.Count, g.Cache)
		}
		for _, l := range g.Leaks {
			if l.Addr == task {
				t.Errorf("findleaks: the test's own task_struct %#x is a leak", task)
			}
			if frozen && checked < 5 {
				checked++
				var w whatJSON
				if err := json.Unmarshal(run(t, "whattype", fmt.Sprintf("%#x", l.Addr), "--json", "--graph=false"), &w); err != nil {
					t.Fatal(err)
				}
				switch {
				case l.Cache == "vmalloc": // an area (kinst_leak's, once a test loaded it)
					if w.Kind != "vmalloc" {
						t.Errorf("leaked area %#x: whattype says %+v", l.Addr, w)
					}
				case w.Kind != "slab object" || w.State == nil || *w.State != "allocated" || w.Cache == nil || !strings.Contains(*w.Cache, l.Cache):
					t.Errorf("leak %#x of %s: whattype says %+v", l.Addr, l.Cache, w)
				}
			}
		}
	}
}

// checkLiveVM compares `vm PID` with the guest's /proc/PID/maps: the same
// mappings in the same order, each with its range, permissions, and for
// a file its offset and path; and a kernel thread (kthreadd, pid 2) has
// no mm.
func checkLiveVM(t *testing.T, ctx context.Context, gk func(*testing.T, ...string) []byte, pid int) {
	maps := strings.TrimSpace(gsh(t, ctx, fmt.Sprintf("cat /proc/%d/maps", pid)))
	var rep struct {
		PID  int    `json:"pid"`
		MM   string `json:"mm"`
		VMAs []struct {
			Start  uint64 `json:"start"`
			End    uint64 `json:"end"`
			Perms  string `json:"perms"`
			Offset uint64 `json:"offset"`
			File   string `json:"file"`
		} `json:"vmas"`
		Dropped int `json:"dropped"`
	}
	if err := json.Unmarshal(gk(t, "vm", strconv.Itoa(pid), "--json"), &rep); err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, line := range strings.Split(maps, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			t.Fatalf("/proc/%d/maps: %q", pid, line)
		}
		path := ""
		if len(f) >= 6 && strings.HasPrefix(f[5], "/") {
			path = f[5]
		}
		off := f[2]
		if path == "" {
			off = "0" // an anonymous or special mapping
		}
		o, _ := strconv.ParseUint(off, 16, 64)
		lo, hi, _ := strings.Cut(f[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		want = append(want, fmt.Sprintf("%x-%x %s %x %s", a, b, f[1], o, path))
	}
	for _, v := range rep.VMAs {
		off := v.Offset
		if v.File == "" {
			off = 0
		}
		got = append(got, fmt.Sprintf("%x-%x %s %x %s", v.Start, v.End, v.Perms, off, v.File))
	}
	if rep.PID != pid || rep.Dropped != 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("vm %d (%d dropped):\n%s\n/proc/%d/maps:\n%s", pid, rep.Dropped, strings.Join(got, "\n"), pid, strings.Join(want, "\n"))
	}
	t.Logf("vm %d: %d VMAs, as /proc/%d/maps", pid, len(rep.VMAs), pid)
	if err := json.Unmarshal(gk(t, "vm", "2", "--json"), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.MM != "0x0" || len(rep.VMAs) != 0 {
		t.Errorf("vm 2 (kthreadd): mm %s, %d VMAs; want none", rep.MM, len(rep.VMAs))
	}
}

// listJSON is `kinst core list … -s … --json`.
type listJSON []struct {
	Address string `json:"address"`
	Members []struct {
		Name  string `json:"name"`
		Value any    `json:"value"`
	} `json:"members"`
}

// checkLiveXArray walks init_pid_ns's IDR (an xarray of struct pid): one
// struct pid per pid in use, so the test's own pid among them, and about
// as many as the guest has threads (pids also name process groups and
// sessions, whose leaders are threads too).
func checkLiveXArray(t *testing.T, ctx context.Context, gk func(*testing.T, ...string) []byte, pid int) {
	var entries listJSON
	out := gk(t, "list", "pid", "-H", "((struct pid_namespace *)&init_pid_ns)->idr", "-s", "level", "--json")
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatal(err)
	}
	threads, _ := strconv.Atoi(strings.TrimSpace(gsh(t, ctx, "ls -d /proc/[0-9]*/task/[0-9]* | wc -l")))
	t.Logf("init_pid_ns.idr: %d struct pid; %d threads in /proc", len(entries), threads)
	if len(entries) < threads-10 || len(entries) > threads+10 {
		t.Errorf("init_pid_ns.idr: %d struct pid, /proc has %d threads", len(entries), threads)
	}
	for _, e := range entries {
		if len(e.Members) != 1 || e.Members[0].Name != "level" || fmt.Sprint(e.Members[0].Value) != "0" {
			t.Errorf("struct pid %s: %+v; want level 0 (the initial namespace)", e.Address, e.Members)
			break
		}
	}
	// The pid's own entry, by its address from the task.
	var ptr struct {
		Pointer string `json:"pointer"`
	}
	if err := json.Unmarshal(gk(t, "p", fmt.Sprintf("((struct task_struct *)%#x)->thread_pid", taskFromPS(t, gk(t, "ps", "--json"), pid)), "--json"), &ptr); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		found = found || e.Address == ptr.Pointer
	}
	if !found {
		t.Errorf("pid %d's struct pid %s is not in init_pid_ns.idr", pid, ptr.Pointer)
	}
}
