package livecore

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// typegraphJSON is `kinst core DUMP typegraph --json`.
type typegraphJSON struct {
	Objects    int `json:"objects"`
	Typed      int `json:"typed"`
	ByCache    int `json:"by_cache"`
	Propagated int `json:"propagated"`
	Conflicts  int `json:"conflicts"`
	Untyped    int `json:"untyped"`
	Passes     []struct {
		Pass        string `json:"pass"`
		Known       int    `json:"known"`
		Conjectured int    `json:"conjectured"`
		Conflicts   int    `json:"conflicts"`
		Unmarked    int    `json:"unmarked"`
		NS          int64  `json:"ns"`
	} `json:"passes"`
	GreatestReach *struct {
		Object string `json:"object"`
		Reach  int    `json:"reach"`
	} `json:"greatest_reach"`
	Caches []struct {
		Name    string         `json:"name"`
		Objects int            `json:"objects"`
		Typed   int            `json:"typed"`
		Types   map[string]int `json:"types"`
	} `json:"caches"`
	HeldOut []struct {
		Cache   string         `json:"cache"`
		Objects int            `json:"objects"`
		Typed   int            `json:"typed"`
		Correct int            `json:"correct"`
		Type    string         `json:"type"`
		Wrong   map[string]int `json:"wrong"`
	} `json:"held_out"`
}

// heldOut are caches of the guest whose struct is known (the kernel
// creates each with sizeof the struct), with the least share of their
// objects the inference must type right (recall), measured on the
// filled guest (livetest.VM.FillHeap) with margin. The precision floor is the same
// for all.
var heldOut = []struct {
	cache, typ string
	recall     float64
}{
	{"dentry", "dentry", 0.95},                 // 1.000: d_subdirs/d_child lists, d_parent, inode.i_dentry
	{"inode_cache", "inode", 0.95},             // 1.000: dentry.d_inode
	{"task_struct", "task_struct", 0.95},       // 0.996: children/sibling, signal, pid links
	{"mm_struct", "mm_struct", 0.90},           // 0.995: task_struct.mm
	{"vm_area_struct", "vm_area_struct", 0.95}, // 1.000: mm_struct.mm_mt's maple tree
	{"sighand_cache", "sighand_struct", 0.95},  // 1.000: task_struct.sighand
	{"files_cache", "files_struct", 0.95},      // 1.000: task_struct.files
	{"radix_tree_node", "xa_node", 0.80},       // 0.917: xarray heads (address_space.i_pages, idr) and xa_node slots
}

const precisionFloor = 0.95 // measured 1.000 on every cache above

