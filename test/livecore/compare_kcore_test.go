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

// TestKcoreLive runs `kinst core /proc/kcore …` inside the guest, on the
// running kernel's memory, and compares it with the guest's own view
// taken around it: ps with /proc, slabs with /proc/slabinfo, whattype
// with objects a known process leads to, findlocks with a lock a
// process holds. The memory changes while kinst reads it, so each
// comparison states what may move and by how much.
func TestKcoreLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// gk runs the guest's kinst on /proc/kcore and gives its stdout; the
	// wall time goes to the log (figures only: the guest runs under TCG
	// or KVM, as app/vm chose).
	gk := func(t *testing.T, args ...string) []byte {
		t.Helper()
		var out, errb bytes.Buffer
		start := time.Now()
		code, err := guest.Instance.Exec(ctx, append([]string{"kinst", "core", "/proc/kcore"}, args...), &out, &errb)
		if err != nil || code != 0 {
			t.Fatalf("guest kinst core /proc/kcore %s: status %d, %v\n%s", strings.Join(args, " "), code, err, errb.String())
		}
		t.Logf("kinst core /proc/kcore %s: %.2fs (in the guest, through its agent)", strings.Join(args, " "), time.Since(start).Seconds())
		return out.Bytes()
	}
	pid, err := strconv.Atoi(strings.TrimSpace(gsh(t, ctx, `mkdir -p /tmp/kinst-kcore-dir && cd /tmp/kinst-kcore-dir &&
setsid sh -c 'echo $$ > /tmp/kinst-kcore.pid; exec 3>held; rm -f fifo; mkfifo fifo; exec 4<>fifo; exec sleep 3000' </dev/null >/dev/null 2>&1 &
sleep 0.5; cat /tmp/kinst-kcore.pid`)))
	if err != nil {
		t.Fatal(err)
	}
	defer gsh(t, ctx, fmt.Sprintf("kill %d; true", pid))

	t.Run("info", func(t *testing.T) {
		var inf struct {
			Format  string `json:"format"`
			Release string `json:"release"`
			CPUs    []struct {
				PID int `json:"pid"`
			} `json:"cpus"`
			Errors []string `json:"errors"`
		}
		if err := json.Unmarshal(gk(t, "info", "--json"), &inf); err != nil {
			t.Fatal(err)
		}
		uname := strings.TrimSpace(gsh(t, ctx, "uname -r"))
		ncpu, _ := strconv.Atoi(strings.TrimSpace(gsh(t, ctx, "nproc --all")))
		if inf.Format != "kcore" || inf.Release != uname || len(inf.CPUs) != ncpu || len(inf.Errors) > 0 {
			t.Errorf("info: %+v; the guest: %s, %d CPUs", inf, uname, ncpu)
		}
	})

	t.Run("ps", func(t *testing.T) { checkLivePS(t, ctx, pid) })
	t.Run("slabs", func(t *testing.T) { checkLiveSlabs(t, ctx) })
	t.Run("whattype", func(t *testing.T) { checkLiveWhatType(t, gk, pid) })
	t.Run("bt", func(t *testing.T) {
		var st stackJSON
		if err := json.Unmarshal(gk(t, "bt", strconv.Itoa(pid), "--json"), &st); err != nil {
			t.Fatal(err)
		}
		want := gsh(t, ctx, fmt.Sprintf("cat /proc/%d/stack", pid))
		if len(st.Frames) == 0 || !strings.Contains(want, st.Frames[len(st.Frames)/2].Function+"+") {
			t.Errorf("bt %d: %+v; the guest's /proc/%d/stack:\n%s", pid, st, pid, want)
		}
	})
	t.Run("typegraph", func(t *testing.T) {
		var tg struct {
			Objects int `json:"objects"`
			Typed   int `json:"typed"`
			ByCache int `json:"by_cache"`
		}
		if err := json.Unmarshal(gk(t, "typegraph", "--json"), &tg); err != nil {
			t.Fatal(err)
		}
		if tg.Objects == 0 || tg.Typed <= tg.ByCache || tg.Typed > tg.Objects {
			t.Errorf("typegraph on live memory: %+v", tg)
		}
		t.Logf("typegraph: %d objects, %d typed, %d by their cache", tg.Objects, tg.Typed, tg.ByCache)
	})
	t.Run("findlocks", func(t *testing.T) { checkLiveFindLocks(t, ctx, gk) })
	t.Run("findleaks", func(t *testing.T) {
		checkFindLeaks(t, gk, taskFromPS(t, gk(t, "ps", "--json"), pid), 2, 10, false)
	})
	t.Run("typed", func(t *testing.T) { checkLiveTyped(t, ctx, gk, pid) })
	t.Run("files", func(t *testing.T) { checkLiveFiles(t, ctx, gk, pid) })
	t.Run("vm", func(t *testing.T) { checkLiveVM(t, ctx, gk, pid) })
	t.Run("xarray", func(t *testing.T) { checkLiveXArray(t, ctx, gk, pid) })
	t.Run("mount", func(t *testing.T) { checkLiveMount(t, ctx, gk) })
	t.Run("log", func(t *testing.T) {
		var lg struct {
			Records []struct {
				Text string `json:"text"`
			} `json:"records"`
		}
		gsh(t, ctx, "echo kinst-kcore-marker > /dev/kmsg")
		if err := json.Unmarshal(gk(t, "log", "--json"), &lg); err != nil {
			t.Fatal(err)
		}
		dmesg := strings.Split(strings.TrimSpace(gsh(t, ctx, "dmesg")), "\n")
		found := false
		for _, r := range lg.Records {
			found = found || r.Text == "kinst-kcore-marker"
		}
		if !found || len(lg.Records) < len(dmesg)-5 {
			t.Errorf("log: %d records (marker found: %v); dmesg has %d lines", len(lg.Records), found, len(dmesg))
		}
	})
	t.Run("sym", func(t *testing.T) {
		var sy struct {
			Address string `json:"address"`
		}
		if err := json.Unmarshal(gk(t, "sym", "jiffies_64", "--json"), &sy); err != nil {
			t.Fatal(err)
		}
		want := strings.Fields(gsh(t, ctx, "grep ' jiffies_64$' /proc/kallsyms"))
		if len(want) < 3 || sy.Address != "0x"+strings.TrimLeft(want[0], "0") {
			t.Errorf("sym jiffies_64: %s; /proc/kallsyms: %q", sy.Address, want)
		}
	})
	t.Run("findfalse", func(t *testing.T) {
		var ff struct {
			Arrays []struct {
				ElementSize int    `json:"element_size"`
				TotalSize   int    `json:"total_size"`
				Primitive   string `json:"primitive"`
			} `json:"arrays"`
		}
		if err := json.Unmarshal(gk(t, "findfalse", "--json"), &ff); err != nil {
			t.Fatal(err)
		}
		// The seed's criteria, each entry: elements smaller than a
		// cache line, the array larger than one, a primitive inside.
		for _, a := range ff.Arrays {
			if a.ElementSize >= 64 || a.TotalSize <= 64 || a.Primitive == "" {
				t.Errorf("findfalse entry %+v breaks the criteria", a)
			}
		}
		// The arrays are static structures: a dump of the guest taken
		// right after lists as many (Debian's 6.1 has none at all).
		var fd struct {
			Arrays []json.RawMessage `json:"arrays"`
		}
		if err := json.Unmarshal(kinst(t, "core", dumpGuest(t, "findfalse.elf", "elf"), "findfalse", "--json"), &fd); err != nil {
			t.Fatal(err)
		}
		if len(fd.Arrays) != len(ff.Arrays) {
			t.Errorf("findfalse: %d arrays live, %d in a dump taken after", len(ff.Arrays), len(fd.Arrays))
		}
		t.Logf("findfalse: %d arrays live, as in a dump", len(ff.Arrays))
	})
}

