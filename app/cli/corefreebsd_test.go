package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/internal/dumpgen"
	"github.com/kinst/kinst/output"
)

const (
	bsdKernBase = 0xffffffff80000000 // KERNBASE; v1's pmap starts here
	bsdDmapBase = 0xfffff80000000000
	bsdDmapEnd  = 0xfffffc0000000000
	bsdMsgTotal = 3 * 4096 // kern.msgbufsize
)

// bsdPage is the content of physical page pa: each 8 bytes hold their
// own physical address, so any read names where it came from.
func bsdPage(pa uint64) []byte {
	p := make([]byte, 4096)
	for i := 0; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], pa+uint64(i)|0xbd<<56)
	}
	return p
}

// bsdPhys is the content bsdPage gives physical memory at [pa, pa+n).
func bsdPhys(pa uint64, n int) []byte {
	var b []byte
	for page := pa &^ 4095; page < pa+uint64(n); page += 4096 {
		b = append(b, bsdPage(page)...)
	}
	off := pa % 4096
	return b[off : off+uint64(n)]
}

// bsdLog is what the kernel printed: more than the ring holds.
func bsdLog() []byte {
	var b bytes.Buffer
	b.WriteString("---<<BOOT>>---\n")
	for i := range 500 {
		fmt.Fprintf(&b, "<6>da%d: <QEMU HARDDISK 2.5+> Fixed Direct Access SPC-3 SCSI device\n", i)
	}
	b.WriteString("Fatal trap 12: page fault while in kernel mode\npanic: page fault\ncpuid = 1\n")
	return b.Bytes()
}

// writeBSDMinidump writes a small FreeBSD machine's minidump: 8 MiB of
// RAM with a hole, the kernel text mapped page by page in reverse order
// (so a read across a page boundary must translate twice), one 2 MiB
// superpage (v2, v3), and a wrapped message buffer.
func writeBSDMinidump(t *testing.T, version int) string {
	t.Helper()
	ring, hdr := dumpgen.MsgbufRing(bsdMsgTotal, bsdLog(), bsdDmapBase+0x7fd000)
	m := &dumpgen.Minidump{Version: version, KernBase: bsdKernBase, DmapBase: bsdDmapBase, DmapEnd: bsdDmapEnd,
		Msgbuf: ring, MsgbufTrailer: hdr, Pages: map[uint64][]byte{}, MaxPhys: 0x800000, PageTableBase: 0x1f0000}
	if version == 3 {
		m.DumpAvail = [][2]uint64{{0x1000, 0x300000}, {0x400000, 0x800000}}
	}
	for pa := uint64(0x10000); pa < 0x20000; pa += 4096 {
		m.Pages[pa] = bsdPage(pa)
	}
	for pa := uint64(0x600000); pa < 0x800000; pa += 4096 {
		m.Pages[pa] = bsdPage(pa)
	}
	for i := uint64(0); i < 16; i++ {
		m.Maps = append(m.Maps, dumpgen.Mapping{VA: bsdKernBase + i*4096, PA: 0x10000 + (15-i)*4096})
	}
	if version >= 2 {
		m.Maps = append(m.Maps, dumpgen.Mapping{VA: bsdKernBase + 0x200000, PA: 0x600000, Super: true})
	}
	b, err := m.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "vmcore.0")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func runCore(t *testing.T, req CoreRequest) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Core(req, &out)
	return out.String(), err
}