// TestTypegraph runs the type graph on a dump of the guest with caches
// of known type held out, and checks the inference against the caches'
// own types: each held-out cache's objects are the slab walk's
// allocated objects, the truth is the struct the kernel created the
// cache for, and precision (right of typed) and recall (right of all)
// must reach the floors measured on this guest. The full graph's
// accounts must add up pass by pass, and whattype --graph must type the
// workload's credentials (a merged cache: cred_jar holds other caches'
// objects too) as struct cred from the task that points to them.
func TestTypegraph(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pid, err := strconv.Atoi(strings.TrimSpace(gsh(t, ctx, `mkdir -p /tmp/kinst-tg && cd /tmp/kinst-tg &&
for i in $(seq 300); do echo $i > f$i; done && ls -lR /usr/lib >/dev/null 2>&1;
setsid sh -c 'echo $$ > /tmp/kinst-tg.pid; exec 3<f1; exec sleep 3000' </dev/null >/dev/null 2>&1 &
sleep 0.5; cat /tmp/kinst-tg.pid`)))
	if err != nil {
		t.Fatal(err)
	}
	defer gsh(t, ctx, fmt.Sprintf("kill %d", pid))
	guest.FillHeap(t, ctx)
	inodes := strings.Fields(gsh(t, ctx, "cat /proc/sys/fs/inode-nr"))
	path := dumpGuest(t, "typegraph.elf", "elf")
	inodesAfter := strings.Fields(gsh(t, ctx, "cat /proc/sys/fs/inode-nr"))
	guest.EmptyHeap(t, ctx)
	keepDump(t, path)

	var sl slabsJSON
	if err := json.Unmarshal(kinst(t, "core", path, "slabs", "--json"), &sl); err != nil {
		t.Fatal(err)
	}
	alloc := map[string]int{}
	merged := map[string]bool{}
	for _, c := range sl.Caches {
		alloc[c.Name] = c.Allocated
		merged[c.Name] = len(c.Aliases) > 0
	}
	var names []string
	for _, h := range heldOut {
		if merged[h.cache] {
			t.Errorf("%s is merged in this kernel: its objects are not all %s", h.cache, h.typ)
			continue
		}
		names = append(names, h.cache)
	}

	start := time.Now()
	var tg typegraphJSON
	if err := json.Unmarshal(kinst(t, "core", path, "typegraph", "--json", "--hold-out", strings.Join(names, ",")), &tg); err != nil {
		t.Fatal(err)
	}
	t.Logf("typegraph --hold-out %s: %.2fs", strings.Join(names, ","), time.Since(start).Seconds())
	got := map[string]int{}
	for i, ho := range tg.HeldOut {
		got[ho.Cache] = i
	}
	for _, h := range heldOut {
		i, ok := got[h.cache]
		if !ok {
			t.Errorf("%s: not in held_out", h.cache)
			continue
		}
		ho := tg.HeldOut[i]
		prec, rec := float64(ho.Correct)/float64(max(ho.Typed, 1)), float64(ho.Correct)/float64(max(ho.Objects, 1))
		t.Logf("held out %-16s %-16s %6d objects %6d typed %6d right: precision %.3f recall %.3f wrong %v", h.cache, ho.Type, ho.Objects, ho.Typed, ho.Correct, prec, rec, ho.Wrong)
		switch {
		case ho.Type != h.typ:
			t.Errorf("%s: truth %q, want struct %s", h.cache, ho.Type, h.typ)
		case ho.Objects != alloc[h.cache]:
			t.Errorf("%s: %d objects, the slab walk has %d allocated", h.cache, ho.Objects, alloc[h.cache])
		case ho.Correct > ho.Typed || ho.Typed > ho.Objects:
			t.Errorf("%s: %d right of %d typed of %d", h.cache, ho.Correct, ho.Typed, ho.Objects)
		case ho.Objects == 0:
			t.Errorf("%s: no objects", h.cache)
		case prec < precisionFloor:
			t.Errorf("%s: precision %.3f < %.2f", h.cache, prec, precisionFloor)
		case rec < h.recall:
			t.Errorf("%s: recall %.3f < %.2f", h.cache, rec, h.recall)
		}
	}

	// The whole graph.
	var full typegraphJSON
	if err := json.Unmarshal(kinst(t, "core", path, "typegraph", "--json"), &full); err != nil {
		t.Fatal(err)
	}
	checkTypegraphAccount(t, &full, alloc)
	checkTypegraphMechanisms(t, &full, alloc, inodes, inodesAfter)

	// whattype --graph: the workload's cred, through task_struct.cred.
	task := taskAddress(t, path, pid)
	var m struct{ Bytes string }
	if err := json.Unmarshal(kinst(t, "core", path, "rd", fmt.Sprintf("%#x", task+layoutOf(t)("task_struct", "cred")), "8", "--json"), &m); err != nil {
		t.Fatal(err)
	}
	b, _ := hex.DecodeString(m.Bytes)
	cred := binary.LittleEndian.Uint64(b)
	var w whatJSON
	if err := json.Unmarshal(kinst(t, "core", path, "whattype", fmt.Sprintf("%#x", cred+4), "--graph", "--json"), &w); err != nil {
		t.Fatal(err)
	}
	if w.Type == nil || *w.Type != "cred" || w.Source == nil || *w.Source == "cache" || w.Member == nil || !strings.HasPrefix(*w.Member, "cred.") {
		t.Errorf("whattype --graph of task %#x's cred %#x+4: %+v", task, cred, w)
	} else {
		t.Logf("whattype --graph %#x: %s %s (%s)", cred+4, *w.Type, *w.Member, *w.Source)
	}
}

