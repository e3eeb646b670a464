package dump

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
)

// kseg is one kcore PT_LOAD: virtual and physical address (^0: none),
// and its bytes at file offset off.
type kseg struct {
	vaddr, paddr, off uint64
	data              []byte
}

// buildKcore lays out a core as fs/proc/kcore.c does: the ELF header,
// a PT_NOTE, then PT_LOADs whose bytes sit at their own file offsets.
func buildKcore(notes []byte, segs []kseg) []byte {
	le := binary.LittleEndian
	n := 1 + len(segs)
	noteOff := uint64(ehdrSize + phdrSize*n)
	size := noteOff + uint64(len(notes))
	for _, s := range segs {
		size = max(size, s.off+uint64(len(s.data)))
	}
	f := make([]byte, size)
	copy(f, elfMagic)
	f[4], f[5], f[6] = 2, 1, 1
	le.PutUint16(f[16:], 4)
	le.PutUint16(f[18:], 62)
	le.PutUint64(f[32:], ehdrSize)
	le.PutUint16(f[52:], ehdrSize)
	le.PutUint16(f[54:], phdrSize)
	le.PutUint16(f[56:], uint16(n))
	ph := f[ehdrSize:]
	le.PutUint32(ph, ptNote)
	le.PutUint64(ph[8:], noteOff)
	le.PutUint64(ph[32:], uint64(len(notes)))
	copy(f[noteOff:], notes)
	for i, s := range segs {
		p := ph[(i+1)*phdrSize:]
		le.PutUint32(p, ptLoad)
		le.PutUint32(p[4:], 7)
		le.PutUint64(p[8:], s.off)
		le.PutUint64(p[16:], s.vaddr)
		le.PutUint64(p[24:], s.paddr)
		le.PutUint64(p[32:], uint64(len(s.data)))
		le.PutUint64(p[40:], uint64(len(s.data)))
		copy(f[s.off:], s.data)
	}
	return f
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// efaultAt is a kcore whose bytes from bad on fail as a page the kernel
// will not copy does.
type efaultAt struct {
	b   []byte
	bad int64
}

func (r efaultAt) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > r.bad {
		n := max(0, int(r.bad-off))
		copy(p, r.b[off:off+int64(n)])
		return n, syscall.EFAULT
	}
	return copy(p, r.b[off:]), nil
}