func TestCoreFreeBSDInfo(t *testing.T) {
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			p := writeBSDMinidump(t, version)
			out, err := runCore(t, CoreRequest{Dump: p, Command: "info", JSON: true})
			if err != nil {
				t.Fatal(err)
			}
			var got output.CoreFreeBSDInfo
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v in %s", err, out)
			}
			// Expected from the fixture's description.
			want := output.CoreFreeBSDInfo{Format: "freebsd-minidump", Version: version,
				KernBase: "0xffffffff80000000", DmapBase: "0xfffff80000000000", DmapEnd: "0xfffffc0000000000",
				MemoryBytes: 0x800000, BitmapPages: 0x800, DumpedPages: 16 + 512,
				PmapEntries: 16, PmapEntry: "pte", MsgbufBytes: bsdMsgTotal - dumpgen.MsgbufHdrSize, Panic: "page fault"}
			if version >= 2 {
				want.PmapEntries, want.PmapEntry = 512, "pde" // a page of PDEs
				want.DumpedPages++                            // the page-table page of the 4 KiB mappings
			}
			if version == 3 {
				want.MemoryBytes = 0x2ff000 + 0x400000
				want.BitmapPages = want.MemoryBytes / 4096
				want.BitmapPages = (want.BitmapPages + 63) &^ 63 // the bitmap is whole words
				want.DumpAvail = []output.CoreRange{{Start: "0x1000", End: "0x300000"}, {Start: "0x400000", End: "0x800000"}}
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
				t.Errorf("info:\n got %+v\nwant %+v", got, want)
			}
			text, err := runCore(t, CoreRequest{Dump: p, Command: "info"})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{fmt.Sprintf("freebsd-minidump version %d", version), "panic:          page fault", "[0xfffff80000000000, 0xfffffc0000000000)"} {
				if !strings.Contains(text, s) {
					t.Errorf("info text lacks %q:\n%s", s, text)
				}
			}
		})
	}
}

func TestCoreFreeBSDLog(t *testing.T) {
	// The ring keeps the last msg_size bytes the kernel wrote.
	stream := bsdLog()
	tail := string(stream[len(stream)-(bsdMsgTotal-dumpgen.MsgbufHdrSize):])
	var want []string
	for _, l := range strings.Split(strings.TrimSuffix(tail, "\n"), "\n") {
		want = append(want, strings.TrimPrefix(l, "<6>"))
	}
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			p := writeBSDMinidump(t, version)
			out, err := runCore(t, CoreRequest{Dump: p, Command: "log"})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Split(strings.TrimSuffix(out, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("log: %d lines, want %d\nlast: %q", len(got), len(want), got[max(0, len(got)-3):])
			}
			out, err = runCore(t, CoreRequest{Dump: p, Command: "log", JSON: true})
			if err != nil {
				t.Fatal(err)
			}
			var msgs output.CoreFreeBSDMessages
			if err := json.Unmarshal([]byte(out), &msgs); err != nil {
				t.Fatal(err)
			}
			if !msgs.Ordered || msgs.WriteSeq != uint32(len(stream)) || len(msgs.Lines) != len(want) {
				t.Fatalf("log --json: ordered %v write_seq %d (want %d) lines %d (want %d)", msgs.Ordered, msgs.WriteSeq, len(stream), len(msgs.Lines), len(want))
			}
			if l := msgs.Lines[len(msgs.Lines)-4]; l.Priority != 6 || !strings.HasPrefix(l.Text, "da499: ") {
				t.Errorf("last disk line %+v", l)
			}
		})
	}
}

