package dump

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kinst/kinst/internal/dumpgen"
)

const testVMCoreInfo = "OSRELEASE=6.1.0-test\nPAGESIZE=4096\nKERNELOFFSET=2a000000\n"

// testPage is the content of frame pfn: a 16-byte pattern naming the
// frame (compressible by every codec), or random bytes for frames that
// must be stored raw.
func testPage(pfn uint64, random bool) []byte {
	p := make([]byte, 4096)
	if random {
		rng := rand.New(rand.NewPCG(pfn, 7))
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	for i := 0; i < len(p); i += 16 {
		binary.LittleEndian.PutUint64(p[i:], pfn)
		binary.LittleEndian.PutUint64(p[i+8:], 0x6b696e7374000000|pfn&0xff)
	}
	return p
}

// testKdump is a 200-frame machine: runs of dumped pages, one page of
// zeros shared by several frames, one incompressible page, and excluded
// frames (in memory, not dumped).
func testKdump(version int, codec uint32) *dumpgen.Kdump {
	k := &dumpgen.Kdump{HeaderVersion: version, MaxMapnr: 200, Codec: codec, Release: "6.1.0-test",
		PhysBase: 0x1000000, VMCoreInfo: testVMCoreInfo, Pages: map[uint64][]byte{}}
	for _, r := range [][2]uint64{{0, 10}, {16, 17}, {40, 90}, {130, 200}} {
		for p := r[0]; p < r[1]; p++ {
			k.Pages[p] = testPage(p, p == 55)
		}
	}
	for _, p := range []uint64{3, 60, 61, 199} {
		k.Pages[p] = make([]byte, 4096)
	}
	k.Excluded = []uint64{10, 11, 100}
	k.Notes = append(note("CORE", ntPRStatus, prstatus(101, 0xffffffff81000010, 0x1000)), note("CORE", ntPRStatus, prstatus(202, 0xffffffff81000020, 0x2000))...)
	return k
}

var codecs = []struct {
	name  string
	codec uint32
}{{"raw", dumpgen.CodecRaw}, {"zlib", dumpgen.CodecZlib}, {"lzo", dumpgen.CodecLZO}, {"snappy", dumpgen.CodecSnappy}, {"zstd", dumpgen.CodecZstd}}

// checkKdump compares everything the reader says with what the
// generator wrote.
func checkKdump(t *testing.T, d Dump, gen *dumpgen.Kdump, format string) {
	t.Helper()
	if d.Format() != format {
		t.Errorf("Format = %q, want %q", d.Format(), format)
	}
	k := d.(*Kdump)
	if k.Release() != gen.Release || k.PhysBase() != gen.PhysBase {
		t.Errorf("release %q phys_base %#x, want %q %#x", k.Release(), k.PhysBase(), gen.Release, gen.PhysBase)
	}
	wantInfo := ""
	if k.HeaderVersion() >= 3 {
		wantInfo = testVMCoreInfo
	}
	if d.VMCoreInfo() != wantInfo {
		t.Errorf("VMCoreInfo = %q, want %q", d.VMCoreInfo(), wantInfo)
	}
	var wantCPUs []CPU
	if k.HeaderVersion() >= 4 {
		wantCPUs = []CPU{{Index: 0, PID: 101, Regs: Regs{RIP: 0xffffffff81000010, RSP: 0x1000, RBP: 0xbbbb}},
			{Index: 1, PID: 202, Regs: Regs{RIP: 0xffffffff81000020, RSP: 0x2000, RBP: 0xbbbb}}}
	}
	if !reflect.DeepEqual(d.CPUs(), wantCPUs) {
		t.Errorf("CPUs = %+v, want %+v", d.CPUs(), wantCPUs)
	}
	buf := make([]byte, 4096)
	for pfn := uint64(0); pfn < gen.MaxMapnr+2; pfn++ {
		want, ok := gen.Pages[pfn]
		n, err := d.ReadPhys(buf, pfn*4096)
		if !ok {
			var npe *NotPresentError
			if !errors.As(err, &npe) || !errors.Is(err, ErrNotPresent) || npe.Addr != pfn*4096 || !npe.Physical || n != 0 {
				t.Fatalf("frame %#x not dumped: ReadPhys = %d, %v", pfn, n, err)
			}
			continue
		}
		if err != nil || n != 4096 || !bytes.Equal(buf, want) {
			t.Fatalf("frame %#x: ReadPhys = %d, %v; content equal %v", pfn, n, err, bytes.Equal(buf, want))
		}
	}
	// A read across frames 44..46 at an odd offset.
	span := make([]byte, 3*4096)
	if n, err := d.ReadPhys(span, 44*4096+123); err != nil || n != len(span) {
		t.Fatalf("spanning read: %d, %v", n, err)
	}
	want := append(append(append([]byte{}, gen.Pages[44][123:]...), gen.Pages[45]...), gen.Pages[46]...)
	if !bytes.Equal(span, append(want, gen.Pages[47][:123]...)) {
		t.Fatalf("spanning read returned other bytes")
	}
	// A read that runs into an excluded frame stops there, and says the
	// frame was excluded (in the 1st bitmap, not the 2nd).
	var npe *NotPresentError
	if n, err := d.ReadPhys(span, 9*4096); !errors.As(err, &npe) || n != 4096 || !npe.Excluded || npe.Addr != 10*4096 {
		t.Fatalf("read into excluded frame: %d, %v", n, err)
	}
	if _, err := d.ReadPhys(span, 12*4096); !errors.As(err, &npe) || npe.Excluded {
		t.Fatalf("frame never in memory: %v", err)
	}
	wantRanges := []Range{{0, 10 * 4096}, {16 * 4096, 17 * 4096}, {40 * 4096, 90 * 4096}, {130 * 4096, 200 * 4096}}
	if got := d.PhysRanges(); !reflect.DeepEqual(got, wantRanges) {
		t.Errorf("PhysRanges = %x, want %x", got, wantRanges)
	}
}

// TestKdump reads every header version with every page codec, standard
// and flattened (records in order, shuffled, split mid-page, and with a
// stale header record that a later one overwrites).
func TestKdump(t *testing.T) {
	for version := 1; version <= 6; version++ {
		for _, c := range codecs {
			t.Run(fmt.Sprintf("v%d/%s", version, c.name), func(t *testing.T) {
				gen := testKdump(version, c.codec)
				std, err := gen.Bytes()
				if err != nil {
					t.Fatal(err)
				}
				d, err := Open(writeTemp(t, std))
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				checkKdump(t, d, gen, "kdump")
				for _, o := range []dumpgen.FlattenOptions{{}, {Chunk: 1000, Shuffle: true, Seed: uint64(version)}, {Chunk: 4096 * 3, StaleHeader: true}} {
					fd, err := Open(writeTemp(t, dumpgen.Flatten(std, o)))
					if err != nil {
						t.Fatalf("flattened %+v: %v", o, err)
					}
					checkKdump(t, fd, gen, "kdump-flattened")
					fd.Close()
				}
			})
		}
	}
}

// TestKdumpCodecsCompress makes sure the fixtures exercise the codecs:
// a compressible page must be stored smaller than a block.
func TestKdumpCodecsCompress(t *testing.T) {
	for _, c := range codecs[1:] {
		std, err := testKdump(6, c.codec).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		k, err := newKdump(bytes.NewReader(std), int64(len(std)), int64(len(std)), "kdump", nil)
		if err != nil {
			t.Fatal(err)
		}
		rank, _ := k.dumped.Rank(41)
		desc := std[k.descOff+int64(rank)*kdDescSize:]
		if size, flags := binary.LittleEndian.Uint32(desc[8:]), binary.LittleEndian.Uint32(desc[12:]); flags != c.codec || size >= 4096 {
			t.Errorf("%s: frame 41 stored with flags %#x, %d bytes", c.name, flags, size)
		}
	}
}

// TestResolveOverlaps checks the record index against painting the
// records, in order, into a byte array.
func TestResolveOverlaps(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for iter := 0; iter < 300; iter++ {
		const span = 200
		paint := make([]int, span) // seq+1 of the record that wrote each byte
		var segs []flatSegment
		for i := 0; i < 1+rng.IntN(12); i++ {
			dst := rng.Int64N(span - 1)
			n := 1 + rng.Int64N(span-dst)
			segs = append(segs, flatSegment{dst: dst, src: 10000 * int64(i+1), n: n, seq: i})
			for b := dst; b < dst+n; b++ {
				paint[b] = i + 1
			}
		}
		got := make([]int, span)
		for _, s := range resolveOverlaps(segs) {
			for b := s.dst; b < s.dst+s.n; b++ {
				if got[b] != 0 {
					t.Fatalf("byte %d covered twice", b)
				}
				// src must be the painted record's own byte.
				seq := int(s.src/10000) - 1
				if s.src+(b-s.dst)-10000*int64(seq+1) != b-segsDst(segs, seq) {
					t.Fatalf("byte %d maps to the wrong source", b)
				}
				got[b] = seq + 1
			}
		}
		if !reflect.DeepEqual(got, paint) {
			t.Fatalf("iteration %d: resolved %v, painted %v", iter, got, paint)
		}
	}
}

func segsDst(segs []flatSegment, seq int) int64 {
	for _, s := range segs {
		if s.seq == seq {
			return s.dst
		}
	}
	return -1
}

// TestKdumpCorrupt: broken files give a CorruptError (or, for absent
// pages, ErrNotPresent), never a panic or a huge allocation.
func TestKdumpCorrupt(t *testing.T) {
	std, err := testKdump(6, dumpgen.CodecZlib).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	mod := func(f func(b []byte)) []byte {
		b := bytes.Clone(std)
		f(b)
		return b
	}
	k, err := newKdump(bytes.NewReader(std), int64(len(std)), int64(len(std)), "kdump", nil)
	if err != nil {
		t.Fatal(err)
	}
	descOf := func(pfn uint64) int64 {
		r, _ := k.dumped.Rank(pfn)
		return k.descOff + int64(r)*kdDescSize
	}
	for _, tc := range []struct {
		name    string
		file    []byte
		openErr bool // else the read of frame 41 fails
		offset  int64
	}{
		{"header-only", std[:kdumpHeaderSize-1], true, 0},
		{"block-size-3000", mod(func(b []byte) { le.PutUint32(b[kdHdrBlockSize:], 3000) }), true, kdHdrBlockSize},
		{"version-0", mod(func(b []byte) { le.PutUint32(b[kdHdrVersion:], 0) }), true, kdHdrVersion},
		{"odd-bitmap-blocks", mod(func(b []byte) { le.PutUint32(b[kdHdrBitmapBlocks:], 3) }), true, kdHdrBitmapBlocks},
		{"huge-bitmap", mod(func(b []byte) { le.PutUint32(b[kdHdrBitmapBlocks:], 0xfffffffe) }), true, kdHdrBitmapBlocks},
		{"huge-max-mapnr", mod(func(b []byte) { le.PutUint64(b[4096+kdSubMaxMapnr64:], 1<<40) }), true, kdHdrMaxMapnr},
		{"huge-vmcoreinfo", mod(func(b []byte) { le.PutUint64(b[4096+kdSubVMCoreInfoLen:], 1<<40) }), true, 4096 + kdSubVMCoreInfoOff},
		{"notes-past-end", mod(func(b []byte) { le.PutUint64(b[4096+kdSubNoteOff:], uint64(len(std))) }), true, int64(len(std))},
		{"truncated-descriptors", std[:k.descOff+100], true, k.descOff},
		{"desc-size-0", mod(func(b []byte) { le.PutUint32(b[descOf(41)+8:], 0) }), false, descOf(41)},
		{"desc-size-huge", mod(func(b []byte) { le.PutUint32(b[descOf(41)+8:], 1<<31) }), false, descOf(41)},
		{"desc-two-codecs", mod(func(b []byte) { le.PutUint32(b[descOf(41)+12:], kdZlib|kdZstd) }), false, descOf(41)},
		{"desc-offset-past-end", mod(func(b []byte) { le.PutUint64(b[descOf(41):], 1<<62) }), false, descOf(41)},
		{"desc-negative-offset", mod(func(b []byte) { le.PutUint64(b[descOf(41):], 1<<63) }), false, descOf(41)},
		{"bad-zlib-data", mod(func(b []byte) {
			off := le.Uint64(b[descOf(41):])
			copy(b[off:], "garbage!")
		}), false, int64(le.Uint64(std[descOf(41):]))},
		{"claims-lzo", mod(func(b []byte) { le.PutUint32(b[descOf(41)+12:], kdLZO) }), false, int64(le.Uint64(std[descOf(41):]))},
		{"claims-snappy", mod(func(b []byte) { le.PutUint32(b[descOf(41)+12:], kdSnappy) }), false, int64(le.Uint64(std[descOf(41):]))},
		{"claims-zstd", mod(func(b []byte) { le.PutUint32(b[descOf(41)+12:], kdZstd) }), false, int64(le.Uint64(std[descOf(41):]))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Open(writeTemp(t, tc.file))
			if !tc.openErr {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				defer d.Close()
				_, err = d.ReadPhys(make([]byte, 8), 41*4096)
			}
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a CorruptError", err)
			}
			if ce.Offset != tc.offset {
				t.Errorf("offset %#x, want %#x (%v)", ce.Offset, tc.offset, err)
			}
			t.Log(err)
		})
	}
	// Flattened streams.
	flat := dumpgen.Flatten(std, dumpgen.FlattenOptions{})
	for _, tc := range []struct {
		name string
		file []byte
	}{
		{"no-end-record", flat[:len(flat)-16]},
		{"truncated-record", flat[:len(flat)/2]},
		{"version-2", func() []byte { b := bytes.Clone(flat); binary.BigEndian.PutUint64(b[24:], 2); return b }()},
		{"record-size-huge", func() []byte { b := bytes.Clone(flat); binary.BigEndian.PutUint64(b[4096+8:], 1<<62); return b }()},
		{"record-offset-negative", func() []byte { b := bytes.Clone(flat); binary.BigEndian.PutUint64(b[4096:], 1<<63); return b }()},
		{"hole-backed-bitmap", func() []byte {
			// The header alone, claiming bitmaps far larger than the stream.
			h := bytes.Clone(std[:4096])
			le.PutUint32(h[kdHdrBitmapBlocks:], 1<<17)
			return dumpgen.Flatten(h, dumpgen.FlattenOptions{})
		}()},
	} {
		t.Run("flattened/"+tc.name, func(t *testing.T) {
			_, err := Open(writeTemp(t, tc.file))
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			t.Log(err)
		})
	}
}

