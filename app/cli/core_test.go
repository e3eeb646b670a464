package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/internal/dumpgen"
	"github.com/kinst/kinst/kernel/dumpview"
	"github.com/kinst/kinst/output"
)

// TestCoreStackJSON: a stack without frames has "frames":[], never null,
// and its text says why once.
func TestCoreStackJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   core.Stack
		json string // a substring of the JSON
		text string // a line of the text, exactly once
	}{
		{"nil frames", core.Stack{Task: core.Task{PID: 9}, Stop: "switch frame at 0x10: not mapped"}, `"frames":[]`, "(switch frame at 0x10: not mapped)"},
		{"user mode", core.Stack{Task: core.Task{PID: 9, Active: true}, UserMode: true}, `"frames":[],"user_mode":true`, "(running in user mode: no kernel frames)"},
		{"frames", core.Stack{Task: core.Task{PID: 9}, Frames: []core.Frame{{AddrHex: "0x1", Function: "f"}}}, `"frames":[{"address":"0x1","function":"f","offset":0}]`, "#0  0x1 f"},
	} {
		var b bytes.Buffer
		if err := writeJSON(&b, coreStack(&tc.st)); err != nil {
			t.Fatal(err)
		}
		if compact := strings.Join(strings.Fields(b.String()), ""); !strings.Contains(compact, tc.json) {
			t.Errorf("%s: JSON %s, want %s in it", tc.name, compact, tc.json)
		}
		b.Reset()
		printStack(&b, &tc.st)
		if n := strings.Count(b.String(), tc.text); n != 1 {
			t.Errorf("%s: text has %q %d times:\n%s", tc.name, tc.text, n, b.String())
		}
	}
}

// TestCoreInfo: info names RAM and dumped memory apart, and a report
// with parts that could not be read lists them and fails.
func TestCoreInfo(t *testing.T) {
	btfPath := btftest.TaskFile(t)
	for _, tc := range []struct {
		name           string
		exclude        bool
		memory, dumped uint64
		errors         []string // prefixes of the errors listed, in order
	}{
		{"complete", false, 16 * 4096, 16 * 4096, nil},
		{"init_task excluded", true, 16 * 4096, 15 * 4096, []string{"tasks: list at 0xffffffff80208020: "}},
	} {
		path := dumpgen.LinuxKdump(t, tc.exclude)
		for _, asJSON := range []bool{true, false} {
			var b bytes.Buffer
			err := Core(CoreRequest{Dump: path, Command: "info", JSON: asJSON, Options: core.Options{BTF: btfPath}}, &b)
			if (err != nil) != (len(tc.errors) > 0) {
				t.Errorf("%s: error %v, want one: %v", tc.name, err, len(tc.errors) > 0)
			}
			if !asJSON {
				for _, e := range tc.errors {
					if n := strings.Count(b.String(), e); n != 1 {
						t.Errorf("%s: text has %q %d times:\n%s", tc.name, e, n, b.String())
					}
				}
				continue
			}
			var inf output.CoreInfo
			if err := json.Unmarshal(b.Bytes(), &inf); err != nil {
				t.Fatalf("%s: %v\n%s", tc.name, err, b.String())
			}
			if inf.MemoryBytes != tc.memory || inf.DumpedBytes != tc.dumped || len(inf.Errors) != len(tc.errors) {
				t.Errorf("%s: memory %d, dumped %d, errors %q; want %d, %d, %q", tc.name, inf.MemoryBytes, inf.DumpedBytes, inf.Errors, tc.memory, tc.dumped, tc.errors)
				continue
			}
			for i, e := range tc.errors {
				if !strings.HasPrefix(inf.Errors[i], e) || !strings.Contains(inf.Errors[i], "excluded") {
					t.Errorf("%s: error %q, want %q…excluded", tc.name, inf.Errors[i], e)
				}
			}
		}
	}
}

// A recursion is printed once, with the count of its copies, so the
// frames under it (the first fault) show; frame numbers stay true.
func TestPrintStackFoldsCycles(t *testing.T) {
	fr := func(name string, exc bool) core.Frame {
		return core.Frame{AddrHex: "0x" + name, Function: name, Exception: exc}
	}
	st := &core.Stack{Task: core.Task{PID: 7}}
	st.Frames = append(st.Frames, fr("top", false))
	for range 5 {
		st.Frames = append(st.Frames, fr("a", true), fr("b", false), fr("c", false))
	}
	st.Frames = append(st.Frames, fr("first_fault", true), fr("d", false), fr("d", false))
	var b strings.Builder
	printStack(&b, st)
	want := `PID: 7  TASK: 0x0  CPU: 0  COMMAND: ""  STATE:  (switched out)
 #0  0xtop top+0x0
 #1  0xa a+0x0  (interrupted)
 #2  0xb b+0x0
 #3  0xc c+0x0
     … #1–#3 repeated 4 more times (#4–#15)
 #16 0xfirst_fault first_fault+0x0  (interrupted)
 #17 0xd d+0x0
 #18 0xd d+0x0
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestCoreOfProcess: a user process's core (gdb's gcore of a sleep) is
// said to be one, naming the process, not a dump missing VMCOREINFO.
func TestCoreOfProcess(t *testing.T) {
	gcore, err := exec.LookPath("gcore")
	if err != nil {
		t.Skip("no gcore (gdb)")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	prefix := filepath.Join(t.TempDir(), "core")
	if out, err := exec.Command(gcore, "-o", prefix, strconv.Itoa(cmd.Process.Pid)).CombinedOutput(); err != nil {
		t.Skipf("gcore: %v\n%s", err, out)
	}
	path := fmt.Sprintf("%s.%d", prefix, cmd.Process.Pid)
	err = Core(CoreRequest{Dump: path, Command: "info"}, io.Discard)
	want := fmt.Sprintf("the core of a user process (pid %d, sleep", cmd.Process.Pid)
	if !errors.Is(err, dumpview.ErrNotKernel) || !strings.Contains(err.Error(), want) {
		t.Errorf("core info of a process's core: %v, want %q (dumpview.ErrNotKernel)", err, want)
	}
}

// TestCorePhysReadPartial: rd --phys across the end of what the dump
// holds prints the bytes it has, as crash's rd does, then fails on the
// page it lacks; --json prints nothing but the error.
func TestCorePhysReadPartial(t *testing.T) {
	path := dumpgen.LinuxKdump(t, false) // 16 pages of memory, all dumped
	d, err := dump.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	end := d.PhysRanges()[0].End // the first hole
	d.Close()
	at := fmt.Sprintf("%#x", end-16)
	btfPath := btftest.TaskFile(t)
	var b bytes.Buffer
	err = Core(CoreRequest{Dump: path, Command: "rd", Arg: at, Length: 32, Phys: true, Options: core.Options{BTF: btfPath}}, &b)
	if !errors.Is(err, dump.ErrNotPresent) || !strings.HasPrefix(b.String(), fmt.Sprintf("%016x:  ", end-16)) || strings.Count(b.String(), "\n") != 1 {
		t.Errorf("rd --phys %s 32: %v, printed %q; want the 16 bytes before %#x, then not present", at, err, b.String(), end)
	}
	b.Reset()
	err = Core(CoreRequest{Dump: path, Command: "rd", Arg: at, Length: 32, Phys: true, JSON: true, Options: core.Options{BTF: btfPath}}, &b)
	if !errors.Is(err, dump.ErrNotPresent) || b.Len() != 0 {
		t.Errorf("rd --phys --json: %v, printed %q", err, b.String())
	}
}
