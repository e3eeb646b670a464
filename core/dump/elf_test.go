package dump

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// note encodes one ELF note.
func note(name string, typ uint32, desc []byte) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	binary.Write(&b, le, uint32(len(name)+1))
	binary.Write(&b, le, uint32(len(desc)))
	binary.Write(&b, le, typ)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(desc)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}

func prstatus(pid int32, rip, rsp uint64) []byte {
	d := make([]byte, prstatusSize)
	binary.LittleEndian.PutUint32(d[prstatusPID:], uint32(pid))
	binary.LittleEndian.PutUint64(d[prstatusRegs+16*8:], rip)
	binary.LittleEndian.PutUint64(d[prstatusRegs+19*8:], rsp)
	binary.LittleEndian.PutUint64(d[prstatusRegs+4*8:], 0xbbbb) // rbp
	return d
}

func qemuState(cr3 uint64) []byte {
	d := make([]byte, 440)
	binary.LittleEndian.PutUint32(d, 1)
	binary.LittleEndian.PutUint32(d[4:], 440)
	binary.LittleEndian.PutUint64(d[392+3*8:], cr3)
	return d
}

type seg struct {
	paddr  uint64
	data   []byte
	memsz  uint64 // 0: len(data)
	ptType uint32
}

// buildCore writes a little ELF64 x86-64 core: a PT_NOTE of notes, then
// the segments in order.
func buildCore(notes []byte, segs []seg) []byte {
	le := binary.LittleEndian
	all := append([]seg{{data: notes, ptType: ptNote}}, segs...)
	off := uint64(ehdrSize + phdrSize*len(all))
	var hdr, body bytes.Buffer
	eh := make([]byte, ehdrSize)
	copy(eh, elfMagic)
	eh[4], eh[5], eh[6] = 2, 1, 1
	le.PutUint16(eh[16:], 4)
	le.PutUint16(eh[18:], 62)
	le.PutUint32(eh[20:], 1)
	le.PutUint64(eh[32:], ehdrSize)
	le.PutUint16(eh[52:], ehdrSize)
	le.PutUint16(eh[54:], phdrSize)
	le.PutUint16(eh[56:], uint16(len(all)))
	hdr.Write(eh)
	for _, s := range all {
		t := s.ptType
		if t == 0 {
			t = ptLoad
		}
		mem := s.memsz
		if mem == 0 {
			mem = uint64(len(s.data))
		}
		p := make([]byte, phdrSize)
		le.PutUint32(p, t)
		le.PutUint64(p[8:], off+uint64(body.Len()))
		le.PutUint64(p[16:], s.paddr)
		le.PutUint64(p[24:], s.paddr)
		le.PutUint64(p[32:], uint64(len(s.data)))
		le.PutUint64(p[40:], mem)
		hdr.Write(p)
		body.Write(s.data)
	}
	return append(hdr.Bytes(), body.Bytes()...)
}

func sampleCore() []byte {
	var notes []byte
	notes = append(notes, note("CORE", ntPRStatus, prstatus(1, 0xffffffff81000010, 0xffffc90000003f00))...)
	notes = append(notes, note("CORE", ntPRStatus, prstatus(2, 0xffffffff81000020, 0xffffc90000007f00))...)
	notes = append(notes, note("QEMU", 0, qemuState(0x1000))...)
	notes = append(notes, note("QEMU", 0, qemuState(0x2000))...)
	notes = append(notes, note("VMCOREINFO", 0, []byte("OSRELEASE=6.1.0-test\nPAGESIZE=4096\n"))...)
	low := bytes.Repeat([]byte{0xaa}, 0x2000)
	high := bytes.Repeat([]byte{0xbb}, 0x1000)
	return buildCore(notes, []seg{{paddr: 0x100000, data: high, memsz: 0x2000}, {paddr: 0, data: low}})
}

func writeTemp(t testing.TB, b []byte) string {
	p := filepath.Join(t.TempDir(), "core")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestELFRead(t *testing.T) {
	d, err := Open(writeTemp(t, sampleCore()))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Format() != "elf" {
		t.Errorf("format %q", d.Format())
	}
	if got := d.VMCoreInfo(); got != "OSRELEASE=6.1.0-test\nPAGESIZE=4096\n" {
		t.Errorf("VMCOREINFO %q", got)
	}
	cpus := d.CPUs()
	if len(cpus) != 2 {
		t.Fatalf("%d CPUs, want 2", len(cpus))
	}
	for i, want := range []struct{ rip, rsp, cr3 uint64 }{{0xffffffff81000010, 0xffffc90000003f00, 0x1000}, {0xffffffff81000020, 0xffffc90000007f00, 0x2000}} {
		r := cpus[i].Regs
		if r.RIP != want.rip || r.RSP != want.rsp || r.CR3 != want.cr3 || r.RBP != 0xbbbb || cpus[i].Index != i {
			t.Errorf("cpu %d: %+v", i, cpus[i])
		}
		if cpus[i].PID != 0 {
			t.Errorf("cpu %d: pid %d from a QEMU dump, want 0 (QEMU writes the CPU number)", i, cpus[i].PID)
		}
	}
	if got, want := d.PhysRanges(), []Range{{0, 0x2000}, {0x100000, 0x102000}}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ranges %v, want %v", got, want)
	}
	for _, tc := range []struct {
		addr uint64
		n    int
		want []byte
		err  error
	}{
		{0x1ff0, 16, bytes.Repeat([]byte{0xaa}, 16), nil},
		{0x100ffe, 4, []byte{0xbb, 0xbb, 0, 0}, nil}, // past filesz: zeros
		{0x1ffe, 4, nil, ErrNotPresent},
		{0x5000, 1, nil, ErrNotPresent},
		{0x102000, 1, nil, ErrNotPresent},
	} {
		b := make([]byte, tc.n)
		_, err := d.ReadPhys(b, tc.addr)
		if !errors.Is(err, tc.err) || (tc.err == nil && !bytes.Equal(b, tc.want)) {
			t.Errorf("ReadPhys(%#x, %d) = %x, %v; want %x, %v", tc.addr, tc.n, b, err, tc.want, tc.err)
		}
	}
}