func TestUnknownFormat(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("KDUMP  "), []byte("hello, world"), bytes.Repeat([]byte{0}, 8192)} {
		if _, err := Open(writeTemp(t, b)); !errors.Is(err, ErrUnknownFormat) {
			t.Errorf("%q: err = %v, want ErrUnknownFormat", b[:min(len(b), 16)], err)
		}
	}
}

// exercise reads everything a reader exposes; errors are fine, panics
// and errors of the wrong kind are not.
func exercise(t *testing.T, d Dump) {
	d.VMCoreInfo()
	d.CPUs()
	buf := make([]byte, 4096+17)
	for i, r := range d.PhysRanges() {
		if i > 64 {
			break
		}
		for _, a := range []uint64{r.Start, r.End - 1, r.Start + (r.End-r.Start)/2} {
			if _, err := d.ReadPhys(buf, a); err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotPresent) {
				t.Fatalf("ReadPhys(%#x): unexpected error kind: %v", a, err)
			}
		}
	}
	if v, ok := d.(VirtReader); ok {
		for _, a := range []uint64{0, 0xffffffff80000000, 0xfffff80000000000, 0xfffffe0000000000} {
			v.ReadVirt(buf, a)
		}
	}
}

// smallKdump is a fuzz seed: the test machine cut to 48 frames.
func smallKdump(f *testing.F, codec uint32) []byte {
	g := testKdump(6, codec)
	g.MaxMapnr = 48
	for p := range g.Pages {
		if p >= 48 {
			delete(g.Pages, p)
		}
	}
	std, err := g.Bytes()
	if err != nil {
		f.Fatal(err)
	}
	return std
}

