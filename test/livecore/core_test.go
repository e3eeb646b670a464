package livecore

import (
	"context"
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

	"github.com/kinst/kinst/app/livetest"
)

type psJSON struct {
	Tasks []struct {
		PID    int    `json:"pid"`
		TGID   int    `json:"tgid"`
		Comm   string `json:"comm"`
		State  string `json:"state"`
		CPU    int    `json:"cpu"`
		Active bool   `json:"active"`
	} `json:"tasks"`
}

type frameJSON struct {
	Address  string `json:"address"`
	Function string `json:"function"`
	Offset   uint64 `json:"offset"`
}

type stackJSON struct {
	Task struct {
		Address string `json:"address"`
		PID     int    `json:"pid"`
		Comm    string `json:"comm"`
		Active  bool   `json:"active"`
		CPU     int    `json:"cpu"`
	} `json:"task"`
	Frames   []frameJSON `json:"frames"`
	Stop     string      `json:"stop"`
	UserMode bool        `json:"user_mode"`
}

// guestState is what the guest said about itself just before a dump.
type guestState struct {
	self     int            // pid of the shell that took the snapshot
	ps       map[int]string // pid → comm, from busybox ps
	stacks   map[int][]string
	dmesg    []string
	kallsyms map[string]string // name → address, text symbols of vmlinux
}

// snapshot starts the workload (a sleep, a cat blocked on a pipe), waits
// until they are asleep, and records the guest's own ps, the kernel's
// stacks of the workload (/proc/PID/stack) and dmesg.
func snapshot(t *testing.T, ctx context.Context) (*guestState, map[string]int) {
	gsh(t, ctx, `setsid sh -c 'sleep 1000 | cat' </dev/null >/dev/null 2>&1 &
setsid sh -c 'echo $$ > /tmp/spin.pid; while :; do :; done' </dev/null >/dev/null 2>&1 &
echo livecore-marker-$$ > /dev/kmsg
for i in 1 2 3 4 5 6 7 8 9 10; do pidof cat >/dev/null && pidof sleep >/dev/null && break; sleep 0.2; done
sleep 0.5`)
	out := gsh(t, ctx, `echo SELF $$
echo PIDS sleep=$(pidof sleep) cat=$(pidof cat) spin=$(cat /tmp/spin.pid)
for p in $(pidof sleep) $(pidof cat); do echo STACK $p; cat /proc/$p/stack; done
echo PS; ps -o pid,comm
echo DMESG; dmesg`)
	g := &guestState{ps: map[int]string{}, stacks: map[int][]string{}}
	work := map[string]int{}
	section, cur := "", 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "SELF "):
			g.self, _ = strconv.Atoi(f[1])
		case strings.HasPrefix(line, "PIDS "):
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				work[k], _ = strconv.Atoi(v)
			}
		case strings.HasPrefix(line, "STACK "):
			section = "stack"
			cur, _ = strconv.Atoi(f[1])
		case line == "PS":
			section = "ps"
		case line == "DMESG":
			section = "dmesg"
		case section == "stack" && len(f) == 2:
			// "[<0>] do_nanosleep+0x7b/0x170" → "do_nanosleep+0x7b"
			fn, _, _ := strings.Cut(f[1], "/")
			g.stacks[cur] = append(g.stacks[cur], fn)
		case section == "ps" && len(f) >= 2:
			if pid, err := strconv.Atoi(f[0]); err == nil {
				g.ps[pid] = f[1]
			}
		case section == "dmesg" && line != "":
			g.dmesg = append(g.dmesg, line)
		}
	}
	if g.self == 0 || work["sleep"] == 0 || work["cat"] == 0 || work["spin"] == 0 || len(g.ps) < 20 || len(g.dmesg) < 20 {
		t.Fatalf("guest snapshot incomplete:\n%s", out)
	}
	return g, work
}

