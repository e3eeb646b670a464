package livecore

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/kbtf"
)

// slabsJSON is `kinst core DUMP slabs --json`.
type slabsJSON struct {
	Caches []struct {
		Name       string   `json:"name"`
		Address    string   `json:"address"`
		Aliases    []string `json:"aliases"`
		ObjectSize int      `json:"object_size"`
		Size       int      `json:"size"`
		Slabs      int      `json:"slabs"`
		Allocated  int      `json:"allocated"`
		Free       int      `json:"free"`
		Objects    int      `json:"objects"`
		FreePerCPU int      `json:"free_percpu"`
		Sysfs      string   `json:"sysfs"`
		PerSlab    int      `json:"objects_per_slab"`
		Anomalies  int      `json:"anomalies"`
	} `json:"caches"`
	Anomalies    []string `json:"anomalies"`
	AnomalyCount int      `json:"anomaly_count"`
	AliasSource  string   `json:"alias_source"`
}

// whatJSON is `kinst core DUMP whattype ADDR --json`.
type whatJSON struct {
	Address string  `json:"address"`
	Kind    string  `json:"kind"`
	Cache   *string `json:"cache"`
	Object  *string `json:"object"`
	State   *string `json:"state"`
	Type    *string `json:"type"`
	Offset  *int64  `json:"offset"`
	Member  *string `json:"member"`
	Source  *string `json:"source"`
	How     string  `json:"how"`
}

// slabinfo is one /proc/slabinfo line: active_objs, num_objs, num_slabs.
type slabinfo struct{ active, objects, slabs int }

func parseSlabinfo(t *testing.T, text string) map[string]slabinfo {
	out := map[string]slabinfo{}
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		// name active num objsize perslab pages : tunables l b s : slabdata active_slabs num_slabs shared
		if len(f) != 16 || f[6] != ":" || f[11] != ":" {
			continue
		}
		n := func(s string) int {
			v, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("slabinfo line %q", l)
			}
			return v
		}
		out[f[0]] = slabinfo{n(f[1]), n(f[2]), n(f[14])}
	}
	if len(out) < 50 {
		t.Fatalf("slabinfo has %d caches:\n%s", len(out), text)
	}
	return out
}

// TestSlabs compares `kinst core slabs` with the guest's /proc/slabinfo
// and /sys/kernel/slab, and `whattype` with objects the guest's own
// account names.
//
// The oracle. /proc/slabinfo prints, per cache (get_slabinfo, 6.1),
// num_objs = the nodes' total_objects (every object of every slab) and
// active_objs = num_objs less the free objects of the slabs on the
// nodes' partial lists (count_partial). The free objects of the CPU
// slabs (their lockless freelists and remote frees) and of the per-CPU
// partial slabs are thus "active" there, though free. kinst's allocated
// excludes them, so the quantity to compare is allocated + free_percpu
// (the free objects not on a node's list); comparing allocated alone
// would be off by every CPU's free objects.
//
// The guest reads slabinfo and is stopped at once for the dump, so the
// dump sees what the guest printed but for the few objects the reading
// itself (the agent, its shell and cat exiting, the reply) allocated or
// freed meanwhile. slabinfo is read again after the dump: a cache whose
// line is the same both times was untouched and must match exactly, and
// most caches must be such; one that moved must lie within the two
// readings, give or take one slab.
func TestSlabs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// A known workload: a sleep whose cwd is a directory we made and whose
	// fd 3 is a file in it.
	pid, err := strconv.Atoi(strings.TrimSpace(gsh(t, ctx, `mkdir -p /tmp/kinst-slabtest-dir && cd /tmp/kinst-slabtest-dir &&
setsid sh -c 'echo $$ > /tmp/kinst-slabtest.pid; exec 3>held; exec sleep 3000' </dev/null >/dev/null 2>&1 &
sleep 0.5; cat /tmp/kinst-slabtest.pid`)))
	if err != nil {
		t.Fatal(err)
	}
	defer gsh(t, ctx, fmt.Sprintf("kill %d", pid))
	sysfs := gsh(t, ctx, "ls -l /sys/kernel/slab")
	s1 := gsh(t, ctx, "cat /proc/slabinfo")
	if _, err := guest.QMP("stop", nil); err != nil {
		t.Fatal(err)
	}
	path := dumpGuest(t, "slabs.elf", "elf")
	if _, err := guest.QMP("cont", nil); err != nil {
		t.Fatal(err)
	}
	s2 := gsh(t, ctx, "cat /proc/slabinfo")

	start := time.Now()
	out := kinst(t, "core", path, "slabs", "--json")
	t.Logf("kinst core slabs: %.2fs", time.Since(start).Seconds())
	var sl slabsJSON
	if err := json.Unmarshal(out, &sl); err != nil {
		t.Fatal(err)
	}
	checkSlabinfo(t, &sl, parseSlabinfo(t, s1), parseSlabinfo(t, s2))
	checkAliases(t, &sl, sysfs)
	checkWhatType(t, path, pid, &sl)
	t.Run("findleaks", func(t *testing.T) {
		dumped := func(t *testing.T, args ...string) []byte { return kinst(t, append([]string{"core", path}, args...)...) }
		checkFindLeaks(t, dumped, taskAddress(t, path, pid), 2, 5, true)
	})
	t.Run("crash", func(t *testing.T) { checkCrashKmem(t, path, &sl) })
	t.Run("crash-print", func(t *testing.T) { checkCrashPrint(t, path) })
}