// checkLivePS: the tasks /proc lists before and after kinst reads the
// task lists, and whose comm is the same both times, are every one in
// ps with that comm (threads included); ps lists no task /proc listed
// neither time but kinst's own threads and the idle tasks.
func checkLivePS(t *testing.T, ctx context.Context, pid int) {
	out := gsh(t, ctx, `list() { for d in /proc/[0-9]*/task/[0-9]*; do c=$(cat $d/comm 2>/dev/null) && echo "${d##*/} $c"; done; }
list > /tmp/kinst-ps1; kinst core /proc/kcore ps --json > /tmp/kinst-ps.json; list > /tmp/kinst-ps2
cat /tmp/kinst-ps1; echo ===; cat /tmp/kinst-ps2; echo ===; cat /tmp/kinst-ps.json`)
	parts := strings.SplitN(out, "===\n", 3)
	if len(parts) != 3 {
		t.Fatalf("guest output: %s", out)
	}
	read := func(s string) map[int]string {
		m := map[int]string{}
		for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
			id, comm, _ := strings.Cut(l, " ")
			n, err := strconv.Atoi(id)
			if err == nil {
				m[n] = comm
			}
		}
		return m
	}
	before, after := read(parts[0]), read(parts[1])
	var ps struct {
		Tasks []struct {
			PID   int    `json:"pid"`
			TGID  int    `json:"tgid"`
			Comm  string `json:"comm"`
			State string `json:"state"`
		} `json:"tasks"`
		Anomalies []string `json:"anomalies"`
	}
	if err := json.Unmarshal([]byte(parts[2]), &ps); err != nil {
		t.Fatal(err)
	}
	got := map[int]string{}
	for _, tk := range ps.Tasks {
		got[tk.PID] = tk.Comm
		if tk.PID == pid && (tk.Comm != "sleep" || tk.State != "S") {
			t.Errorf("the sleeper %d: %+v", pid, tk)
		}
	}
	stable, extra := 0, 0
	for id, c := range before {
		if after[id] != c {
			continue // started, exited or renamed meanwhile
		}
		stable++
		// /proc/PID/comm adds a kworker's workqueue ("-events"); the
		// task's comm is at most TASK_COMM_LEN-1 bytes.
		g, ok := got[id]
		if ok && strings.HasPrefix(c, g) && (len(g) == len(c) || len(g) == 15 || c[len(g)] == '-') {
			continue
		}
		t.Errorf("task %d (%s), in /proc before and after: ps has %q, %v", id, c, g, ok)
	}
	for _, tk := range ps.Tasks {
		if _, ok := before[tk.PID]; ok {
			continue
		}
		if _, ok := after[tk.PID]; ok {
			continue
		}
		if tk.PID != 0 && tk.Comm != "kinst" && !strings.HasPrefix(tk.Comm, "kworker") {
			t.Errorf("ps lists %+v, which /proc listed neither before nor after", tk)
		}
		extra++
	}
	if stable < 50 {
		t.Errorf("only %d tasks stable in /proc", stable)
	}
	t.Logf("ps: %d tasks, %d stable in /proc all found; %d only in ps (idle tasks, kinst's threads, short-lived workers); anomalies %q", len(ps.Tasks), stable, extra, ps.Anomalies)
}