// TestCore takes dumps of a guest in a known state (ELF and kdump-zlib)
// and checks kinst core against the guest's own account of itself; then
// panics the guest through sysrq and checks the panic dump.
func TestCore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	g, work := snapshot(t, ctx)
	kallsyms := gsh(t, ctx, `cat /proc/kallsyms`)
	// Stop the guest so that the two dumps see the same memory.
	if _, err := guest.QMP("stop", nil); err != nil {
		t.Fatal(err)
	}
	dumps := map[string]string{
		"elf":        dumpGuest(t, "guest.elf", "elf"),
		"kdump-zlib": dumpGuest(t, "guest.kdump", "kdump-zlib"),
	}
	t.Run("elf/rd", func(t *testing.T) { checkRead(t, dumps["elf"]) })
	if _, err := guest.QMP("cont", nil); err != nil {
		t.Fatal(err)
	}
	gsh(t, ctx, "kill $(cat /tmp/spin.pid)")
	for _, format := range []string{"elf", "kdump-zlib"} {
		path := dumps[format]
		t.Run(format+"/ps", func(t *testing.T) { checkPS(t, path, g) })
		t.Run(format+"/bt", func(t *testing.T) {
			for _, w := range []string{"sleep", "cat"} {
				checkBacktrace(t, path, work[w], w, g.stacks[work[w]])
			}
		})
		t.Run(format+"/log", func(t *testing.T) { checkLog(t, path, g.dmesg) })
	}
	t.Run("elf/vmlinux", func(t *testing.T) { checkVmlinux(t, dumps["elf"], work["sleep"]) })
	t.Run("elf/sym", func(t *testing.T) { checkSymbols(t, dumps["elf"], kallsyms) })
	t.Run("elf/dis", func(t *testing.T) { checkDis(t, dumps["elf"]) })
	t.Run("elf/bt-all", func(t *testing.T) { checkBacktraceAll(t, dumps["elf"], g) })
	t.Run("elf/running", func(t *testing.T) { checkRunning(t, dumps["elf"], work["spin"]) })
	t.Run("errors", func(t *testing.T) { checkErrors(t, dumps["elf"]) })
	os.Remove(dumps["kdump-zlib"])
	t.Run("panic", testPanic) // last: the guest does not come back
}

func checkPS(t *testing.T, path string, g *guestState) {
	var ps psJSON
	if err := json.Unmarshal(kinst(t, "core", path, "ps", "--json"), &ps); err != nil {
		t.Fatal(err)
	}
	dump := map[int]string{}
	threads := 0
	for _, task := range ps.Tasks {
		if task.PID == task.TGID && task.PID != 0 {
			dump[task.PID] = task.Comm
		}
		if task.PID != task.TGID {
			threads++
		}
		if !strings.Contains("RSDTtXZPI", task.State) || task.State == "" {
			t.Errorf("pid %d: state %q", task.PID, task.State)
		}
	}
	if threads == 0 {
		t.Errorf("no threads listed (kerninstd is multi-threaded)")
	}
	// Every process the guest listed, except the snapshot's own shell and
	// ps, is in the dump with its comm. /proc shows a kworker's comm with
	// its workqueue appended ("kworker/0:1-events"); task->comm lacks it.
	for pid, comm := range g.ps {
		if pid >= g.self {
			continue
		}
		got, ok := dump[pid]
		switch {
		case !ok:
			t.Errorf("guest ps lists pid %d (%s); the dump does not", pid, comm)
		case got != comm && !(strings.HasPrefix(got, "kworker/") && strings.HasPrefix(comm, got)):
			t.Errorf("pid %d: dump says comm %q, guest ps %q", pid, got, comm)
		}
	}
	// And every process in the dump existed for the guest's ps, unless it
	// started after it.
	for pid, comm := range dump {
		if _, ok := g.ps[pid]; !ok && pid < g.self {
			t.Errorf("dump lists pid %d (%s); guest ps did not", pid, comm)
		}
	}
	t.Logf("%d tasks (%d processes, %d threads); guest ps listed %d processes", len(ps.Tasks), len(dump), threads, len(g.ps))
}