// checkCrashPrint: kinst's p, with variable types from the debug
// vmlinux's DWARF, prints what crash's p prints on the same dump, for a
// number, a string member of a nested struct and a task's comm.
func checkCrashPrint(t *testing.T, path string) {
	crash, err := exec.LookPath("crash")
	if err != nil {
		t.Skip("crash is not installed (apt-get install crash)")
	}
	if rel := guest.KernelRelease(); !strings.HasPrefix(rel, "6.1.") {
		t.Skipf("Debian 12's crash 8.0.2 does not read %s dumps", rel)
	}
	vmlinux := guest.DebugVmlinux(t)
	exprs := []string{"jiffies", "init_uts_ns.name.release", "init_task.comm", "init_task.se.load.weight"}
	cmds := filepath.Join(t.TempDir(), "cmds")
	var script strings.Builder
	for _, e := range exprs {
		script.WriteString("p " + e + "\n")
	}
	script.WriteString("quit\n")
	os.WriteFile(cmds, []byte(script.String()), 0o600)
	out, err := exec.Command(crash, "-s", vmlinux, path, "-i", cmds).CombinedOutput()
	if err != nil {
		t.Fatalf("crash: %v\n%s", err, out)
	}
	// crash: "$1 = 4294892296", "$2 = \"6.1.0-56-amd64\\000…\"".
	// gdb shortens a run of NULs: "6.1.0-56-amd64", '\000' <repeats 50 times>.
	re := regexp.MustCompile(`(?m)\$\d+ = (.*)$`)
	got := re.FindAllStringSubmatch(string(out), -1)
	if len(got) != len(exprs) {
		t.Fatalf("crash printed %d values for %d expressions:\n%s", len(got), len(exprs), out)
	}
	for i, e := range exprs {
		want := got[i][1]
		if strings.HasPrefix(want, `"`) {
			text, _, _ := strings.Cut(want[1:], `"`)
			text, _, _ = strings.Cut(text, `\000`)
			want = `"` + text + `"`
		}
		start := time.Now()
		line := strings.TrimSpace(string(kinst(t, "core", path, "--vmlinux", vmlinux, "p", e)))
		if line != e+" = "+want {
			t.Errorf("kinst core p %s: %q; crash: %q", e, line, want)
		}
		t.Logf("p %s = %s (kinst %.2fs)", e, want, time.Since(start).Seconds())
	}
}