// checkLiveSlabs: /proc/slabinfo read before and after the walk, in
// three rounds. The walk takes seconds and reads each slab at its own
// moment, so a cache busy meanwhile can be off by what moved; a cache
// whose slabinfo line is the same before and after was almost
// untouched, and its active objects (allocated + free_percpu, see
// TestSlabs) and total objects must equal slabinfo's -- give or take
// what one CPU's own lists can hold. Those move without leaving a trace
// in two readings: the reader is a process whose start allocates (a
// task_struct per thread, an mm, files) and may pull a node's partial
// slabs onto a CPU, where slabinfo counts their free objects as active,
// and whose exit frees into full slabs and may push the CPU's partial
// list back to the node. task_struct on 6.1 swings by 12-15 objects
// this way from one run of kinst to the next (3 slabs of 5: its
// cpu_partial is 6 objects, and 6.1 keeps DIV_ROUND_UP(2*6, 5) slabs a
// CPU); a run in CI found it 14 over with slabinfo the same before and
// after. So a quiet cache may be off by at most a cpu slab and a full
// partial list, and only 1 in 20 quiet caches may be off at all. Caches
// that moved must lie within the two readings, give or take the same.
// The walk's anomalies (lists cut under it) are counted, not failures.
func checkLiveSlabs(t *testing.T, ctx context.Context) {
	for round := 1; round <= 3; round++ {
		checkLiveSlabsOnce(t, ctx, round)
	}
}

