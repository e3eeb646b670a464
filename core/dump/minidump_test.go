package dump

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/kinst/kinst/internal/dumpgen"
)

const (
	// Real v2/v3 dumps start the pmap at VM_MIN_KERNEL_ADDRESS
	// (0xfffffe0000000000), 8 MiB of PDEs; a higher base keeps the
	// fixtures small. Version 1 dumps started at KERNBASE.
	fbsdKernBase = 0xffffffff00000000
	fbsdDmapBase = 0xfffff80000000000
	fbsdDmapEnd  = 0xfffffc0000000000
	fbsdKernText = 0xffffffff80000000 // KERNBASE, where the kernel image sits
)

// fbsdPage is the content of the physical page at pa.
func fbsdPage(pa uint64) []byte {
	p := make([]byte, 4096)
	for i := 0; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], pa+uint64(i)^0x5a5a000000000000)
	}
	return p
}

// testMinidump describes a small machine: physical memory in two
// ranges with a hole, pages dumped in runs, the kernel image mapped with
// 4 KiB pages at KERNBASE and (v2, v3) one 2 MiB superpage.
func testMinidump(version int) *dumpgen.Minidump {
	kernBase := uint64(fbsdKernBase)
	if version == 1 {
		kernBase = fbsdKernText
	}
	m := &dumpgen.Minidump{Version: version, KernBase: kernBase, DmapBase: fbsdDmapBase, DmapEnd: fbsdDmapEnd,
		Msgbuf: []byte("<6>Copyright (c) 1992-2024 The FreeBSD Project.\n<0>panic: kinst test\n"),
		Pages:  map[uint64][]byte{}, MaxPhys: 0x800000}
	if version == 3 {
		m.DumpAvail = [][2]uint64{{0x1000, 0x200000}, {0x400000, 0x800000}}
	}
	add := func(pa uint64) { m.Pages[pa] = fbsdPage(pa) }
	for pa := uint64(0x1000); pa < 0x20000; pa += 4096 {
		add(pa)
	}
	for pa := uint64(0x400000); pa < 0x600000; pa += 4096 { // the superpage's frames
		add(pa)
	}
	add(0x7ff000)
	// Kernel text: VA page i → PA 0x10000 + i pages (backwards halves to
	// make the mapping non-trivial).
	for i := uint64(0); i < 8; i++ {
		m.Maps = append(m.Maps, dumpgen.Mapping{VA: fbsdKernText + i*4096, PA: 0x10000 + (7-i)*4096})
	}
	// A mapped page that was not dumped.
	m.Maps = append(m.Maps, dumpgen.Mapping{VA: fbsdKernText + 8*4096, PA: 0x300000})
	if version >= 2 {
		m.Maps = append(m.Maps, dumpgen.Mapping{VA: fbsdKernText + 0x400000, PA: 0x400000, Super: true})
		m.PageTableBase = 0x1f0000
	}
	return m
}

func TestMinidump(t *testing.T) {
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			gen := testMinidump(version)
			b, err := gen.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			d, err := Open(writeTemp(t, b))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.Format() != "freebsd-minidump" || d.VMCoreInfo() != "" || len(d.CPUs()) != 0 {
				t.Errorf("format %q vmcoreinfo %q cpus %v", d.Format(), d.VMCoreInfo(), d.CPUs())
			}
			mb, ok := d.(MessageBufferReader)
			if !ok || !bytes.Equal(mb.MessageBuffer(), gen.Msgbuf) {
				t.Errorf("message buffer differs")
			}
			vr, ok := d.(VirtReader)
			if !ok {
				t.Fatal("a minidump must read virtual addresses")
			}
			// Every page: dumped ones read back, the others are absent,
			// through ReadPhys and through the direct map.
			buf := make([]byte, 4096)
			for pa := uint64(0); pa < 0x800000; pa += 4096 {
				want, dumped := gen.Pages[pa]
				if version >= 2 && pa == 0x1f0000 {
					dumped = true // the generator's page-table page
					want = nil
				}
				for _, read := range []func() (int, error){
					func() (int, error) { return d.ReadPhys(buf, pa) },
					func() (int, error) { return vr.ReadVirt(buf, fbsdDmapBase+pa) },
				} {
					n, err := read()
					if !dumped {
						if !errors.Is(err, ErrNotPresent) || n != 0 {
							t.Fatalf("page %#x not dumped: %d, %v", pa, n, err)
						}
						continue
					}
					if err != nil || n != 4096 || want != nil && !bytes.Equal(buf, want) {
						t.Fatalf("page %#x: %d, %v", pa, n, err)
					}
				}
			}
			// Kernel text through the pmap, across pages.
			text := make([]byte, 8*4096-100)
			if n, err := vr.ReadVirt(text, fbsdKernText+100); err != nil || n != len(text) {
				t.Fatalf("kernel text: %d, %v", n, err)
			}
			for i := uint64(0); i < 8; i++ {
				want := fbsdPage(0x10000 + (7-i)*4096)
				got := text[max(0, int(i*4096)-100):min(len(text), int((i+1)*4096)-100)]
				if i == 0 {
					want = want[100:]
				}
				if !bytes.Equal(got, want[:len(got)]) {
					t.Fatalf("kernel text page %d differs", i)
				}
			}
			var npe *NotPresentError
			if _, err := vr.ReadVirt(buf, fbsdKernText+8*4096); !errors.As(err, &npe) || !npe.Physical || npe.Addr != 0x300000 {
				t.Errorf("mapped but not dumped: %v", err)
			}
			for _, va := range []uint64{fbsdKernText + 9*4096, fbsdKernText + 0x10000000, 0x1000, fbsdDmapEnd} {
				if _, err := vr.ReadVirt(buf, va); !errors.As(err, &npe) || npe.Physical || npe.Addr != va {
					t.Errorf("unmapped VA %#x: %v", va, err)
				}
			}
			if version >= 2 {
				va := uint64(fbsdKernText + 0x400000 + 0x12345)
				if _, err := vr.ReadVirt(buf[:8], va); err != nil || !bytes.Equal(buf[:8], fbsdPage(0x412000)[0x345:0x34d]) {
					t.Errorf("superpage read: %v", err)
				}
			}
			want := []Range{{0x1000, 0x20000}, {0x400000, 0x600000}, {0x7ff000, 0x800000}}
			if version >= 2 {
				want = []Range{{0x1000, 0x20000}, {0x1f0000, 0x1f1000}, {0x400000, 0x600000}, {0x7ff000, 0x800000}}
			}
			if got := d.PhysRanges(); !reflect.DeepEqual(got, want) {
				t.Errorf("PhysRanges = %x, want %x", got, want)
			}
		})
	}
}