// checkCrashKmem: crash's `kmem -s`, with types from the debug vmlinux,
// counts the same allocated objects, objects and slabs per cache.
func checkCrashKmem(t *testing.T, path string, sl *slabsJSON) {
	crash, err := exec.LookPath("crash")
	if err != nil {
		t.Skip("crash is not installed (apt-get install crash)")
	}
	if rel := guest.KernelRelease(); !strings.HasPrefix(rel, "6.1.") {
		// Seen: crash 8.0.2 calls a 6.12 dump and its own debug vmlinux
		// "do not match" (its banner and layout readers predate 6.12).
		t.Skipf("Debian 12's crash 8.0.2 does not read %s dumps", rel)
	}
	vmlinux := guest.DebugVmlinux(t)
	cmds := filepath.Join(t.TempDir(), "cmds")
	os.WriteFile(cmds, []byte("kmem -s\nquit\n"), 0o600)
	start := time.Now()
	out, err := exec.Command(crash, "-s", vmlinux, path, "-i", cmds).CombinedOutput()
	if err != nil {
		t.Fatalf("crash: %v\n%s", err, out)
	}
	t.Logf("crash kmem -s: %.2fs (cold start, symbols and types from the debug vmlinux)", time.Since(start).Seconds())
	// CACHE OBJSIZE ALLOCATED TOTAL SLABS SSIZE NAME
	re := regexp.MustCompile(`(?m)^([0-9a-f]{16})\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+k\s+(\S+)\s*$`)
	type row struct {
		alloc, total, slabs int
		name                string
	}
	rows := map[string]row{}
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		n := func(s string) int { v, _ := strconv.Atoi(s); return v }
		rows["0x"+strings.TrimLeft(m[1], "0")] = row{n(m[3]), n(m[4]), n(m[5]), m[6]}
	}
	if len(rows) != len(sl.Caches) {
		t.Errorf("crash lists %d caches, kinst %d", len(rows), len(sl.Caches))
	}
	same := 0
	for _, c := range sl.Caches {
		r, ok := rows[c.Address]
		switch {
		case !ok:
			t.Errorf("%s (%s): not in crash's kmem -s", c.Name, c.Address)
		case r.name != c.Name || r.alloc != c.Allocated || r.total != c.Objects || r.slabs != c.Slabs:
			t.Errorf("%s: kinst allocated %d of %d in %d slabs; crash %s: %d of %d in %d", c.Name, c.Allocated, c.Objects, c.Slabs, r.name, r.alloc, r.total, r.slabs)
		default:
			same++
		}
	}
	t.Logf("crash kmem -s agrees on %d of %d caches (allocated, total, slabs)", same, len(sl.Caches))
}

func checkSlabinfo(t *testing.T, sl *slabsJSON, s1, s2 map[string]slabinfo) {
	// The walk's own cross-checks (each node's nr_slabs, total_objects and
	// nr_partial, each slab's inuse against its freelist) hold at the
	// dump's moment; a CPU caught inside the allocator could leave one
	// cache's counters mid-update, never a broken freelist.
	bad := 0
	for _, c := range sl.Caches {
		if c.Anomalies > 0 {
			bad++
		}
	}
	for _, a := range sl.Anomalies {
		if regexp.MustCompile(`free twice|outside the slab|object's start|loops|not a slab of this cache|not on slab_caches`).MatchString(a) {
			t.Errorf("anomaly: %s", a)
		}
	}
	if bad > 1 {
		t.Errorf("%d caches with anomalies: %q", bad, sl.Anomalies)
	} else if sl.AnomalyCount > 0 {
		t.Logf("anomalies (tolerated in one cache): %q", sl.Anomalies)
	}
	exact, moved, objects := 0, 0, 0
	seen := map[string]bool{}
	for _, c := range sl.Caches {
		seen[c.Name] = true
		a, ok1 := s1[c.Name]
		b, ok2 := s2[c.Name]
		if !ok1 || !ok2 {
			t.Errorf("cache %s is not in /proc/slabinfo", c.Name)
			continue
		}
		if c.Allocated+c.Free != c.Objects || c.FreePerCPU > c.Free {
			t.Errorf("%s: allocated %d + free %d != objects %d, or free_percpu %d > free", c.Name, c.Allocated, c.Free, c.Objects, c.FreePerCPU)
		}
		objects += c.Objects
		got := slabinfo{c.Allocated + c.FreePerCPU, c.Objects, c.Slabs}
		if a == b {
			exact++
			if got != a {
				t.Errorf("%s: dump active %d objects %d slabs %d (allocated %d, free per-CPU %d); slabinfo %d %d %d, unchanged after the dump",
					c.Name, got.active, got.objects, got.slabs, c.Allocated, c.FreePerCPU, a.active, a.objects, a.slabs)
			}
			continue
		}
		moved++
		within := func(g, x, y, slack int) bool { return g >= min(x, y)-slack && g <= max(x, y)+slack }
		if !within(got.active, a.active, b.active, c.PerSlab) || !within(got.objects, a.objects, b.objects, c.PerSlab) || !within(got.slabs, a.slabs, b.slabs, 1) {
			t.Errorf("%s: dump %+v; slabinfo before %+v, after %+v (one slab: %d objects)", c.Name, got, a, b, c.PerSlab)
		}
	}
	for name := range s1 {
		if !seen[name] {
			t.Errorf("/proc/slabinfo lists %s; the dump does not", name)
		}
	}
	if exact < 3*len(sl.Caches)/4 || objects == 0 {
		t.Errorf("only %d of %d caches were quiet enough to compare exactly", exact, len(sl.Caches))
	}
	t.Logf("%d caches, %d objects: %d equal to /proc/slabinfo, %d moved while it was read (within bounds)", len(sl.Caches), objects, exact, moved)
}