// checkTypegraphMechanisms checks what the rules beyond the seed's
// type: each LSM inode blob (lsm_inode_cache, reached only through
// inode.i_security, a void *) is one inode's, so their number is the
// guest's count of inodes (/proc/sys/fs/inode-nr, read before and after
// the dump); arrays of pointers (a member S ** at them) and the
// anon_vma_chains of the VMAs' lists (heads whose entries the kernel
// fixes) are typed; and the share typed stays at what the guest gives.
func checkTypegraphMechanisms(t *testing.T, tg *typegraphJSON, alloc map[string]int, before, after []string) {
	var nr []int
	for _, f := range [][]string{before, after} {
		if len(f) < 1 {
			t.Fatalf("inode-nr: %q", f)
		}
		v, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatal(err)
		}
		nr = append(nr, v)
	}
	lo, hi := min(nr[0], nr[1]), max(nr[0], nr[1])
	blobs, ptrArrays, avc := 0, 0, 0
	for _, c := range tg.Caches {
		for ty, n := range c.Types {
			switch {
			case ty == "lsm_inode_blob":
				blobs += n
			case strings.Contains(ty, " *["):
				ptrArrays += n
			case ty == "anon_vma_chain":
				avc += n
			}
		}
	}
	t.Logf("lsm_inode_blob %d (inode-nr %d..%d), pointer arrays %d, anon_vma_chain %d", blobs, lo, hi, ptrArrays, avc)
	if float64(blobs) < 0.99*float64(lo) || float64(blobs) > 1.01*float64(hi) {
		t.Errorf("%d LSM inode blobs typed; the guest has %d..%d inodes", blobs, lo, hi)
	}
	if ptrArrays == 0 || avc == 0 {
		t.Errorf("pointer arrays %d, anon_vma_chains %d: want some of each", ptrArrays, avc)
	}
	// The trace events' fields, typed by their cache on 6.1 and, where
	// the cache is merged with others (6.12), through the event classes
	// read as roots.
	for _, c := range tg.Caches {
		if c.Name == "ftrace_event_field" && c.Types["ftrace_event_field"] < c.Objects*95/100 {
			t.Errorf("%d of %d objects of %s typed as ftrace_event_field, want nearly all", c.Types["ftrace_event_field"], c.Objects, c.Name)
		}
	}
	// 97.8 % on the filled guest, 65.8 % before the LSM blobs.
	if share := float64(tg.Typed) / float64(tg.Objects); share < 0.95 {
		t.Errorf("%.1f %% of objects typed, want at least 95 %%", 100*share)
	}
}

// keepDump copies a dump to KINST_KEEP_DUMP when that is set (a path
// outside the scratch directory, which the run deletes), to run the
// type graph on it again without the guest.
func keepDump(t testing.TB, path string) {
	dst := os.Getenv("KINST_KEEP_DUMP")
	if dst == "" {
		return
	}
	if out, err := exec.Command("cp", "--sparse=always", path, dst).CombinedOutput(); err != nil {
		t.Errorf("keep dump %s: %v\n%s", dst, err, out)
	}
}

