package offcpu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/kinst/kinst/unwind/folded"
)

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		in    string
		comm  string
		state byte
		flags uint64
	}{
		{"9728 (sleep) S 9726 9726 6597 0 -1 4194304 127 0 1 0", "sleep", 'S', 4194304},
		{"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0", "kthreadd", 'S', 2129984},
		{"77 (a) b (c)) D 1 1 1 0 -1 64 0", "a) b (c)", 'D', 64},
	} {
		got, err := parseStat([]byte(tc.in))
		if err != nil || string(got.comm) != tc.comm || got.state != tc.state || got.flags != tc.flags {
			t.Errorf("parseStat(%q) = %q %c %d %v", tc.in, got.comm, got.state, got.flags, err)
		}
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 zz 7"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestParseSchedstat(t *testing.T) {
	if n, err := parseSchedstat([]byte("7053287 343782200 4\n")); n != 4 || err != nil {
		t.Errorf("got %d %v", n, err)
	}
	if _, err := parseSchedstat([]byte("garbage")); err == nil {
		t.Error("no error for garbage")
	}
}

func TestKernelFrames(t *testing.T) {
	in := "[<0>] anon_pipe_read+0x393/0x440\n[<0>] vfs_read+0x397/0x3d0\n[<0>] my_fn+0x10/0x20 [mymod]\n[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e\n"
	want := []string{"anon_pipe_read", "vfs_read", "my_fn", "entry_SYSCALL_64_after_hwframe"}
	if got := kernelFrames([]byte(in)); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestReadDirIDs lists a directory of numeric and other names, large
// enough for many getdents calls through a small buffer.
func TestReadDirIDs(t *testing.T) {
	dir := t.TempDir()
	var want []int
	for i := 1; i <= 3000; i += 7 {
		want = append(want, i)
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"self", "12a", "a12", "-3"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := readDirIDs(dir, make([]byte, 256), nil)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, want) {
		t.Errorf("readDirIDs = %v, want %v", ids, want)
	}
	if _, err := readDirIDs(filepath.Join(dir, "missing"), make([]byte, 256), nil); err == nil {
		t.Error("no error for a missing directory")
	}
}

func TestParseStatesAndGroup(t *testing.T) {
	s, err := ParseStates("S,D")
	if err != nil || !s.Has('S') || !s.Has('D') || s.Has('R') {
		t.Errorf("ParseStates(S,D) = %q %v", s, err)
	}
	if _, err := ParseStates("SQ"); err == nil {
		t.Error("ParseStates(SQ): no error")
	}
	if !States("").Has('T') {
		t.Error("the empty set must hold every state")
	}
	if _, err := ParseGroup("nope"); err == nil {
		t.Error("ParseGroup(nope): no error")
	}
	g, _ := ParseGroup("tid")
	if l, pid, tid := g.label("proc", "thr", 10, 11); l != "thr-11" || pid != 10 || tid != 11 {
		t.Errorf("label = %s %d %d", l, pid, tid)
	}
}

var testProfile = &Profile{Mode: "sample", Start: time.Unix(1700000000, 0), Duration: 2 * time.Second, Period: 10 * time.Millisecond,
	Stacks: []Stack{
		{Group: "piper", State: "S", Wchan: "pipe_read", Kernel: []string{"pipe_read", "vfs_read"}, User: []string{"__read", "read_pipe", "main"}, Samples: 30, OffCPU: 300 * time.Millisecond},
		{Group: "piper", State: "S", Wchan: "pipe_read", Kernel: []string{"pipe_read", "vfs_read"}, User: []string{"__read", "other", "main"}, Samples: 10, OffCPU: 100 * time.Millisecond},
		{Group: "disk", State: "D", PID: 7, Kernel: []string{"io_schedule"}, Samples: 5, OffCPU: 50 * time.Millisecond},
	}}

func TestFolded(t *testing.T) {
	for _, tc := range []struct {
		o    FoldOptions
		want string
	}{
		{FoldOptions{}, "disk;io_schedule_[k] 5\npiper;main;other;__read;vfs_read_[k];pipe_read_[k] 10\npiper;main;read_pipe;__read;vfs_read_[k];pipe_read_[k] 30\n"},
		{FoldOptions{KernelOnly: true}, "disk;io_schedule_[k] 5\npiper;vfs_read_[k];pipe_read_[k] 40\n"},
		{FoldOptions{UserOnly: true, State: true}, "disk;[D] 5\npiper;[S];main;other;__read 10\npiper;[S];main;read_pipe;__read 30\n"},
		{FoldOptions{Delimiter: true}, "disk;-;io_schedule_[k] 5\npiper;main;other;__read;-;vfs_read_[k];pipe_read_[k] 10\npiper;main;read_pipe;__read;-;vfs_read_[k];pipe_read_[k] 30\n"},
	} {
		var buf bytes.Buffer
		if err := writeFolded(&buf, testProfile, tc.o); err != nil {
			t.Fatal(err)
		}
		if buf.String() != tc.want {
			t.Errorf("%+v:\n%s\nwant\n%s", tc.o, buf.String(), tc.want)
		}
	}
	trace := *testProfile
	trace.Mode = "trace"
	if v := trace.Value(&trace.Stacks[0]); v != 300000 {
		t.Errorf("trace value %d, want 300000 us", v)
	}
}

func TestPprofRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := testProfile.WritePprof(&buf, FoldOptions{}); err != nil {
		t.Fatal(err)
	}
	pp, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(pp.Sample) != 3 || pp.Period != int64(10*time.Millisecond) || pp.DefaultSampleType != "off_cpu" {
		t.Fatalf("parsed %d samples, period %d, default %q", len(pp.Sample), pp.Period, pp.DefaultSampleType)
	}
	s := pp.Sample[0]
	var names []string
	for _, l := range s.Location {
		names = append(names, l.Line[0].Function.Name)
	}
	if want := "pipe_read vfs_read __read read_pipe main piper"; strings.Join(names, " ") != want {
		t.Errorf("locations %v, want %s", names, want)
	}
	if s.Value[0] != 30 || s.Value[1] != int64(300*time.Millisecond) || s.Label["state"][0] != "S" || s.Label["wchan"][0] != "pipe_read" {
		t.Errorf("sample %+v labels %v", s.Value, s.Label)
	}
	if pp.Sample[2].NumLabel["pid"][0] != 7 {
		t.Errorf("pid label %v", pp.Sample[2].NumLabel)
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, o := range []Options{{KernelOnly: true, UserOnly: true}, {PID: -3}} {
		if _, err := NewSampler(o, time.Second); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if _, err := NewSampler(Options{}, 0); err == nil {
		t.Error("zero period: no error")
	}
	if _, err := NewSampler(Options{PID: 1 << 30}, time.Second); !errors.Is(err, ErrNoSuchThread) {
		t.Errorf("missing pid: %v, want ErrNoSuchThread", err)
	}
}

func writeFolded(w *bytes.Buffer, p *Profile, o FoldOptions) error {
	return folded.Write(w, p.Folded(o).Stacks())
}