// checkAliases: each cache's aliases are the symlinks /sys/kernel/slab
// has to its directory, besides its own name.
func checkAliases(t *testing.T, sl *slabsJSON, ls string) {
	links := map[string][]string{}
	re := regexp.MustCompile(` (\S+) -> (\S+)$`)
	for _, l := range strings.Split(ls, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			links[m[2]] = append(links[m[2]], m[1])
		}
	}
	merged := 0
	for _, c := range sl.Caches {
		var want []string
		for _, n := range links[c.Sysfs] {
			if n != c.Name {
				want = append(want, n)
			}
		}
		sort.Strings(want)
		if strings.Join(want, ",") != strings.Join(c.Aliases, ",") || c.Sysfs == "" {
			t.Errorf("%s (sysfs %q): aliases %q; /sys/kernel/slab links %q", c.Name, c.Sysfs, c.Aliases, want)
		}
		if len(c.Aliases) > 0 {
			merged++
		}
	}
	if merged < 5 {
		t.Errorf("only %d merged caches (a stock kernel merges dozens)", merged)
	}
	t.Logf("%d merged caches; aliases from %s", merged, sl.AliasSource)
}

// layoutOf reads the kernel's BTF from its vmlinux, for the offsets the
// test follows pointers by.
func layoutOf(t *testing.T) func(st, path string) uint64 {
	vmlinux, err := guest.Kernel(cache).Vmlinux()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := f.Section(".BTF").Data()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return func(st, path string) uint64 {
		var s *btf.Struct
		if err := spec.TypeByName(st, &s); err != nil {
			t.Fatal(err)
		}
		var typ btf.Type = s
		var off uint64
		for _, p := range strings.Split(path, ".") {
			m, ok := kbtf.Member(typ, p)
			if !ok {
				t.Fatalf("struct %s has no %s", st, path)
			}
			off += uint64(m.Offset.Bytes())
			typ = m.Type
		}
		return off
	}
}

// taskAddress is pid's task_struct in the dump, as `kinst core ps` (which
// reads the task list) gives it.
func taskAddress(t *testing.T, path string, pid int) uint64 {
	t.Helper()
	return taskFromPS(t, kinst(t, "core", path, "ps", "--json"), pid)
}