func backtrace(t *testing.T, path string, pid int) stackJSON {
	var st stackJSON
	if err := json.Unmarshal(kinst(t, "core", path, "bt", strconv.Itoa(pid), "--json"), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// checkBacktrace: the unwound stack ends with exactly the frames the
// guest kernel's own unwinder gave for /proc/PID/stack (which leaves out
// the scheduler functions at the top), to the byte offset.
func checkBacktrace(t *testing.T, path string, pid int, comm string, want []string) {
	st := backtrace(t, path, pid)
	var got []string
	for _, f := range st.Frames {
		got = append(got, fmt.Sprintf("%s+%#x", f.Function, f.Offset))
		if !strings.HasPrefix(f.Address, "0xffff") {
			t.Errorf("frame address %q", f.Address)
		}
	}
	if st.Task.Comm != comm || len(want) < 3 || st.Stop != "" || len(got) < len(want) ||
		strings.Join(got[len(got)-len(want):], " ") != strings.Join(want, " ") {
		t.Fatalf("bt %d (%s): got %q (stop %q)\n/proc/%d/stack: %q", pid, st.Task.Comm, got, st.Stop, pid, want)
	}
	if !strings.HasPrefix(got[0], "__schedule+") {
		t.Errorf("bt %d: innermost frame %s, want __schedule", pid, got[0])
	}
	// The same task named by its task_struct address.
	var byAddr stackJSON
	if err := json.Unmarshal(kinst(t, "core", path, "bt", st.Task.Address, "--json"), &byAddr); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(byAddr) != fmt.Sprint(st) {
		t.Errorf("bt %s: %+v\nbt %d: %+v", st.Task.Address, byAddr, pid, st)
	}
	t.Logf("bt %d (%s): %s", pid, comm, strings.Join(got, " < "))
}

// checkVmlinux: types and unwind tables from the kernel's vmlinux file
// (relocated by the dump's KASLR offset) give the same ps and bt as the
// dump's own copies.
func checkVmlinux(t *testing.T, path string, pid int) {
	vmlinux, err := guest.Kernel(cache).Vmlinux()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ps", "--json"}, {"bt", strconv.Itoa(pid), "--json"}} {
		own := kinst(t, append([]string{"core", path}, args...)...)
		for _, flag := range []string{"--vmlinux", "--btf"} {
			if args[0] == "bt" && flag == "--btf" {
				continue
			}
			alt := kinst(t, append([]string{"core", path, flag, vmlinux}, args...)...)
			if string(alt) != string(own) {
				t.Errorf("%s %s: output differs from the dump's own tables:\n%s\nvs\n%s", args[0], flag, alt, own)
			}
		}
	}
	if out, err := exec.Command(filepath.Join(bin, "kinst"), "core", path, "--btf", "/etc/hostname", "ps").CombinedOutput(); err == nil {
		t.Errorf("ps --btf /etc/hostname succeeded: %s", out)
	}
}

func checkLog(t *testing.T, path string, dmesg []string) {
	out := string(kinst(t, "core", path, "log"))
	have := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		have[l] = true
	}
	missing := 0
	for _, l := range dmesg {
		if !have[l] {
			missing++
			if missing < 5 {
				t.Errorf("guest dmesg line missing from the dump's log: %q", l)
			}
		}
	}
	if !strings.Contains(out, "livecore-marker-") {
		t.Errorf("the marker written to /dev/kmsg is not in the log")
	}
	t.Logf("%d guest dmesg lines, %d missing", len(dmesg), missing)
}

// checkSymbols: kallsyms decoded from the dump, and each module's
// symbols read from its struct module, equal the guest's /proc/kallsyms
// (sampled through kinst core sym).
func checkSymbols(t *testing.T, path, kallsyms string) {
	lines := strings.Split(strings.TrimSpace(kallsyms), "\n")
	var kernel, modules []string
	for _, l := range lines {
		if strings.HasSuffix(l, "]") {
			modules = append(modules, l)
		} else {
			kernel = append(kernel, l)
		}
	}
	if len(kernel) < 10000 || len(modules) < 100 {
		t.Fatalf("guest kallsyms has %d kernel and %d module lines", len(kernel), len(modules))
	}
	var sample []string
	for i := 0; i < len(kernel); i += len(kernel) / 20 {
		sample = append(sample, kernel[i])
	}
	for i := 0; i < len(modules); i += len(modules) / 10 {
		sample = append(sample, modules[i])
	}
	for _, line := range sample {
		f := strings.Fields(line)
		if len(f) < 3 || f[1] == "A" || f[1] == "a" {
			continue
		}
		name := f[2]
		if len(f) == 4 { // "ADDR TYPE NAME [module]"
			name = strings.Trim(f[3], "[]") + ":" + f[2]
		}
		var s struct{ Name, Address, Type, Module string }
		if err := json.Unmarshal(kinst(t, "core", path, "sym", name, "--json"), &s); err != nil {
			t.Fatal(err)
		}
		want, _ := strconv.ParseUint(f[0], 16, 64)
		got, _ := strconv.ParseUint(s.Address, 0, 64)
		if got != want || s.Type != f[1] {
			// Static symbols may share a name: accept any guest line.
			if !strings.Contains(kallsyms, fmt.Sprintf("%016x %s %s", got, s.Type, f[2])) {
				t.Errorf("sym %s: %#x %s, guest %s %s", name, got, s.Type, f[0], f[1])
			}
		}
	}
}