func checkLiveSlabsOnce(t *testing.T, ctx context.Context, round int) {
	start := time.Now()
	out := gsh(t, ctx, `cat /proc/slabinfo > /tmp/kinst-s1; kinst core /proc/kcore slabs --json > /tmp/kinst-sl.json; cat /proc/slabinfo > /tmp/kinst-s2
cat /tmp/kinst-s1; echo ===; cat /tmp/kinst-s2; echo ===; cat /tmp/kinst-sl.json; echo ===; cd /sys/kernel/slab && grep . */cpu_partial || true`)
	t.Logf("round %d: slabinfo, kinst core /proc/kcore slabs --json, slabinfo: %.2fs (in the guest, through its agent)", round, time.Since(start).Seconds())
	parts := strings.SplitN(out, "===\n", 4)
	if len(parts) != 4 {
		t.Fatalf("guest output: %.2000s", out)
	}
	s1, s2 := parseSlabinfo(t, parts[0]), parseSlabinfo(t, parts[1])
	var sl slabsJSON
	if err := json.Unmarshal([]byte(parts[2]), &sl); err != nil {
		t.Fatal(err)
	}
	cpuPartial := parseCPUPartial(parts[3])
	quiet, off, moved := 0, 0, 0
	within := func(g, x, y, slack int) bool { return g >= min(x, y)-slack && g <= max(x, y)+slack }
	for _, c := range sl.Caches {
		a, ok1 := s1[c.Name]
		b, ok2 := s2[c.Name]
		if !ok1 || !ok2 {
			t.Errorf("cache %s is not in /proc/slabinfo", c.Name)
			continue
		}
		if c.Allocated+c.Free != c.Objects {
			t.Errorf("%s: allocated %d + free %d != objects %d", c.Name, c.Allocated, c.Free, c.Objects)
		}
		slack := cpuHolds(c.PerSlab, cpuPartial[c.Sysfs])
		got := slabinfo{c.Allocated + c.FreePerCPU, c.Objects, c.Slabs}
		if a == b {
			quiet++
			if got != a {
				off++
				if !within(got.active, a.active, a.active, slack) || !within(got.objects, a.objects, a.objects, slack) {
					t.Errorf("round %d: %s (quiet): kinst %+v, slabinfo %+v: more than a CPU's slabs (%d objects) apart", round, c.Name, got, a, slack)
				}
				t.Logf("round %d: %s (quiet): kinst %+v, slabinfo %+v (a CPU holds up to %d)", round, c.Name, got, a, slack)
			}
			continue
		}
		moved++
		if !within(got.active, a.active, b.active, slack) || !within(got.objects, a.objects, b.objects, slack) {
			t.Errorf("round %d: %s: kinst %+v; slabinfo before %+v, after %+v (a CPU's slabs: %d objects)", round, c.Name, got, a, b, slack)
		}
	}
	if quiet < len(sl.Caches)/2 || off > quiet/20 {
		t.Errorf("round %d: %d of %d caches quiet, %d of them off", round, quiet, len(sl.Caches), off)
	}
	for name := range s1 {
		if _, ok := s2[name]; !ok {
			continue
		}
		found := false
		for _, c := range sl.Caches {
			found = found || c.Name == name
		}
		if !found {
			t.Errorf("/proc/slabinfo lists %s; kinst does not", name)
		}
	}
	t.Logf("round %d: slabs: %d caches, %d quiet (%d of them off), %d moved while read; %d anomalies %.300q", round, len(sl.Caches), quiet, off, moved, sl.AnomalyCount, sl.Anomalies)
}