// TestMinidumpDumpAvail: in v3 the bitmap counts pages of the dump_avail
// ranges only, so a page after a hole has a smaller bit number than its
// frame number; reading it must not land on another page.
func TestMinidumpDumpAvail(t *testing.T) {
	gen := testMinidump(3)
	gen.DumpAvail = [][2]uint64{{0x1000, 0x30000}, {0x1f0000, 0x1f1000}, {0x400000, 0x600000}, {0x7ff000, 0x800000}}
	b, err := gen.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMinidump(bytes.NewReader(b), int64(len(b)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := m.bitID(0x7ff000); !ok || id != 0x2f+1+0x200 {
		t.Errorf("bitID(0x7ff000) = %#x, %v", id, ok)
	}
	if _, ok := m.bitID(0x300000); ok {
		t.Errorf("a page in a dump_avail hole has a bit")
	}
	buf := make([]byte, 4096)
	if _, err := m.ReadPhys(buf, 0x7ff000); err != nil || !bytes.Equal(buf, fbsdPage(0x7ff000)) {
		t.Errorf("page after the holes: %v", err)
	}
}

func TestMinidumpCorrupt(t *testing.T) {
	b, err := testMinidump(3).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	mod := func(f func(b []byte)) []byte { c := bytes.Clone(b); f(c); return c }
	for _, tc := range []struct {
		name   string
		file   []byte
		offset int64
	}{
		{"short-header", b[:40], 0},
		{"version-4", mod(func(c []byte) { le.PutUint32(c[24:], 4) }), 24},
		{"version-0", mod(func(c []byte) { le.PutUint32(c[24:], 0) }), 24},
		{"huge-msgbuf", mod(func(c []byte) { le.PutUint32(c[28:], 0xffffffff) }), 28},
		{"huge-bitmap", mod(func(c []byte) { le.PutUint32(c[32:], 0x7fffffff) }), 32},
		{"pmap-past-end", mod(func(c []byte) { le.PutUint32(c[36:], uint32(len(b))) }), -2},
		{"dmap-reversed", mod(func(c []byte) { le.PutUint64(c[56:], 1) }), 56},
		{"dump-avail-odd", mod(func(c []byte) { le.PutUint32(c[64:], 24) }), 64},
		{"dump-avail-reversed", mod(func(c []byte) { le.PutUint64(c[8192+16:], 0x900000) }), 8192 + 16},
		{"truncated-pages", b[:len(b)-4096], -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(writeTemp(t, tc.file))
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want a CorruptError", err)
			}
			if tc.offset != -2 && ce.Offset != tc.offset {
				t.Errorf("offset %#x, want %#x: %v", ce.Offset, tc.offset, err)
			}
			t.Log(err)
		})
	}
	// A PDE pointing at a page-table page that was not dumped.
	gen := testMinidump(2)
	bad, err := gen.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMinidump(bytes.NewReader(bad), int64(len(bad)), nil)
	if err != nil {
		t.Fatal(err)
	}
	m.pmap[(fbsdKernText-m.KernBase)/(2<<20)] = 0x300000 | 1
	if _, err := m.ReadVirt(make([]byte, 8), fbsdKernText); !errors.Is(err, ErrCorrupt) {
		t.Errorf("missing page-table page: %v", err)
	}
}

func FuzzMinidump(f *testing.F) {
	for v := 1; v <= 3; v++ {
		gen := testMinidump(v)
		// Fewer pages keep the seeds small.
		for pa := range gen.Pages {
			if pa >= 0x8000 && pa != 0x7ff000 {
				delete(gen.Pages, pa)
			}
		}
		b, err := gen.Bytes()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := newMinidump(bytes.NewReader(b), int64(len(b)), nil)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: unexpected error kind: %v", err)
			}
			return
		}
		exercise(t, m)
		buf := make([]byte, 64)
		for _, va := range []uint64{m.KernBase, m.KernBase + 0x1000, fbsdKernText, fbsdKernText + 0x400000, m.DmapBase + 0x1000} {
			if _, err := m.ReadVirt(buf, va); err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotPresent) {
				t.Fatalf("ReadVirt(%#x): unexpected error kind: %v", va, err)
			}
		}
	})
}