func TestCoreFreeBSDRead(t *testing.T) {
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			p := writeBSDMinidump(t, version)
			type read struct {
				addr string
				n    int
				phys bool
				want []byte
			}
			reads := []read{
				// Kernel text page i is physical page 0x10000+(15-i)*4096:
				// a read across pages 0 and 1 joins two distant frames.
				{"0xffffffff80000ff8", 16, false, append(bsdPhys(0x1fff8, 8), bsdPhys(0x1e000, 8)...)},
				{"0xffffffff80003010", 64, false, bsdPhys(0x1c010, 64)},
				{"0xfffff80000700020", 32, false, bsdPhys(0x700020, 32)}, // direct map
				{"0x6ffff0", 32, true, bsdPhys(0x6ffff0, 32)},
			}
			if version >= 2 {
				reads = append(reads, read{"0xffffffff80345678", 24, false, bsdPhys(0x745678, 24)}) // superpage
			}
			for _, r := range reads {
				out, err := runCore(t, CoreRequest{Dump: p, Command: "rd", Arg: r.addr, Length: r.n, Phys: r.phys, JSON: true})
				if err != nil {
					t.Errorf("rd %s: %v", r.addr, err)
					continue
				}
				var m output.CoreMemory
				if err := json.Unmarshal([]byte(out), &m); err != nil {
					t.Fatal(err)
				}
				if m.Bytes != hex.EncodeToString(r.want) || m.Physical != r.phys || m.Address != r.addr {
					t.Errorf("rd %s %d (phys %v) = %+v, want %x", r.addr, r.n, r.phys, m, r.want)
				}
			}
			out, err := runCore(t, CoreRequest{Dump: p, Command: "rd", Arg: "0xffffffff80003010", Length: 16})
			if err != nil {
				t.Fatal(err)
			}
			if w := "ffffffff80003010:  10 c0 01 00 00 00 00 bd  18 c0 01 00 00 00 00 bd  "; !strings.HasPrefix(out, w) {
				t.Errorf("rd text = %q, want it to start %q", out, w)
			}
		})
	}
}

func TestCoreFreeBSDErrors(t *testing.T) {
	p := writeBSDMinidump(t, 3)
	for _, tc := range []struct {
		req  CoreRequest
		is   error  // the error matches this, or
		text string // contains this
	}{
		{CoreRequest{Command: "ps"}, core.ErrNeedsFreeBSDKernel, ""},
		{CoreRequest{Command: "bt", Which: 1}, core.ErrNeedsFreeBSDKernel, ""},
		{CoreRequest{Command: "bt", All: true, JSON: true}, core.ErrNeedsFreeBSDKernel, ""},
		{CoreRequest{Command: "sym", Arg: "panic"}, core.ErrNeedsFreeBSDKernel, ""},
		{CoreRequest{Command: "dis", Arg: "vpanic"}, core.ErrNeedsFreeBSDKernel, ""},
		{CoreRequest{Command: "rd", Arg: "msgbufp", Length: 8}, core.ErrNeedsFreeBSDKernel, ""},
		{CoreRequest{Command: "rd", Arg: "0xfffff80000300000", Length: 8}, dump.ErrNotPresent, ""},  // the dump_avail hole
		{CoreRequest{Command: "rd", Arg: "0xffffffff80010000", Length: 8}, dump.ErrNotPresent, ""},  // unmapped
		{CoreRequest{Command: "rd", Arg: "0x20000", Length: 8, Phys: true}, dump.ErrNotPresent, ""}, // not dumped
		{CoreRequest{Command: "rd", Arg: "0x1000", Length: 0}, nil, "length 0"},
		{CoreRequest{Command: "ps", Options: core.Options{Vmlinux: "vmlinux"}}, nil, "Linux kernel files"},
	} {
		tc.req.Dump = p
		out, err := runCore(t, tc.req)
		switch {
		case err == nil:
			t.Errorf("%+v: no error (output %q)", tc.req, out)
		case tc.is != nil && !errors.Is(err, tc.is):
			t.Errorf("%+v: %v, want %v", tc.req, err, tc.is)
		case tc.text != "" && !strings.Contains(err.Error(), tc.text):
			t.Errorf("%+v: %v, want it to say %q", tc.req, err, tc.text)
		case out != "":
			t.Errorf("%+v: printed %q before failing", tc.req, out)
		}
	}
	if _, err := runCore(t, CoreRequest{Dump: p, Command: "ps"}); err == nil || !strings.Contains(err.Error(), "ps") || !strings.Contains(err.Error(), "info, log and rd work") {
		t.Errorf("ps refusal %q should name the command and what works", err)
	}

	// A truncated minidump: a clear error, nothing printed.
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, b[:len(b)-4096], 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCore(t, CoreRequest{Dump: short, Command: "info"})
	if !errors.Is(err, dump.ErrCorrupt) || !strings.Contains(err.Error(), "freebsd-minidump") || out != "" {
		t.Errorf("truncated minidump: %v (output %q)", err, out)
	}
}