// checkTypegraphAccount: every allocated object is counted once, the
// passes only ever mark more objects, and each pass's counts add up.
func checkTypegraphAccount(t *testing.T, tg *typegraphJSON, alloc map[string]int) {
	var total int
	for _, n := range alloc {
		total += n
	}
	if tg.Objects != total || tg.Typed+tg.Untyped != tg.Objects || tg.ByCache+tg.Propagated != tg.Typed {
		t.Errorf("objects %d (slab walk: %d allocated), typed %d = %d by cache + %d propagated, untyped %d",
			tg.Objects, total, tg.Typed, tg.ByCache, tg.Propagated, tg.Untyped)
	}
	want := []string{"cache", "conservative", "arrays", "coalescence", "inference"}
	if len(tg.Passes) != len(want) {
		t.Fatalf("passes %+v", tg.Passes)
	}
	prev := tg.Objects + 1
	for i, p := range tg.Passes {
		if p.Pass != want[i] || p.Known+p.Conjectured+p.Unmarked != tg.Objects || p.Unmarked > prev {
			t.Errorf("pass %d: %+v (objects %d, unmarked before %d)", i, p, tg.Objects, prev)
		}
		prev = p.Unmarked
		t.Logf("pass %-12s known %6d conjectured %6d conflicts %4d unmarked %6d  %.1f ms", p.Pass, p.Known, p.Conjectured, p.Conflicts, p.Unmarked, float64(p.NS)/1e6)
	}
	last := tg.Passes[len(tg.Passes)-1]
	if last.Known+last.Conjectured != tg.Typed || last.Conflicts != tg.Conflicts {
		t.Errorf("last pass %+v; typed %d, conflicts %d", last, tg.Typed, tg.Conflicts)
	}
	for _, c := range tg.Caches {
		n := 0
		for _, v := range c.Types {
			n += v
		}
		if c.Objects != alloc[c.Name] || n != c.Typed || c.Typed > c.Objects {
			t.Errorf("cache %s: %d objects (walk: %d), %d typed, types %v", c.Name, c.Objects, alloc[c.Name], c.Typed, c.Types)
		}
	}
	if tg.GreatestReach == nil || tg.GreatestReach.Reach <= 0 {
		t.Errorf("greatest reach: %+v", tg.GreatestReach)
	}
	t.Logf("typegraph: %d objects, %d typed (%.1f%%: %d by cache, %d by the graph), %d conflicts", tg.Objects, tg.Typed,
		100*float64(tg.Typed)/float64(tg.Objects), tg.ByCache, tg.Propagated, tg.Conflicts)
}

// BenchmarkCoreTypegraph times `kinst core DUMP typegraph` end to end
// (open, slab walk, every pass) on TestTypegraph's dump of the 1 GiB
// guest, its heap filled (livetest.VM.FillHeap), with the process's CPU time
// (cpu-ms/op), its peak resident memory (maxrss-MiB), the objects and
// the share typed. (Benchmarks run after the test that panics the
// guest: without TestTypegraph's dump, the panicked guest is dumped as
// it is.)
func BenchmarkCoreTypegraph(b *testing.B) {
	path := filepath.Join(tmp, "typegraph.elf")
	if _, err := os.Stat(path); err != nil {
		dumpGuest(b, "typegraph.elf", "elf")
	}
	var cpu time.Duration
	var rss int64
	var out []byte
	for b.Loop() {
		cmd := exec.Command(filepath.Join(bin, "kinst"), "core", path, "typegraph", "--json")
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		hwm := peakRSS(cmd.Process.Pid)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("typegraph: %v", err)
		}
		rss = max(rss, <-hwm)
		out = stdout.Bytes()
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	var tg typegraphJSON
	if err := json.Unmarshal(out, &tg); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(rss)/1024, "maxrss-MiB")
	if rss > 1<<20 {
		b.Errorf("peak resident memory %d MiB: over the 1 GiB goal", rss>>10)
	}
	b.ReportMetric(float64(tg.Objects), "objects")
	b.ReportMetric(100*float64(tg.Typed)/float64(max(tg.Objects, 1)), "typed-%")
	for _, p := range tg.Passes {
		b.Logf("pass %-12s known %7d conjectured %7d conflicts %4d unmarked %7d  %.1f ms", p.Pass, p.Known, p.Conjectured, p.Conflicts, p.Unmarked, float64(p.NS)/1e6)
	}
}