// parseCPUPartial reads `grep . */cpu_partial` in /sys/kernel/slab:
// each cache's cpu_partial, in objects.
func parseCPUPartial(s string) map[string]int {
	m := map[string]int{}
	for _, line := range strings.Split(s, "\n") {
		name, v, ok := strings.Cut(line, "/cpu_partial:")
		if n, err := strconv.Atoi(strings.TrimSpace(v)); ok && err == nil {
			m[name] = n
		}
	}
	return m
}

// cpuHolds is how many objects one CPU's own slabs can hold: its cpu
// slab and a full partial list, which 6.1 sizes as DIV_ROUND_UP(2 *
// cpu_partial, objects per slab) slabs (5.10 flushes the list once its
// free objects pass cpu_partial, fewer). Without CONFIG_SLUB_CPU_PARTIAL
// (no cpu_partial file) it is the cpu slab alone.
func cpuHolds(perSlab, cpuPartial int) int {
	if perSlab <= 0 {
		return 0
	}
	return ((2*cpuPartial+perSlab-1)/perSlab + 1) * perSlab
}

// checkLiveWhatType: the sleeper's task_struct (its address from ps)
// and the file of its fd 3 (found through task->files->fdt->fd[3],
// read with rd, and named "held").
func checkLiveWhatType(t *testing.T, gk func(*testing.T, ...string) []byte, pid int) {
	off := layoutOf(t)
	task := taskFromPS(t, gk(t, "ps", "--json"), pid)
	rd := func(a uint64, n int) []byte {
		var m struct{ Bytes string }
		if err := json.Unmarshal(gk(t, "rd", fmt.Sprintf("%#x", a), strconv.Itoa(n), "--json"), &m); err != nil {
			t.Fatal(err)
		}
		b, _ := hex.DecodeString(m.Bytes)
		if len(b) != n {
			t.Fatalf("rd %#x %d: %d bytes", a, n, len(b))
		}
		return b
	}
	ptr := func(a uint64) uint64 { return binary.LittleEndian.Uint64(rd(a, 8)) }
	what := func(a uint64) whatJSON {
		var w whatJSON
		if err := json.Unmarshal(gk(t, "whattype", fmt.Sprintf("%#x", a), "--json"), &w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	str := func(p *string) string {
		if p == nil {
			return "null"
		}
		return *p
	}
	a := task + off("task_struct", "signal")
	w := what(a)
	if w.Kind != "slab object" || str(w.Cache) != "task_struct" || str(w.Object) != fmt.Sprintf("%#x", task) || str(w.State) != "allocated" ||
		str(w.Type) != "task_struct" || str(w.Member) != "task_struct.signal" {
		t.Errorf("whattype %#x (task %d's signal): %+v (cache %s object %s type %s member %s)", a, pid, w, str(w.Cache), str(w.Object), str(w.Type), str(w.Member))
	}
	files := ptr(task + off("task_struct", "files"))
	fdt := ptr(files + off("files_struct", "fdt"))
	file := ptr(ptr(fdt+off("fdtable", "fd")) + 3*8)
	name := ptr(ptr(file+off("file", "f_path.dentry")) + off("dentry", "d_name.name"))
	if got := string(bytes.TrimRight(rd(name, 5), "\x00")); got != "held" {
		t.Fatalf("fd 3 %#x names %q", file, got)
	}
	fw := what(file + off("file", "f_path.dentry"))
	// filp is merged in a stock kernel: the cache may have another name
	// and then gives no type.
	if fw.Kind != "slab object" || str(fw.Object) != fmt.Sprintf("%#x", file) || str(fw.State) != "allocated" ||
		(fw.Type != nil && (str(fw.Type) != "file" || str(fw.Member) != "file.f_path.dentry")) {
		t.Errorf("whattype %#x (fd 3's file): %+v (cache %s type %s member %s)", file, fw, str(fw.Cache), str(fw.Type), str(fw.Member))
	}
	t.Logf("task %#x: %s %s; file %#x: cache %s, type %s, member %s (%s)", task, str(w.Type), str(w.Member), file, str(fw.Cache), str(fw.Type), str(fw.Member), fw.How)
}

// checkLiveFindLocks: lockhold (TestFindLocks) holds an inode's i_rwsem
// in the guest with a second one waiting; findlocks on the live memory
// finds it with its owner and waiter.
func checkLiveFindLocks(t *testing.T, ctx context.Context, gk func(*testing.T, ...string) []byte) {
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
	pids := strings.Fields(gsh(t, ctx, fmt.Sprintf(`echo %s | base64 -d > /tmp/kinst-lockhold && chmod +x /tmp/kinst-lockhold && mkdir -p /tmp/kinst-lock2 &&
setsid /tmp/kinst-lockhold /tmp/kinst-lock2/f </dev/null >/dev/null 2>&1 & p1=$!; sleep 1;
setsid /tmp/kinst-lockhold /tmp/kinst-lock2/f </dev/null >/dev/null 2>&1 & p2=$!; sleep 1; echo $p1 $p2`, base64.StdEncoding.EncodeToString(b))))
	if len(pids) != 2 {
		t.Fatalf("lockhold pids: %q", pids)
	}
	defer gsh(t, ctx, fmt.Sprintf("kill %s %s; true", pids[0], pids[1]))
	if s1 := gsh(t, ctx, "cat /proc/"+pids[0]+"/stack"); !strings.Contains(s1, "handle_userfault") {
		t.Fatalf("the holder is not blocked in the fault:\n%s", s1)
	}
	var fl struct {
		Locks []struct {
			Kind   string `json:"kind"`
			HeldBy *struct {
				PID  int    `json:"pid"`
				Comm string `json:"comm"`
			} `json:"held_by"`
			Waiters []struct {
				PID int `json:"pid"`
			} `json:"waiters"`
			In string `json:"in"`
		} `json:"locks"`
	}
	if err := json.Unmarshal(gk(t, "findlocks", "--json"), &fl); err != nil {
		t.Fatal(err)
	}
	p1, _ := strconv.Atoi(pids[0])
	p2, _ := strconv.Atoi(pids[1])
	found := false
	for _, l := range fl.Locks {
		if l.Kind != "rwsem" || l.HeldBy == nil || l.HeldBy.PID != p1 {
			continue
		}
		found = true
		if !strings.HasSuffix(l.In, ".i_rwsem") || len(l.Waiters) != 1 || l.Waiters[0].PID != p2 {
			t.Errorf("the held i_rwsem: %+v; want in inode.i_rwsem, %d waiting", l, p2)
		}
	}
	if !found {
		t.Errorf("no rwsem held by pid %d among %d held locks: %+v", p1, len(fl.Locks), fl.Locks)
	}
}

// checkLiveTyped: p, struct and list over the running kernel's memory,
// against /proc: the task list walked from init_task holds every process
// /proc lists before and after (the known sleep among them, with its
// comm), a task's struct read at the address the list gave has its pid,
// and each CPU's runqueue names its CPU. A global BTF does not type is
// refused with the way to name its type; a wrong member is named.
func checkLiveTyped(t *testing.T, ctx context.Context, gk func(*testing.T, ...string) []byte, pid int) {
	var comm struct {
		Value string `json:"value"`
		Type  string `json:"type"`
	}
	if err := json.Unmarshal(gk(t, "p", "((struct task_struct *)&init_task)->comm", "--json"), &comm); err != nil {
		t.Fatal(err)
	}
	if comm.Value != "swapper/0" || comm.Type != "char [16]" {
		t.Errorf("p init_task's comm: %+v; want swapper/0, char [16]", comm)
	}
	procPIDs := func() map[int]bool {
		m := map[int]bool{}
		for _, f := range strings.Fields(gsh(t, ctx, "cd /proc && ls -d [0-9]*")) {
			if n, err := strconv.Atoi(f); err == nil {
				m[n] = true
			}
		}
		return m
	}
	before := procPIDs()
	var entries listJSON
	if err := json.Unmarshal(gk(t, "list", "task_struct.tasks", "-H", "((struct task_struct *)&init_task)->tasks", "-s", "pid,comm", "--json"), &entries); err != nil {
		t.Fatal(err)
	}
	after := procPIDs()
	listed := map[int]string{}
	addrOf := map[int]string{}
	for _, e := range entries {
		if len(e.Members) != 2 || e.Members[0].Name != "pid" || e.Members[1].Name != "comm" {
			t.Fatalf("list -s pid,comm entry: %+v", e)
		}
		p, _ := e.Members[0].Value.(float64)
		c, _ := e.Members[1].Value.(string)
		listed[int(p)], addrOf[int(p)] = c, e.Address
	}
	for p := range before {
		if after[p] && listed[p] == "" {
			t.Errorf("pid %d is in /proc before and after, not on init_task's task list", p)
		}
	}
	if listed[pid] != "sleep" || listed[1] == "" {
		t.Errorf("the list: pid %d is %q (want sleep), pid 1 is %q", pid, listed[pid], listed[1])
	}
	if want := strings.TrimSpace(gsh(t, ctx, "cat /proc/1/comm")); listed[1] != want {
		t.Errorf("pid 1's comm on the list %q, /proc/1/comm %q", listed[1], want)
	}
	t.Logf("list: %d tasks; /proc lists %d before, %d after", len(entries), len(before), len(after))
	var st struct {
		Members []struct {
			Name  string `json:"name"`
			Value any    `json:"value"`
		} `json:"members"`
	}
	if err := json.Unmarshal(gk(t, "struct", "task_struct", addrOf[pid], "-m", "pid,tgid,comm", "--json"), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 3 || st.Members[0].Value != float64(pid) || st.Members[1].Value != float64(pid) || st.Members[2].Value != "sleep" {
		t.Errorf("struct task_struct %s -m pid,tgid,comm: %+v; want %d, %d, sleep", addrOf[pid], st.Members, pid, pid)
	}
	// A pointer into the heap says what it points to: the parent's
	// task_struct, from its cache.
	var parent struct {
		Members []struct {
			Pointer string `json:"pointer"`
			What    string `json:"what"`
		} `json:"members"`
	}
	if err := json.Unmarshal(gk(t, "struct", "task_struct", addrOf[pid], "-m", "real_parent", "--json"), &parent); err != nil {
		t.Fatal(err)
	}
	if len(parent.Members) != 1 || parent.Members[0].What != "task_struct" {
		t.Errorf("struct task_struct %s -m real_parent: %+v; want a pointer to a task_struct", addrOf[pid], parent.Members)
	}
	for cpu := range 2 {
		out := strings.TrimSpace(string(gk(t, "p", fmt.Sprintf("per_cpu(runqueues, %d).cpu", cpu))))
		if want := fmt.Sprintf("per_cpu(runqueues, %d).cpu = %d", cpu, cpu); out != want {
			t.Errorf("%q; want %q", out, want)
		}
	}
	// An rb-tree: the busy vmap areas, which /proc/vmallocinfo lists
	// (its addresses hidden from the agent: compared by size, each size
	// as often in the tree as in the file before and after).
	vmalloc := func() map[string]int {
		m := map[string]int{}
		for _, line := range strings.Split(gsh(t, ctx, "cat /proc/vmallocinfo"), "\n") {
			// Lazily freed areas ("unpurged vm_area") wait in
			// another tree.
			if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[0], "0x") && !strings.Contains(line, "unpurged") {
				m[f[1]]++
			}
		}
		return m
	}
	v1 := vmalloc()
	var areas []struct {
		Members []struct {
			Value uint64 `json:"value"`
		} `json:"members"`
	}
	if err := json.Unmarshal(gk(t, "list", "vmap_area.rb_node", "-H", "vmap_area_root", "-s", "va_start,va_end", "--json"), &areas); err != nil {
		t.Fatal(err)
	}
	v2 := vmalloc()
	inTree := map[string]int{}
	var last uint64
	for _, a := range areas {
		if len(a.Members) != 2 {
			t.Fatalf("list -s va_start,va_end: %+v", a)
		}
		lo, hi := a.Members[0].Value, a.Members[1].Value
		if lo <= last || hi <= lo {
			t.Errorf("vmap area [%#x, %#x) after one at %#x: not in order", lo, hi, last)
		}
		last = lo
		inTree[strconv.FormatUint(hi-lo, 10)]++
	}
	short, total := 0, 0
	for size, n := range v1 {
		n = min(n, v2[size])
		total += n
		if inTree[size] < n {
			short += n - inTree[size]
		}
	}
	if short > 0 || total == 0 {
		t.Errorf("vmap_area_root: %d areas; %d of /proc/vmallocinfo's %d (by size, there before and after) not in it", len(areas), short, total)
	}
	t.Logf("rb-tree vmap_area_root: %d areas in order; /proc/vmallocinfo lists %d", len(areas), total)
	for _, bad := range []struct {
		args   []string
		saying string
	}{
		{[]string{"p", "init_task.comm"}, "init_task"},
		{[]string{"p", "((struct task_struct *)&init_task)->no_such_member"}, "struct task_struct has no member no_such_member"},
		{[]string{"struct", "task_struct", "init_task", "-m", "pid,nosuch"}, "no member nosuch"},
		{[]string{"list", "task_struct.comm", "-H", "((struct task_struct *)&init_task)->tasks"}, "not a struct list_head"},
		{[]string{"p", "((struct task_struct *)&init_task"}, `want ")"`},
	} {
		var out, errb bytes.Buffer
		code, err := guest.Instance.Exec(ctx, append([]string{"kinst", "core", "/proc/kcore"}, bad.args...), &out, &errb)
		if err != nil || code != 1 || !strings.Contains(errb.String(), bad.saying) {
			t.Errorf("kinst core /proc/kcore %s: status %d, %v, %q; want status 1 saying %q", strings.Join(bad.args, " "), code, err, errb.String(), bad.saying)
		}
	}
}

// checkLiveFiles: files of a process with /dev/null, a file and a FIFO
// held open lists each descriptor with the target /proc/PID/fd gives,
// the held file as a regular file and the FIFO as one.
func checkLiveFiles(t *testing.T, ctx context.Context, gk func(*testing.T, ...string) []byte, pid int) {
	want := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(gsh(t, ctx, fmt.Sprintf(`for f in /proc/%d/fd/*; do echo "${f##*/} $(readlink $f)"; done`, pid))), "\n") {
		fd, target, _ := strings.Cut(line, " ")
		n, err := strconv.Atoi(fd)
		if err != nil {
			t.Fatalf("/proc/%d/fd: %q", pid, line)
		}
		want[n] = target
	}
	var rep struct {
		PID   int `json:"pid"`
		Files []struct {
			FD   int    `json:"fd"`
			Type string `json:"type"`
			Path string `json:"path"`
		} `json:"files"`
	}
	if err := json.Unmarshal(gk(t, "files", strconv.Itoa(pid), "--json"), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[int]string{}
	for _, f := range rep.Files {
		got[f.FD] = f.Path
		if f.FD == 3 && f.Type != "REG" || f.FD == 4 && f.Type != "FIFO" {
			t.Errorf("fd %d: type %q, want REG for 3, FIFO for 4", f.FD, f.Type)
		}
	}
	if rep.PID != pid || fmt.Sprint(got) != fmt.Sprint(want) || want[3] != "/tmp/kinst-kcore-dir/held" {
		t.Errorf("files %d: %v\n/proc/%d/fd: %v", pid, got, pid, want)
	}
}

// checkLiveMount: mount lists the mounts of /proc/mounts: device, mount
// point and file system type, in the same order.
func checkLiveMount(t *testing.T, ctx context.Context, gk func(*testing.T, ...string) []byte) {
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(gsh(t, ctx, "cat /proc/mounts")), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 {
			want = append(want, f[0]+" "+f[1]+" "+f[2])
		}
	}
	var ms []struct {
		Type   string `json:"type"`
		Device string `json:"device"`
		Dir    string `json:"dir"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal(gk(t, "mount", "--json"), &ms); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.Device+" "+m.Dir+" "+m.Type)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("mount:\n%s\n/proc/mounts:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