func TestKcore(t *testing.T) {
	vmci := note("VMCOREINFO", 0, []byte("OSRELEASE=6.1.0-test\nKERNELOFFSET=1e000000\n"))
	notes := append(append(note("CORE", ntPRStatus, prstatus(0, 0, 0)), note("CORE", 3, make([]byte, 136))...), vmci...)
	ram := kseg{vaddr: 0xffff888000100000, paddr: 0x100000, off: 0x1000, data: fill(0x3000, 0xaa)}
	ram2 := kseg{vaddr: 0xffff888000200000, paddr: 0x200000, off: 0x4000, data: fill(0x1000, 0xbb)}
	text := kseg{vaddr: 0xffffffff9f000000, paddr: 0x101000, off: 0x5000, data: fill(0x1000, 0xaa)}
	vmalloc := kseg{vaddr: 0xffffc90000000000, paddr: noPaddr, off: 0x6000, data: fill(0x1000, 0xcc)}
	img := buildKcore(notes, []kseg{vmalloc, ram, text, ram2})

	if !probeKcore(img[:probeLen]) || probeELF(img[:probeLen]) {
		t.Fatalf("probe: kcore %v, elf %v; want kcore only", probeKcore(img[:probeLen]), probeELF(img[:probeLen]))
	}
	vmcore := buildCore(note("CORE", ntPRStatus, prstatus(1, 0, 0)), []seg{{paddr: 0, data: make([]byte, 4096)}})
	if probeKcore(vmcore) || !probeELF(vmcore) {
		t.Fatalf("a vmcore probes as kcore")
	}

	k, err := OpenKcore(bytes.NewReader(img), nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.VMCoreInfo(); got != "OSRELEASE=6.1.0-test\nKERNELOFFSET=1e000000\n" {
		t.Errorf("VMCOREINFO %q", got)
	}
	if len(k.CPUs()) != 4 || k.CPUs()[3].Index != 3 || k.CPUs()[1].Regs.RIP != 0 || !IsLive(k) || k.Format() != "kcore" {
		t.Errorf("CPUs %+v live %v format %s", k.CPUs(), IsLive(k), k.Format())
	}
	// The text segment lies inside the first RAM range: one range each.
	wantR := []Range{{0x100000, 0x103000}, {0x200000, 0x201000}}
	if got := k.PhysRanges(); len(got) != len(wantR) || got[0] != wantR[0] || got[1] != wantR[1] {
		t.Errorf("ranges %x, want %x", got, wantR)
	}
	if s := k.Segments(); len(s) != 4 || s[0].Vaddr != ram.vaddr || s[2].Paddr != noPaddr || s[3].Vaddr != text.vaddr {
		t.Errorf("segments %+v", s)
	}
	for _, tc := range []struct {
		name string
		addr uint64
		n    int
		want []byte
		err  error
	}{
		{"ram", 0x100ff0, 0x20, fill(0x20, 0xaa), nil},
		{"ram end", 0x102ff8, 8, fill(8, 0xaa), nil},
		{"hole", 0x103000, 8, nil, ErrNotPresent},
		{"across the hole", 0x102ff8, 16, nil, ErrNotPresent},
		{"second range", 0x200800, 16, fill(16, 0xbb), nil},
		{"below", 0xff000, 8, nil, ErrNotPresent},
		{"vmalloc is not physical", 0xffffffffffff0000, 8, nil, ErrNotPresent},
	} {
		b := make([]byte, tc.n)
		_, err := k.ReadPhys(b, tc.addr)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || !bytes.Equal(b, tc.want) {
			t.Errorf("%s: %x, %v", tc.name, b, err)
		}
	}

	// A page the kernel will not copy is an error naming its address.
	kf, err := OpenKcore(efaultAt{img, 0x4800}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 0x100)
	if _, err := kf.ReadPhys(b, 0x200780); !errors.Is(err, syscall.EFAULT) || !bytes.Contains([]byte(err.Error()), []byte("0x200800")) {
		t.Errorf("EFAULT read: %v", err)
	}
}

func TestKcoreBad(t *testing.T) {
	vmci := note("VMCOREINFO", 0, []byte("OSRELEASE=x\n"))
	for _, tc := range []struct {
		name string
		img  []byte
	}{
		{"no physical segment", buildKcore(vmci, []kseg{{vaddr: 0xffffc90000000000, paddr: noPaddr, off: 0x1000, data: fill(16, 1)}})},
		{"truncated header", buildKcore(vmci, nil)[:40]},
		{"not x86-64", func() []byte {
			b := buildKcore(vmci, []kseg{{vaddr: 1, paddr: 0, off: 0x1000, data: fill(16, 1)}})
			b[18] = 3
			return b
		}()},
		{"note past the end", func() []byte {
			b := buildKcore(vmci, []kseg{{vaddr: 1, paddr: 0, off: 0x1000, data: fill(16, 1)}})
			binary.LittleEndian.PutUint64(b[ehdrSize+32:], 1<<40)
			return b
		}()},
	} {
		if _, err := OpenKcore(bytes.NewReader(tc.img), nil, 1); err == nil {
			t.Errorf("%s: opened", tc.name)
		}
	}
}

func TestCountCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0\n", 1, true},
		{"0-1\n", 2, true},
		{"0-3,8-9", 10, true},
		{"0,2,4", 5, true},
		{"", 0, false},
		{"3-1", 0, false},
		{"x", 0, false},
		{"0-99999", 0, false},
	} {
		got, ok := countCPUList(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestKcorePath: Open sends /proc/kcore to the kcore reader whatever its
// probe says, and explains a refusal to read it.
func TestKcorePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{{"/proc/kcore", true}, {"/proc//kcore", true}, {"/proc/kcore/", true}, {"/tmp/kcore", false}} {
		if got := isKcorePath(tc.path); got != tc.want {
			t.Errorf("%s: %v", tc.path, got)
		}
	}
	err := kcoreErr(&os.PathError{Op: "open", Path: KcorePath, Err: os.ErrPermission})
	if !errors.Is(err, os.ErrPermission) || !bytes.Contains([]byte(err.Error()), []byte("root")) {
		t.Errorf("permission error: %v", err)
	}
	var _ io.ReaderAt = efaultAt{}
}

// FuzzKcore: no header makes OpenKcore or ReadPhys panic or allocate
// without bound; what opens reads within its ranges or says why not.
func FuzzKcore(f *testing.F) {
	vmci := note("VMCOREINFO", 0, []byte("OSRELEASE=x\n"))
	f.Add(buildKcore(vmci, []kseg{
		{vaddr: 0xffff888000100000, paddr: 0x100000, off: 0x1000, data: fill(0x2000, 1)},
		{vaddr: 0xffffc90000000000, paddr: noPaddr, off: 0x3000, data: fill(0x1000, 2)},
	}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<20 {
			return
		}
		k, err := OpenKcore(bytes.NewReader(b), nil, 2)
		if err != nil {
			return
		}
		buf := make([]byte, 64)
		for _, r := range k.PhysRanges() {
			if r.End <= r.Start {
				t.Fatalf("range %x", r)
			}
			k.ReadPhys(buf, r.Start)
			k.ReadPhys(buf, r.End-1)
		}
	})
}