// checkRead: bytes read from the dump through the page tables equal what
// QEMU's monitor reads through the CPU's (an oracle outside the guest
// kernel and our code), for kernel text and data in the image mapping and
// a task_struct in the direct map. The guest must still be stopped at the
// dump's moment.
func checkRead(t *testing.T, path string) {
	var tasks struct {
		Tasks []struct {
			Address string `json:"address"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal(kinst(t, "core", path, "ps", "--json"), &tasks); err != nil || len(tasks.Tasks) < 2 {
		t.Fatalf("ps: %v", err)
	}
	for _, a := range []string{"do_nanosleep", "init_task", "jiffies_64", tasks.Tasks[1].Address} {
		var m struct{ Address, Bytes string }
		if err := json.Unmarshal(kinst(t, "core", path, "rd", a, "64", "--json"), &m); err != nil {
			t.Fatal(err)
		}
		va, _ := strconv.ParseUint(m.Address, 0, 64)
		ref, err := guest.ReadVirt(va, 64)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprintf("%x", ref) != m.Bytes {
			t.Errorf("rd %s (%#x): dump %s, QEMU %x", a, va, m.Bytes, ref)
		}
	}
	// rd --phys reads the dump's physical memory directly: the task_struct
	// at its direct-map address less page_offset_base must be the same
	// bytes the page walk found.
	var pob, task struct{ Address, Bytes string }
	if err := json.Unmarshal(kinst(t, "core", path, "rd", "page_offset_base", "8", "--json"), &pob); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(kinst(t, "core", path, "rd", tasks.Tasks[1].Address, "64", "--json"), &task); err != nil {
		t.Fatal(err)
	}
	raw, err := hex.DecodeString(pob.Bytes)
	if err != nil || len(raw) != 8 {
		t.Fatalf("page_offset_base: %q", pob.Bytes)
	}
	va, _ := strconv.ParseUint(task.Address, 0, 64)
	pa := va - binary.LittleEndian.Uint64(raw)
	var phys struct {
		Bytes    string
		Physical bool
	}
	if err := json.Unmarshal(kinst(t, "core", path, "rd", "--phys", fmt.Sprintf("%#x", pa), "64", "--json"), &phys); err != nil {
		t.Fatal(err)
	}
	if !phys.Physical || phys.Bytes != task.Bytes {
		t.Errorf("rd --phys %#x = %s, rd %s = %s", pa, phys.Bytes, task.Address, task.Bytes)
	}
}

// checkDis: the disassembly of a function matches objdump's of the same
// bytes.
func checkDis(t *testing.T, path string) {
	var d struct {
		Function     string
		Address      string
		Instructions []struct{ Address, Bytes, Text string }
	}
	if err := json.Unmarshal(kinst(t, "core", path, "dis", "do_nanosleep", "--json"), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Instructions) < 10 {
		t.Fatalf("dis do_nanosleep: %d instructions", len(d.Instructions))
	}
	var raw []byte
	for _, in := range d.Instructions {
		var b []byte
		fmt.Sscanf(in.Bytes, "%x", &b)
		raw = append(raw, b...)
	}
	bin := filepath.Join(t.TempDir(), "code.bin")
	os.WriteFile(bin, raw, 0o600)
	out, err := exec.Command("objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "--adjust-vma="+d.Address, bin).Output()
	if err != nil {
		t.Skipf("objdump: %v", err)
	}
	// An instruction line is "addr:\tbytes\tmnemonic"; objdump continues
	// long encodings on lines without the mnemonic.
	re := regexp.MustCompile(`(?m)^\s*([0-9a-f]+):\t[^\t\n]*\t`)
	var starts []string
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		starts = append(starts, "0x"+m[1])
	}
	var ours []string
	for _, in := range d.Instructions {
		ours = append(ours, in.Address)
	}
	if strings.Join(starts, " ") != strings.Join(ours, " ") {
		t.Errorf("instruction boundaries differ from objdump's:\nours    %v\nobjdump %v", ours, starts)
	}
}

// checkBacktraceAll: every task unwinds to its outermost frame (a
// kernel thread's ret_from_fork or a syscall's entry), including a CPU
// caught inside an interrupt handler on its IRQ stack.
func checkBacktraceAll(t *testing.T, path string, g *guestState) {
	var all struct {
		Stacks []stackJSON `json:"stacks"`
	}
	if err := json.Unmarshal(kinst(t, "core", path, "bt", "-a", "--json"), &all); err != nil {
		t.Fatal(err)
	}
	bad := 0
	outer := map[string]int{}
	for _, st := range all.Stacks {
		if st.UserMode && st.Task.Active {
			continue // caught running user code: no kernel stack
		}
		if st.Stop != "" || len(st.Frames) == 0 {
			bad++
			t.Logf("pid %d (%s): %d frames, stop %q", st.Task.PID, st.Task.Comm, len(st.Frames), st.Stop)
			continue
		}
		outer[st.Frames[len(st.Frames)-1].Function]++
	}
	if bad > 0 {
		t.Errorf("%d of %d stacks did not unwind cleanly", bad, len(all.Stacks))
	}
	keys := make([]string, 0, len(outer))
	for k := range outer {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		// Kernel threads start at ret_from_fork, CPUs at their startup code;
		// a user task entered by a syscall or by an interrupt or exception
		// (a preempted user loop) has the user-mode pt_regs there.
		// (6.12: ret_from_fork_asm, and common_startup_64 for the CPUs.)
		if !regexp.MustCompile(`^(ret_from_fork|ret_from_fork_asm|entry_SYSCALL_64_after_hwframe|secondary_startup_64_no_verify|common_startup_64|start_kernel|asm_(sysvec_\w+|common_interrupt|exc_\w+))$`).MatchString(k) {
			t.Errorf("%d stacks end in %s, not at an outermost kernel frame", outer[k], k)
		}
	}
	t.Logf("%d stacks; outermost frames %v", len(all.Stacks), outer)
}

// checkRunning: a shell spinning in a loop is runnable. Usually it is on
// a CPU when the dump is taken, and bt unwinds it from that CPU's
// registers: it was in user mode (no kernel frames) or in the kernel on
// its way from or back to user mode. Otherwise an interrupt preempted it
// and its switched-out stack passes through that interrupt's entry.
func checkRunning(t *testing.T, path string, pid int) {
	st := backtrace(t, path, pid)
	var fns []string
	for _, f := range st.Frames {
		fns = append(fns, fmt.Sprintf("%s+%#x", f.Function, f.Offset))
	}
	if st.Stop != "" || (!st.UserMode && len(fns) == 0) {
		t.Errorf("bt %d: %v, stop %q", pid, fns, st.Stop)
	}
	if !st.Task.Active && (len(fns) == 0 || !strings.HasPrefix(fns[len(fns)-1], "asm_")) {
		t.Errorf("the spinning shell %d is neither on a CPU nor preempted by an interrupt: %v", pid, fns)
	}
	t.Logf("spinning shell %d: on cpu %v (cpu %d), user mode %v, kernel frames %v", pid, st.Task.Active, st.Task.CPU, st.UserMode, fns)
}

func checkErrors(t *testing.T, path string) {
	// The first MiB of a real dump: headers and notes, memory cut off.
	truncated := filepath.Join(t.TempDir(), "truncated.elf")
	if out, err := exec.Command("head", "-c", "1048576", path).Output(); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(truncated, out, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"core", "/etc/hostname", "ps"}, "not a kernel dump"},
		{[]string{"core", truncated, "ps"}, "truncated dump"},
		{[]string{"core", path, "bt", "999999"}, "no task with pid 999999"},
		{[]string{"core", path, "bt"}, "no task has panic"}, // a dump of a running guest
		{[]string{"core", path, "sym", "no_such_symbol_xyz"}, "no such kernel symbol"},
		{[]string{"core", path, "rd", "0x10", "8"}, "not mapped"},
		{[]string{"core", path, "frobnicate"}, "unknown command"},
	} {
		out, err := exec.Command(filepath.Join(bin, "kinst"), tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("kinst %v: %v, %q; want an error containing %q", tc.args, err, out, tc.want)
		}
	}
}

// testPanic leaves the guest panicked, so TestCore must be the package's
// last test to use the guest: test files that need it sort before
// core_test.go (go test runs files in name order).
//
// testPanic crashes the guest with sysrq c (kernel.panic=0 keeps the
// panicking CPU in panic() rather than rebooting) and checks that the
// dump names the panic and unwinds the crashing task through the sysrq
// path from the CPU's registers.
func testPanic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gsh(t, ctx, "echo 0 > /proc/sys/kernel/panic")
	ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
	guest.Instance.Exec(ectx, []string{"sh", "-c", "echo c > /proc/sysrq-trigger"}, nil, nil)
	ecancel()
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(guest.SerialLog())
		if strings.Contains(string(b), "Kernel panic - not syncing") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no panic on the serial console:\n%s", livetest.Tail(string(b), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // let panic() finish stopping the other CPU
	path := dumpGuest(t, "panic.elf", "elf")
	var info struct {
		Panic string `json:"panic"`
		CPUs  []struct {
			CPU      int    `json:"cpu"`
			PID      int    `json:"pid"`
			Function string `json:"function"`
		} `json:"cpus"`
	}
	if err := json.Unmarshal(kinst(t, "core", path, "info", "--json"), &info); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.Panic, "sysrq triggered crash") {
		t.Errorf("info: panic %q, want the sysrq message", info.Panic)
	}
	var all struct {
		Stacks []stackJSON `json:"stacks"`
	}
	if err := json.Unmarshal(kinst(t, "core", path, "bt", "-a", "--json"), &all); err != nil {
		t.Fatal(err)
	}
	// The oracle: the call trace the panicking kernel printed on the
	// serial console, without its unreliable ("?") lines and the frame of
	// dump_stack itself. From panic's caller outwards the frames must be
	// equal to the byte; panic itself was interrupted elsewhere (it loops
	// in mdelay when kernel.panic is 0).
	serial, _ := os.ReadFile(guest.SerialLog())
	var want []string
	if _, trace, ok := strings.Cut(string(serial), "Call Trace:"); ok {
		trace, _, _ = strings.Cut(trace, "</TASK>")
		re := regexp.MustCompile(`\]  ([\w.]+\+0x[0-9a-f]+)/0x[0-9a-f]+\s*$`)
		for _, line := range strings.Split(trace, "\n") {
			if m := re.FindStringSubmatch(line); m != nil && !strings.HasPrefix(m[1], "dump_stack") {
				want = append(want, m[1])
			}
		}
	}
	if len(want) < 5 || !strings.HasPrefix(want[0], "panic+") {
		t.Fatalf("no call trace on the serial console: %q", want)
	}
	for _, st := range all.Stacks {
		var fns []string
		for _, f := range st.Frames {
			fns = append(fns, fmt.Sprintf("%s+%#x", f.Function, f.Offset))
		}
		at := -1
		for i, f := range fns {
			if strings.HasPrefix(f, "panic+") {
				at = i
			}
		}
		if at < 0 {
			continue
		}
		if !st.Task.Active {
			t.Errorf("the crashing task %d is not marked running", st.Task.PID)
		}
		if st.Stop != "" || strings.Join(fns[at+1:], " ") != strings.Join(want[1:], " ") {
			t.Errorf("crash stack %v (stop %q)\nconsole trace %v", fns, st.Stop, want)
		}
		t.Logf("panic: %q; cpu %d task %d (%s): %s", info.Panic, st.Task.CPU, st.Task.PID, st.Task.Comm, strings.Join(fns, " < "))
		// bt with no task, as crash's: the task that panicked, alone.
		var panicked struct {
			Stacks []stackJSON `json:"stacks"`
		}
		if err := json.Unmarshal(kinst(t, "core", path, "bt", "--json"), &panicked); err != nil {
			t.Fatal(err)
		}
		if len(panicked.Stacks) != 1 || panicked.Stacks[0].Task.Address != st.Task.Address {
			t.Errorf("bt with no task: %d stacks %+v; want the crashing task %s (pid %d) alone", len(panicked.Stacks), panicked.Stacks, st.Task.Address, st.Task.PID)
		}
		return
	}
	t.Fatalf("no stack in the panic dump passes through panic; info %+v", info)
}

// BenchmarkCorePSBtAll runs `kinst core DUMP ps` and `bt -a` end to end
// on a dump of the 1 GiB guest: the figure the issue bounds at 1 s of
// wall time. The guest is paused meanwhile so that its emulation does not
// compete for the CPUs; cpu-ms/op (user+system of both processes) is the
// figure that does not depend on what else the machine runs.
func BenchmarkCorePSBtAll(b *testing.B) {
	path := filepath.Join(tmp, "bench.elf")
	if _, err := os.Stat(path); err != nil {
		dumpGuest(b, "bench.elf", "elf")
	}
	if _, err := guest.QMP("stop", nil); err == nil {
		defer guest.QMP("cont", nil)
	}
	var cpu time.Duration
	for b.Loop() {
		for _, args := range [][]string{{"core", path, "ps"}, {"core", path, "bt", "-a"}} {
			cmd := exec.Command(filepath.Join(bin, "kinst"), args...)
			if err := cmd.Run(); err != nil {
				b.Fatalf("kinst %v: %v", args, err)
			}
			cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}