// TestFindLocks holds a known lock in the guest and finds it in a dump:
// testdata/lockhold.c writes to a file from a buffer userfaultfd never
// fills, so its write(2) blocks in the page fault holding the file's
// inode->i_rwsem; a second lockhold on the same file waits for that
// rwsem. The guest's own /proc/PID/stack says who blocks where; the dump
// must show the rwsem held by the first, with the second waiting.
func TestFindLocks(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build testdata/lockhold.c")
	}
	exe := filepath.Join(t.TempDir(), "lockhold")
	if out, err := exec.Command(cc, "-static", "-nostdlib", "-Os", "-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-s",
		"-o", exe, filepath.Join("testdata", "lockhold.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc lockhold.c: %v\n%s", err, out)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pids := strings.Fields(gsh(t, ctx, fmt.Sprintf(`echo %s | base64 -d > /tmp/kinst-lockhold && chmod +x /tmp/kinst-lockhold && mkdir -p /tmp/kinst-lock &&
setsid /tmp/kinst-lockhold /tmp/kinst-lock/f </dev/null >/dev/null 2>&1 & p1=$!; sleep 1;
setsid /tmp/kinst-lockhold /tmp/kinst-lock/f </dev/null >/dev/null 2>&1 & p2=$!; sleep 1; echo $p1 $p2`, base64.StdEncoding.EncodeToString(b))))
	if len(pids) != 2 {
		t.Fatalf("lockhold pids: %q", pids)
	}
	defer gsh(t, ctx, fmt.Sprintf("kill %s %s; true", pids[0], pids[1]))
	s1 := gsh(t, ctx, "cat /proc/"+pids[0]+"/stack")
	s2 := gsh(t, ctx, "cat /proc/"+pids[1]+"/stack")
	// The waiter sleeps in inode_lock's down_write, inlined into
	// generic_file_write_iter; the holder in the fault under it.
	if !strings.Contains(s1, "handle_userfault") || !strings.Contains(s1, "generic_perform_write") ||
		strings.Contains(s2, "handle_userfault") || !strings.Contains(s2, "write_iter") {
		t.Fatalf("the guest's stacks: holder %s:\n%s\nwaiter %s:\n%s", pids[0], s1, pids[1], s2)
	}
	path := dumpGuest(t, "findlocks.elf", "elf")
	var fl struct {
		Locks []struct {
			Address string `json:"address"`
			Kind    string `json:"kind"`
			HeldBy  *struct {
				PID  int    `json:"pid"`
				Comm string `json:"comm"`
			} `json:"held_by"`
			Waiters []struct {
				PID int `json:"pid"`
			} `json:"waiters"`
			In string `json:"in"`
		} `json:"locks"`
		Implausible int `json:"implausible"`
	}
	start := time.Now()
	if err := json.Unmarshal(kinst(t, "core", path, "findlocks", "--json"), &fl); err != nil {
		t.Fatal(err)
	}
	t.Logf("findlocks: %d held locks, %d implausible, %.2fs", len(fl.Locks), fl.Implausible, time.Since(start).Seconds())
	p1, _ := strconv.Atoi(pids[0])
	p2, _ := strconv.Atoi(pids[1])
	found := false
	for _, l := range fl.Locks {
		t.Logf("%s %s %s held by %+v waiters %+v", l.Address, l.Kind, l.In, l.HeldBy, l.Waiters)
		if l.Kind != "rwsem" || l.HeldBy == nil || l.HeldBy.PID != p1 {
			continue
		}
		found = true
		if l.HeldBy.Comm != "kinst-lockhold" || !strings.HasSuffix(l.In, ".i_rwsem") || len(l.Waiters) != 1 || l.Waiters[0].PID != p2 {
			t.Errorf("the held i_rwsem: %+v (held by %+v, waiters %+v); want held by %d kinst-lockhold, %d waiting, in inode.i_rwsem", l, l.HeldBy, l.Waiters, p1, p2)
		}
	}
	if !found {
		t.Errorf("no rwsem held by pid %d among %d held locks", p1, len(fl.Locks))
	}
}

// peakRSS follows a process's VmHWM (KiB) until it exits and sends the
// last reading. (wait4's ru_maxrss will not do: a child exec'd from the
// vfork Go uses inherits the parent's high-water mark.)
func peakRSS(pid int) <-chan int64 {
	ch := make(chan int64, 1)
	go func() {
		var hwm int64
		for {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil || !bytes.Contains(b, []byte("VmHWM:")) { // gone, or a zombie
				break
			}
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
					if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
						hwm = max(hwm, v)
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		ch <- hwm
	}()
	return ch
}