// fuzzOpen opens b with open and exercises the result; only corruption
// errors are acceptable.
func fuzzOpen(t *testing.T, d Dump, err error) {
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("open: unexpected error kind: %v", err)
		}
		return
	}
	exercise(t, d)
}

func FuzzKdump(f *testing.F) {
	for _, c := range codecs {
		f.Add(smallKdump(f, c.codec))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := newKdump(bytes.NewReader(b), int64(len(b)), int64(len(b)), "kdump", nil)
		fuzzOpen(t, k, err)
	})
}

func FuzzFlattened(f *testing.F) {
	std := smallKdump(f, dumpgen.CodecZlib)
	f.Add(dumpgen.Flatten(std, dumpgen.FlattenOptions{}))
	f.Add(dumpgen.Flatten(std, dumpgen.FlattenOptions{Chunk: 700, Shuffle: true, StaleHeader: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := openFlattened(bytes.NewReader(b), int64(len(b)), nil)
		fuzzOpen(t, k, err)
	})
}

// codecPage rebuilds page k of testdata/codecs (see gen.py there).
func codecPage(k int) []byte {
	p := make([]byte, 4096)
	switch k {
	case 1:
		for i := range p {
			p[i] = byte((i*7 + 3) % 251)
		}
	case 2:
		var b bytes.Buffer
		for i := 0; i < 200; i++ {
			fmt.Fprintf(&b, "the quick brown fox %05d ", i)
		}
		copy(p, b.Bytes())
	case 3:
		x := uint32(12345)
		for i := 0; i < 2048; i++ {
			x = (x*1103515245 + 12345) & 0x7fffffff
			p[i] = byte(x >> 16)
		}
	}
	return p
}

// TestCodecsMatchReferenceLibraries decodes pages that the C libraries
// makedumpfile links (zlib, liblzo2's lzo1x_1, libsnappy, libzstd)
// compressed: the oracle for the Go decoders, whose own encoders wrote
// the other fixtures.
func TestCodecsMatchReferenceLibraries(t *testing.T) {
	k := &Kdump{format: "kdump", blockSize: 4096}
	for _, c := range codecs[1:] {
		b, err := os.ReadFile(filepath.Join("testdata", "codecs", c.name+".pages"))
		if err != nil {
			t.Fatal(err)
		}
		for page := 0; len(b) > 0; page++ {
			n := int(binary.LittleEndian.Uint32(b))
			got, err := k.decompress(c.codec, b[4:4+n])
			if err != nil {
				t.Fatalf("%s page %d: %v", c.name, page, err)
			}
			if !bytes.Equal(got, codecPage(page)) {
				t.Fatalf("%s page %d decodes to other bytes", c.name, page)
			}
			b = b[4+n:]
			if len(b) == 0 && page != 3 {
				t.Fatalf("%s: %d pages, want 4", c.name, page+1)
			}
		}
	}
}

// BenchmarkKdumpReadPhys: 8-byte physical reads from a zlib kdump of
// 16 MiB, spread over every page (most decode a page) or over 64 pages
// (the page cache answers, as in a page-table walk).
func BenchmarkKdumpReadPhys(b *testing.B) {
	g := &dumpgen.Kdump{MaxMapnr: 4096, Codec: dumpgen.CodecZlib, Pages: map[uint64][]byte{}}
	for p := uint64(0); p < 4096; p++ {
		g.Pages[p] = testPage(p, false)
	}
	std, err := g.Bytes()
	if err != nil {
		b.Fatal(err)
	}
	d, err := Open(writeTemp(b, std))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for _, bc := range []struct {
		name  string
		pages uint64
	}{{"spread", 4096}, {"hot", 64}} {
		b.Run(bc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			var buf [8]byte
			for i := 0; i < b.N; i++ {
				if _, err := d.ReadPhys(buf[:], rng.Uint64N(bc.pages)*4096+rng.Uint64N(512)*8); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reads/s")
		})
	}
}

// TestKdumpDescriptorBlocks reads a dump with descriptors in several
// blocks (kdDescsPerBlock each), in an order that jumps between them.
func TestKdumpDescriptorBlocks(t *testing.T) {
	g := &dumpgen.Kdump{MaxMapnr: 1200, Codec: dumpgen.CodecSnappy, Pages: map[uint64][]byte{}}
	for p := uint64(0); p < 1200; p++ {
		if p%7 != 3 {
			g.Pages[p] = testPage(p, false)
		}
	}
	std, err := g.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(writeTemp(t, std))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, 4096)
	for i := uint64(0); i < 1200; i++ {
		p := i * 389 % 1200 // 389 is prime to 1200: every frame once
		_, err := d.ReadPhys(buf, p*4096)
		if want, ok := g.Pages[p]; !ok {
			if !errors.Is(err, ErrNotPresent) {
				t.Fatalf("frame %d: %v", p, err)
			}
		} else if err != nil || !bytes.Equal(buf, want) {
			t.Fatalf("frame %d: %v", p, err)
		}
	}
}
