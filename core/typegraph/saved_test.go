package typegraph

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
	"github.com/kinst/kinst/core/typeid"
)

const testVMCI = "OSRELEASE=6.1.0-test\nKERNELOFFSET=0\n"

// saved builds the synthetic graph and saves it.
func saved(t testing.TB, opt Options) (*slabtest.Image, *Graph, []byte, map[uint64]want, map[string]uint64) {
	tt, ok := t.(*testing.T)
	if !ok {
		tt = &testing.T{} // heap fails only on a broken fixture, which the other tests report
	}
	im, h, w, addrs := heap(tt)
	g, err := Build(im, h, typeid.CacheTypes(im.Spec, h), opt)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := g.Save(&b, testVMCI); err != nil {
		t.Fatal(err)
	}
	return im, g, b.Bytes(), w, addrs
}

// load reads a saved graph over a fresh walk of the image's heap.
func load(t testing.TB, im *slabtest.Image, data []byte, vmci string) (*Graph, error) {
	h, err := slab.Open(im)
	if err != nil {
		t.Fatal(err)
	}
	return Load(bytes.NewReader(data), im, h, typeid.CacheTypes(im.Spec, h), vmci)
}

func TestSaveLoad(t *testing.T) {
	for _, opt := range []Options{{}, {HoldOut: []string{"thing"}}} {
		im, g, data, w, addrs := saved(t, opt)
		lg, err := load(t, im, data, testVMCI)
		if err != nil {
			t.Fatalf("%+v: %v", opt, err)
		}
		// Every object as the built graph has it: type, mark, pass,
		// member, chain and conflicts.
		for a := range w {
			t1, ok1 := g.TypeAt(a)
			t2, ok2 := lg.TypeAt(a)
			if ok1 != ok2 || !reflect.DeepEqual(t1, t2) {
				t.Errorf("%+v: %#x: built %+v, loaded %+v", opt, a, t1, t2)
			}
		}
		j1, _ := json.Marshal(g.Report())
		j2, _ := json.Marshal(lg.Report())
		if !bytes.Equal(j1, j2) {
			t.Errorf("%+v: report built %s, loaded %s", opt, j1, j2)
		}
		if !reflect.DeepEqual(g.Conflicts(10), lg.Conflicts(10)) || len(lg.Conflicts(10)) != 1 {
			t.Errorf("conflicts: built %+v, loaded %+v", g.Conflicts(10), lg.Conflicts(10))
		}
		if got := lg.HeldOut(); !reflect.DeepEqual(got, g.HeldOut()) {
			t.Errorf("held out: %v, want %v", got, g.HeldOut())
		}
		// Saved again, the same bytes.
		var b bytes.Buffer
		if err := lg.Save(&b, testVMCI); err != nil || !bytes.Equal(b.Bytes(), data) {
			t.Errorf("%+v: saved again: %d bytes, %v; first %d bytes", opt, b.Len(), err, len(data))
		}
		_ = addrs
	}
}

