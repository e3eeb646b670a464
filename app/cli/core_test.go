package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/internal/dumpgen"
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

// testKdump writes a kdump whose kernel image (mapped at
// 0xffffffff80200000, physical 0x400000) holds kallsyms, an empty printk
// ring and init_task alone on its task list; exclude leaves init_task's
// page out, as a filtered or cut-short dump would.
func testKdump(t *testing.T, exclude bool) string {
	const (
		mapBase = 0xffffffff80000000 + 0x200000
		root    = 0x400000
	)
	va := func(off uint64) uint64 { return mapBase + off }
	pages := map[uint64][]byte{}
	for p := uint64(0); p < 16; p++ {
		pages[root/4096+p] = make([]byte, 4096)
	}
	put := func(a uint64, b []byte) {
		for i, c := range b {
			pa := a - mapBase + root + uint64(i)
			pages[pa/4096][pa%4096] = c
		}
	}
	put64 := func(a, v uint64) { put(a, binary.LittleEndian.AppendUint64(nil, v)) }
	initTask, prb, ring, zeros := va(0x8000), va(0x80), va(0x100), va(0x3000)
	tables := dumpgen.Kallsyms([]dumpgen.KallsymsSymbol{
		{Addr: va(0), Type: 'T', Name: "_text"}, {Addr: initTask, Type: 'D', Name: "init_task"},
	}, va(0), va(0x1000), put)
	// The ring: no descriptors in use.
	put64(prb, ring)
	put64(ring+8, zeros)
	put64(ring+16, zeros)
	put64(ring+56, zeros)
	layout := "OFFSET(printk_ringbuffer.desc_ring)=0\nOFFSET(printk_ringbuffer.text_data_ring)=48\n" +
		"OFFSET(prb_desc_ring.count_bits)=0\nOFFSET(prb_desc_ring.descs)=8\nOFFSET(prb_desc_ring.infos)=16\n" +
		"OFFSET(prb_desc_ring.head_id)=24\nOFFSET(prb_desc_ring.tail_id)=32\nOFFSET(prb_desc.state_var)=0\n" +
		"OFFSET(prb_desc.text_blk_lpos)=8\nOFFSET(prb_data_blk_lpos.begin)=0\nOFFSET(prb_data_blk_lpos.next)=8\n" +
		"OFFSET(prb_data_ring.size_bits)=0\nOFFSET(prb_data_ring.data)=8\nOFFSET(printk_info.seq)=0\n" +
		"OFFSET(printk_info.ts_nsec)=8\nOFFSET(printk_info.text_len)=16\nSIZE(prb_desc)=24\nSIZE(printk_info)=88\n"
	// init_task: pid 0, "swapper/0", its tasks and thread lists empty.
	put(initTask+0x60, []byte("swapper/0\x00"))
	put64(initTask+0x20, initTask+0x20)
	put64(initTask+0x28, initTask+0x20)
	sig := initTask + 0x400
	put64(initTask+0x40, sig)
	put64(sig+0x10, initTask+0x48)
	put64(sig+0x18, initTask+0x48)
	put64(initTask+0x48, sig+0x10)
	put64(initTask+0x50, sig+0x10)
	g := &dumpgen.Kdump{MaxMapnr: 0x800, Release: "6.1.0-test", PhysBase: root - 0x200000, Pages: pages,
		VMCoreInfo: fmt.Sprintf("OSRELEASE=6.1.0-test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\nSYMBOL(prb)=%x\n", va(0), root-0x200000, prb) + layout + tables}
	if exclude {
		pfn := (initTask - mapBase + root) / 4096
		delete(pages, pfn)
		g.Excluded = []uint64{pfn}
	}
	b, err := g.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vmcore")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
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
		path := testKdump(t, tc.exclude)
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
			var inf api.CoreInfo
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