// TestELFCorrupt: every damaged file gives an error naming the problem,
// never a panic or a half-open dump.
func TestELFCorrupt(t *testing.T) {
	good := sampleCore()
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		file []byte
		err  error
	}{
		{"empty", nil, ErrUnknownFormat},
		{"text", []byte("hello, world\n"), ErrUnknownFormat},
		{"magic only", elfMagic, ErrCorrupt},
		{"32-bit", mut(func(b []byte) []byte { b[4] = 1; return b }), ErrCorrupt},
		{"not a core", mut(func(b []byte) []byte { le.PutUint16(b[16:], 2); return b }), ErrCorrupt},
		{"arm64", mut(func(b []byte) []byte { le.PutUint16(b[18:], 183); return b }), ErrCorrupt},
		{"headers past end", mut(func(b []byte) []byte { le.PutUint64(b[32:], 1<<40); return b }), ErrCorrupt},
		{"truncated", good[:len(good)-100], ErrCorrupt},
		{"truncated headers", good[:ehdrSize+10], ErrCorrupt},
		{"note past segment", mut(func(b []byte) []byte {
			le.PutUint32(b[ehdrSize+3*phdrSize+4:], 1<<20) // descsz of the first note
			return b
		}), ErrCorrupt},
		{"memsz < filesz", mut(func(b []byte) []byte {
			le.PutUint64(b[ehdrSize+phdrSize+40:], 1)
			return b
		}), ErrCorrupt},
		{"no load", mut(func(b []byte) []byte {
			le.PutUint16(b[56:], 1)
			return b
		}), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Open(writeTemp(t, tc.file))
			if err == nil {
				d.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
		})
	}
}

// FuzzELF: arbitrary bytes never panic the reader; what opens reads
// consistently.
func FuzzELF(f *testing.F) {
	f.Add(sampleCore())
	f.Add(sampleCore()[:200])
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "core")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := Open(p)
		if err != nil {
			return
		}
		defer d.Close()
		d.CPUs()
		d.VMCoreInfo()
		buf := make([]byte, 64)
		for _, r := range d.PhysRanges() {
			if r.End <= r.Start {
				t.Fatalf("empty range %v", r)
			}
			if _, err := d.ReadPhys(buf, r.Start); err != nil && !errors.Is(err, ErrNotPresent) {
				t.Fatalf("ReadPhys(%#x): %v", r.Start, err)
			}
		}
	})
}

// TestELFOverlap: /proc/vmcore maps the kernel image in a PT_LOAD of its
// own inside a RAM segment; both describe the same bytes.
func TestELFOverlap(t *testing.T) {
	ram := bytes.Repeat([]byte{0xaa}, 0x4000)
	copy(ram[0x2000:], bytes.Repeat([]byte{0xbb}, 0x1000))
	tail := bytes.Repeat([]byte{0xcc}, 0x2000)
	core := buildCore(note("CORE", ntPRStatus, prstatus(1, 0, 0)), []seg{
		{paddr: 0x2000, data: ram[0x2000:0x3000]}, // the image: inside RAM
		{paddr: 0, data: ram},
		{paddr: 0x3000, data: tail}, // partly overlapping: its first page repeats RAM's
	})
	d, err := Open(writeTemp(t, core))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.PhysRanges(); len(got) != 2 || got[0] != (Range{0, 0x4000}) || got[1] != (Range{0x4000, 0x5000}) {
		t.Errorf("ranges %v", got)
	}
	b := make([]byte, 0x5000)
	if _, err := d.ReadPhys(b, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[:0x4000], ram) || !bytes.Equal(b[0x4000:], tail[0x1000:]) {
		t.Errorf("overlapping segments read wrong bytes")
	}
}

// TestELFProcessCore: a user process's core (gdb's gcore, the kernel's
// core dump) names its command in NT_PRPSINFO; a kernel dump has none,
// and /proc/kcore's is zeroed.
func TestELFProcessCore(t *testing.T) {
	info := make([]byte, prpsinfoSize)
	binary.LittleEndian.PutUint32(info[prpsinfoPID:], 4242)
	copy(info[prpsinfoFname:], "work")
	copy(info[prpsinfoArgs:], "./work 10")
	for _, tc := range []struct {
		name  string
		notes []byte
		want  *ProcessInfo
	}{
		{"process", append(note("CORE", ntPRPSInfo, info), note("CORE", ntPRStatus, prstatus(4242, 0x401000, 0x7ffc0000))...),
			&ProcessInfo{PID: 4242, Name: "work", Args: "./work 10"}},
		{"kernel", note("CORE", ntPRStatus, prstatus(1, 0xffffffff81000010, 0x1000)), nil},
		{"zeroed", append(note("CORE", ntPRPSInfo, make([]byte, prpsinfoSize)), note("CORE", ntPRStatus, prstatus(1, 0, 0))...), nil},
	} {
		d, err := Open(writeTemp(t, buildCore(tc.notes, []seg{{paddr: 0, data: make([]byte, 4096)}})))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		e, ok := d.(*ELF)
		if !ok {
			t.Fatalf("%s: a %T", tc.name, d)
		}
		if got := e.Process(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		d.Close()
	}
}