// TestIsTypeIncremental: istype on a loaded graph types what a full
// build with the type set by hand types, and says how many more.
func TestIsTypeIncremental(t *testing.T) {
	im, g0, data, w, addrs := saved(t, Options{})
	lg, err := load(t, im, data, testVMCI)
	if err != nil {
		t.Fatal(err)
	}
	res, err := lg.IsType(addrs["hand"], "outer")
	if err != nil {
		t.Fatal(err)
	}
	full, err := Build(im, g0.heap, typeid.CacheTypes(im.Spec, g0.heap), Options{ByHand: []ByHand{{addrs["hand"], "outer"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.NewlyTyped != 2 || res.Typed != full.Report().Typed || res.Untyped != full.Report().Untyped || res.Typed != g0.Report().Typed+2 {
		t.Errorf("istype: %+v; full rebuild typed %d, before %d", res, full.Report().Typed, g0.Report().Typed)
	}
	if !reflect.DeepEqual(res.GreatestReach, full.Report().GreatestReach) {
		t.Errorf("greatest reach %+v, full rebuild's %+v", res.GreatestReach, full.Report().GreatestReach)
	}
	for _, a := range append([]uint64{addrs["hand"], addrs["handLeaf"]}, keys(w)...) {
		t1, _ := full.TypeAt(a)
		t2, _ := lg.TypeAt(a)
		if (t1 == nil) != (t2 == nil) || t1 != nil && (t1.Type != t2.Type || t1.Mark != t2.Mark || t1.Member != t2.Member) {
			t.Errorf("%#x: full %+v, incremental %+v", a, t1, t2)
		}
	}
	if lg.Report().ByHand != 1 {
		t.Errorf("by hand: %d", lg.Report().ByHand)
	}
	// Saved after istype, loaded again: the type set by hand stays.
	var b bytes.Buffer
	if err := lg.Save(&b, testVMCI); err != nil {
		t.Fatal(err)
	}
	lg2, err := load(t, im, b.Bytes(), testVMCI)
	if err != nil {
		t.Fatal(err)
	}
	if ty, ok := lg2.TypeAt(addrs["handLeaf"]); !ok || ty.Type != "leaf" {
		t.Errorf("after save and load: %+v", ty)
	}
	for _, bad := range []struct {
		a   uint64
		typ string
	}{{addrs["hand"] + 8, "outer"}, {addrs["o1"], "nosuch"}, {addrs["o0"], "outer"}} {
		if _, err := lg2.IsType(bad.a, bad.typ); err == nil {
			t.Errorf("istype %#x %s: no error", bad.a, bad.typ)
		}
	}
}

func keys(m map[uint64]want) []uint64 {
	var out []uint64
	for a := range m {
		out = append(out, a)
	}
	return out
}

// resum fixes a modified file's checksum, so that the body's own checks
// are what refuses it.
func resum(b []byte) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func TestLoadRefuses(t *testing.T) {
	im, _, data, _, _ := saved(t, Options{})
	body := len(savedMagic) + 1 + 32
	for _, tc := range []struct {
		name string
		data []byte
		vmci string
		want error
	}{
		{"another kernel's VMCOREINFO", data, "OSRELEASE=6.1.0-other\n", ErrOtherDump},
		{"another heap", resum(append(append(append([]byte(nil), data[:body-1]...), data[body-1]^1), data[body:]...)), testVMCI, ErrOtherDump},
		{"empty", nil, testVMCI, ErrCorruptGraph},
		{"not a graph", []byte("hello, world, this is not a saved graph at all......"), testVMCI, ErrCorruptGraph},
		{"truncated", data[:len(data)/2], testVMCI, ErrCorruptGraph},
		{"flipped byte", func() []byte { b := append([]byte(nil), data...); b[len(b)/2] ^= 0x40; return b }(), testVMCI, ErrCorruptGraph},
		{"version", resum(append(append([]byte(savedMagic), 9), data[len(savedMagic)+1:]...)), testVMCI, ErrCorruptGraph},
		{"node count", resum(append(append(append([]byte(nil), data[:body]...), 0x7f), data[body:]...)), testVMCI, ErrCorruptGraph},
		{"trailing bytes", resum(append(append(append([]byte(nil), data[:len(data)-4]...), 1, 2, 3), 0, 0, 0, 0)), testVMCI, ErrCorruptGraph},
	} {
		_, err := load(t, im, tc.data, tc.vmci)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzLoad: no input makes Load panic, hang or allocate without bound;
// the checksum is fixed first so the body's parser is what is fuzzed.
func FuzzLoad(f *testing.F) {
	im, _, data, _, _ := saved(f, Options{})
	f.Add(data)
	f.Add(data[:60])
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 8 {
			b = resum(b)
		}
		g, err := load(t, im, b, testVMCI)
		if err == nil {
			// A graph it accepts answers for every object.
			for _, s := range g.slabs {
				for i := 0; i < s.Objects; i++ {
					g.TypeAt(s.Object(i))
				}
			}
			g.Conflicts(5)
		}
	})
}