// taskFromPS is pid's task_struct in the output of `kinst core … ps --json`.
func taskFromPS(t *testing.T, out []byte, pid int) uint64 {
	t.Helper()
	var ps struct {
		Tasks []struct {
			Address string `json:"address"`
			PID     int    `json:"pid"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal(out, &ps); err != nil {
		t.Fatal(err)
	}
	var task uint64
	for _, tk := range ps.Tasks {
		if tk.PID == pid {
			task, _ = strconv.ParseUint(tk.Address, 0, 64)
		}
	}
	if task == 0 {
		t.Fatalf("pid %d not in ps", pid)
	}
	return task
}

// checkWhatType: whattype on objects the guest's own account leads to:
// the workload's task_struct (its address from ps, which reads the task
// list), its ->signal, the dentry of its cwd (a directory the test made,
// named in the dentry), that dentry's inode, and the file of its fd 3.
func checkWhatType(t *testing.T, path string, pid int, sl *slabsJSON) {
	off := layoutOf(t)
	task := taskAddress(t, path, pid)
	rd := func(a uint64, n int) []byte {
		var m struct{ Bytes string }
		if err := json.Unmarshal(kinst(t, "core", path, "rd", fmt.Sprintf("%#x", a), strconv.Itoa(n), "--json"), &m); err != nil {
			t.Fatal(err)
		}
		b, _ := hex.DecodeString(m.Bytes)
		return b
	}
	ptr := func(a uint64) uint64 { return binary.LittleEndian.Uint64(rd(a, 8)) }
	what := func(a uint64) whatJSON {
		var w whatJSON
		if err := json.Unmarshal(kinst(t, "core", path, "whattype", fmt.Sprintf("%#x", a), "--json"), &w); err != nil {
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
	// inCache: the object is in cache name, or in the cache name was
	// merged into.
	inCache := func(w whatJSON, name string) bool {
		for _, c := range sl.Caches {
			if c.Name != str(w.Cache) {
				continue
			}
			if c.Name == name {
				return true
			}
			for _, a := range c.Aliases {
				if a == name {
					return true
				}
			}
		}
		return false
	}
	check := func(label string, a, object uint64, cache, typ, member string) whatJSON {
		w := what(a)
		ok := w.Kind == "slab object" && inCache(w, cache) && str(w.Object) == fmt.Sprintf("%#x", object) &&
			str(w.State) == "allocated" && w.Offset != nil && uint64(*w.Offset) == a-object
		if typ != "" {
			ok = ok && str(w.Type) == typ && str(w.Source) == "cache" && str(w.Member) == member
		} else {
			// A merged cache holds several types: none from the cache.
			ok = ok && w.Type == nil && strings.Contains(w.How, "merged")
		}
		if !ok {
			t.Errorf("%s: whattype %#x = %+v (cache %s, object %s, type %s, member %s, source %s); want cache %s, object %#x, type %q, member %q",
				label, a, w, str(w.Cache), str(w.Object), str(w.Type), str(w.Member), str(w.Source), cache, object, typ, member)
		} else {
			t.Logf("%s: %#x: cache %s, %s %s, type %s, member %s (%s)", label, a, str(w.Cache), str(w.State), str(w.Object), str(w.Type), str(w.Member), w.How)
		}
		return w
	}
	check("task_struct", task+off("task_struct", "signal"), task, "task_struct", "task_struct", "task_struct.signal")
	check("task_struct+3", task+off("task_struct", "comm")+3, task, "task_struct", "task_struct", "task_struct.comm[3]")
	sig := ptr(task + off("task_struct", "signal"))
	w := what(sig)
	if !inCache(w, "signal_cache") || str(w.Object) != fmt.Sprintf("%#x", sig) || str(w.State) != "allocated" ||
		(w.Type != nil && (*w.Type != "signal_struct" || *w.Member != "signal_struct.sigcnt.refs.counter")) {
		t.Errorf("->signal %#x: %+v", sig, w)
	}
	t.Logf("->signal: %#x: cache %s, type %s (%s)", sig, str(w.Cache), str(w.Type), w.How)
	// The cwd's dentry: its name is the directory the test made.
	fs := ptr(task + off("task_struct", "fs"))
	dentry := ptr(fs + off("fs_struct", "pwd.dentry"))
	name := ptr(dentry + off("dentry", "d_name.name"))
	if got := string(bytes.TrimRight(rd(name, 18), "\x00")); got != "kinst-slabtest-dir" {
		t.Fatalf("cwd dentry %#x names %q", dentry, got)
	}
	check("dentry", dentry+off("dentry", "d_name.name")+3, dentry, "dentry", "dentry", "dentry.d_name.name+0x3")
	if name != dentry+off("dentry", "d_iname") {
		t.Errorf("the short name is not inline: %#x", name)
	}
	check("dentry inline name", name+2, dentry, "dentry", "dentry", "dentry.d_iname[2]")
	// Its inode, in its file system's inode cache.
	inode := ptr(dentry + off("dentry", "d_inode"))
	w = what(inode)
	if w.Kind != "slab object" || !strings.HasSuffix(str(w.Cache), "inode_cache") || str(w.State) != "allocated" ||
		w.Type == nil || !strings.HasSuffix(str(w.Member), "i_mode") {
		t.Errorf("inode %#x: %+v (type %s member %s)", inode, w, str(w.Type), str(w.Member))
	}
	t.Logf("inode: %#x: cache %s, object %s, type %s, member %s (%s)", inode, str(w.Cache), str(w.Object), str(w.Type), str(w.Member), w.How)
	// fd 3: the file "held", in filp (merged in a stock kernel).
	files := ptr(task + off("task_struct", "files"))
	fdt := ptr(files + off("files_struct", "fdt"))
	fd := ptr(fdt + off("fdtable", "fd"))
	file := ptr(fd + 3*8)
	fw := what(file)
	if !inCache(fw, "filp") || str(fw.Object) != fmt.Sprintf("%#x", file) || str(fw.State) != "allocated" {
		t.Errorf("fd 3 %#x: %+v", file, fw)
	}
	fd3 := ptr(ptr(file+off("file", "f_path.dentry")) + off("dentry", "d_name.name"))
	if got := string(bytes.TrimRight(rd(fd3, 5), "\x00")); got != "held" {
		t.Errorf("fd 3's dentry names %q", got)
	}
	t.Logf("fd 3: %#x: cache %s, type %s (%s)", file, str(fw.Cache), str(fw.Type), fw.How)
	// Not heap objects: the task's stack, a kernel symbol, the null page.
	stack := ptr(task + off("task_struct", "stack"))
	if w := what(stack + 100); w.Kind != "task stack" {
		t.Errorf("stack %#x: %+v", stack+100, w)
	}
	if w := what(mustSym(t, path, "jiffies_64")); w.Kind != "kernel symbol" {
		t.Errorf("jiffies_64: %+v", w)
	}
	if b, err := exec.Command(filepath.Join(bin, "kinst"), "core", path, "whattype", "0x10").CombinedOutput(); err == nil || !strings.Contains(string(b), "not a kernel address") {
		t.Errorf("whattype 0x10: %v %s", err, b)
	}
}

func mustSym(t *testing.T, path, name string) uint64 {
	var s struct{ Address string }
	if err := json.Unmarshal(kinst(t, "core", path, "sym", name, "--json"), &s); err != nil {
		t.Fatal(err)
	}
	a, _ := strconv.ParseUint(s.Address, 0, 64)
	return a
}

// BenchmarkCoreSlabs times `kinst core DUMP slabs` end to end on a dump
// of the 1 GiB guest, and crash's `kmem -s` on the same dump from a cold
// start (crash loads the 600 MB debug vmlinux first), with the CPU time
// of each process as cpu-ms/op. The guest is paused meanwhile.
func BenchmarkCoreSlabs(b *testing.B) {
	path := filepath.Join(tmp, "bench.elf")
	if _, err := os.Stat(path); err != nil {
		dumpGuest(b, "bench.elf", "elf")
	}
	if _, err := guest.QMP("stop", nil); err == nil {
		defer guest.QMP("cont", nil)
	}
	run := func(b *testing.B, name string, args ...string) {
		var cpu time.Duration
		for b.Loop() {
			cmd := exec.Command(name, args...)
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%s %v: %v\n%s", name, args, err, out)
			}
			cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
		b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	}
	b.Run("kinst", func(b *testing.B) { run(b, filepath.Join(bin, "kinst"), "core", path, "slabs") })
	b.Run("crash", func(b *testing.B) {
		crash, err := exec.LookPath("crash")
		if err != nil {
			b.Skip("crash is not installed")
		}
		vmlinux := guest.DebugVmlinux(b)
		cmds := filepath.Join(b.TempDir(), "cmds")
		os.WriteFile(cmds, []byte("kmem -s\nquit\n"), 0o600)
		run(b, crash, "-s", vmlinux, path, "-i", cmds)
	})
}
