package typegraph

// A saved graph: the state of a built graph in a compact binary file,
// so that whattype, istype and a second report need not run the passes
// again, and istype reprocesses only from the type set by hand.
//
// What is saved is what the passes computed: each node's type, array
// length, mark, pass and the claim that typed it, every claim (target,
// source, offsets, type, flags, chain links), the pending claims of the
// unmarked nodes, the conflicts, the roots (name, address, BTF type),
// and the report. Types are saved as BTF type ids, which the same
// kernel's BTF gives again; the graph's own types as what makes them
// again: a pointer-array element ("S *") by the index of S, an LSM blob
// by its name (loading reads the blob layouts from the dump again). What is not saved is the heap: loading walks
// the slabs again (the nodes are its allocated objects, numbered in the
// walk's order) and checks that the walk gives the heap the graph was
// built on (Fingerprint): a graph of another dump, or of the same dump
// read with other types, is refused.
//
// Format (little-endian): "KTGRAPH" and a version byte; the 32-byte
// fingerprint; then uvarint/varint fields (see writeGraph); then a
// CRC-32 (Castagnoli) of everything before it. Every count is bounded
// and every index checked on reading, so a corrupt file is an error,
// never a panic or a huge allocation (FuzzLoad).

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/typeid"
)

const (
	savedMagic   = "KTGRAPH"
	savedVersion = 2
	// bounds a file may claim
	maxSavedNodes  = 1 << 28
	maxSavedClaims = 1 << 30
	maxSavedRoots  = 1 << 24
	maxSavedTypes  = 1 << 24
	maxSavedName   = 1 << 12
	maxSavedHeld   = 1 << 12
	maxSavedReport = 64 << 20
)

// ErrOtherDump: the saved graph was built on another heap.
var ErrOtherDump = errors.New("the saved graph belongs to another dump")

// ErrCorruptGraph: the saved graph's file is damaged or not one.
var ErrCorruptGraph = errors.New("corrupt saved graph")

func corruptf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptGraph, fmt.Sprintf(format, a...))
}

// Fingerprint identifies a heap as the graph sees it: the kernel's
// VMCOREINFO (its release, build and layout), the BTF's size, and every
// cache's name and sizes, every slab's address and object count and
// which of its objects are free. Two dumps of one kernel differ in it
// as soon as one object was allocated or freed between them.
func Fingerprint(vmcoreinfo string, spec *btf.Spec, h *slab.Heap) [32]byte {
	d := sha256.New()
	var b [8]byte
	u := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		d.Write(b[:])
	}
	s := func(x string) {
		u(uint64(len(x)))
		d.Write([]byte(x))
	}
	s(vmcoreinfo)
	n := 0
	if spec != nil {
		for _, err := range spec.All() {
			if err != nil {
				break
			}
			n++
		}
	}
	u(uint64(n))
	for _, c := range h.Caches {
		s(c.Name)
		u(uint64(c.ObjectSize))
		u(uint64(c.Size))
		u(uint64(len(c.Slabs)))
		for _, sl := range c.Slabs {
			u(sl.Base)
			u(uint64(sl.Objects))
			var w uint64
			for i := 0; i < sl.Objects; i++ {
				if sl.Free(i) {
					w |= 1 << (i % 64)
				}
				if i%64 == 63 || i == sl.Objects-1 {
					u(w)
					w = 0
				}
			}
		}
	}
	var out [32]byte
	copy(out[:], d.Sum(nil))
	return out
}

// HeldOut lists the caches the graph treats as untyped.
func (g *Graph) HeldOut() []string {
	var out []string
	for c := range g.held {
		out = append(out, c.Name)
	}
	sort.Strings(out)
	return out
}

// Save writes the graph. vmcoreinfo is the dump's, for its identity
// (Fingerprint).
func (g *Graph) Save(w io.Writer, vmcoreinfo string) error {
	var body bytes.Buffer
	body.WriteString(savedMagic)
	body.WriteByte(savedVersion)
	fp := Fingerprint(vmcoreinfo, g.spec, g.heap)
	body.Write(fp[:])
	e := &enc{b: &body}
	held := g.HeldOut()
	e.u(uint64(len(held)))
	for _, h := range held {
		e.s(h)
	}
	if err := g.saveTypes(e); err != nil {
		return err
	}
	e.u(uint64(len(g.typ)))
	e.u(uint64(g.objects))
	e.u(uint64(g.readFails))
	e.u(uint64(g.curPass))
	e.bool(g.chase)
	for n := range g.typ {
		e.i(int64(g.typ[n]))
		e.u(uint64(g.arr[n]))
		e.u(uint64(g.mark[n]))
		e.u(uint64(g.pass[n]))
		e.i(int64(g.from[n]))
		e.i(int64(g.head[n]))
	}
	e.u(uint64(len(g.claims)))
	for _, c := range g.claims {
		e.i(int64(c.tgt))
		e.i(int64(c.src))
		e.u(uint64(c.srcOff))
		e.u(uint64(c.toff))
		e.i(int64(c.typ))
		e.u(uint64(c.flags))
		e.i(int64(c.next))
	}
	g.saveConflicts(e)
	rep, err := json.Marshal(&g.rep)
	if err != nil {
		return err
	}
	e.u(uint64(len(rep)))
	body.Write(rep)
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], crc32.Checksum(body.Bytes(), crc32.MakeTable(crc32.Castagnoli)))
	body.Write(sum[:])
	_, err = w.Write(body.Bytes())
	return err
}

// Load reads a saved graph of the heap h (walked here if not yet) of
// kernel k, whose caches' types are ctypes, as Build would have built
// it. A graph whose fingerprint is not this heap's gives ErrOtherDump; a
// damaged file ErrCorruptGraph.
func Load(r io.Reader, k slab.Kernel, h *slab.Heap, ctypes map[*slab.Cache]typeid.CacheType, vmcoreinfo string) (*Graph, error) {
	data, err := io.ReadAll(io.LimitReader(bufio.NewReader(r), 8<<30))
	if err != nil {
		return nil, err
	}
	head, err := checkSaved(data)
	if err != nil {
		return nil, err
	}
	spec, err := k.BTF()
	if err != nil {
		return nil, err
	}
	if err := h.Walk(); err != nil {
		return nil, err
	}
	fp := Fingerprint(vmcoreinfo, spec, h)
	if !bytes.Equal(head.fp[:], fp[:]) {
		return nil, fmt.Errorf("%w (its heap %x…, this one's %x…): build it again", ErrOtherDump, head.fp[:6], fp[:6])
	}
	g := &Graph{k: k, spec: spec, heap: h, ts: newTypes(), cacheIdx: map[*slab.Cache]int{},
		conf: map[int32][]int32{}, held: map[*slab.Cache]typeid.CacheType{}, trueType: map[*slab.Cache]int32{}}
	l := &loader{g: g, d: &dec{b: data[len(savedMagic)+1+32 : len(data)-4]}}
	if err := l.held(h, ctypes); err != nil {
		return nil, err
	}
	// As Build prepares it: the types the graph makes from the dump.
	g.initLSM()
	g.initOwners()
	g.initStatic()
	g.index(ctypes)
	g.initMaple()
	for _, step := range []func() error{l.types, l.roots, l.nodes, l.claims, l.conflicts, l.report} {
		if err := step(); err != nil {
			return nil, err
		}
		if l.d.err != nil {
			return nil, l.d.err
		}
	}
	// A claim chain must end: a loop of next links would hang a walk.
	if err := g.checkChains(); err != nil {
		return nil, err
	}
	return g, nil
}

// saveTypes writes the types, the BTF id of each type the graph
// numbered or how to make it again, then the roots.
func (g *Graph) saveTypes(e *enc) error {
	e.u(uint64(len(g.ts.infos)))
	for _, ti := range g.ts.infos {
		if ti.ptrTo >= 0 {
			e.u(savedTypePtr)
			e.u(uint64(ti.ptrTo))
			continue
		}
		if id, err := g.spec.TypeID(ti.t); err == nil {
			e.u(savedTypeBTF)
			e.u(uint64(id))
			continue
		}
		if !g.isLSMType(ti.name) {
			return fmt.Errorf("save: type %s is neither in BTF nor one the graph makes", ti.name)
		}
		e.u(savedTypeLSM)
		e.s(ti.name)
	}
	e.u(uint64(len(g.roots)))
	for _, r := range g.roots {
		id, err := g.spec.TypeID(r.typ)
		if err != nil {
			return fmt.Errorf("save: variable %s: %w", r.name, err)
		}
		e.s(r.name)
		e.u(r.addr)
		e.u(uint64(id))
	}
	return nil
}

// saveConflicts writes the nodes' conflicting claims, by node.
func (g *Graph) saveConflicts(e *enc) {
	conf := make([]int32, 0, len(g.conf))
	for n := range g.conf {
		conf = append(conf, n)
	}
	sort.Slice(conf, func(i, j int) bool { return conf[i] < conf[j] })
	e.u(uint64(len(conf)))
	for _, n := range conf {
		e.u(uint64(n))
		e.u(uint64(len(g.conf[n])))
		for _, c := range g.conf[n] {
			e.u(uint64(c))
		}
	}
}

// loader reads a saved graph's sections into g, in order, each checked
// against what came before it.
type loader struct {
	g     *Graph
	d     *dec
	remap []int32 // saved type index → g's type id
	nn    int     // nodes
	nc    int     // claims
	// froms and heads are each node's claim indexes, read with the nodes
	// and checked once the claims are.
	froms, heads []int64
}

// held reads the held-out caches.
func (l *loader) held(h *slab.Heap, ctypes map[*slab.Cache]typeid.CacheType) error {
	d := l.d
	nh := d.count(maxSavedHeld, "held-out caches")
	for i := 0; i < nh && d.err == nil; i++ {
		name := d.s()
		c, ok := h.Cache(name)
		if !ok {
			return corruptf("held-out cache %q is not in the heap", name)
		}
		l.g.held[c] = ctypes[c]
	}
	return d.err
}

// types reads the types: saved index → this graph's id.
func (l *loader) types() error {
	d, g := l.d, l.g
	nt := d.count(maxSavedTypes, "types")
	l.remap = make([]int32, 0, min(nt, 1<<16))
	for i := 0; i < nt && d.err == nil; i++ {
		switch kind := d.u(); kind {
		case savedTypeBTF:
			id := btf.TypeID(d.u())
			t, err := g.spec.TypeByID(id)
			st, ok := t.(*btf.Struct)
			if err != nil || !ok {
				return corruptf("type %d: BTF id %d is no struct", i, id)
			}
			l.remap = append(l.remap, g.ts.id(st))
		case savedTypePtr:
			e := d.u()
			if e >= uint64(len(l.remap)) {
				return corruptf("type %d: pointer to type %d, not saved before it", i, e)
			}
			l.remap = append(l.remap, g.ts.ptrID(g.ts.infos[l.remap[e]].t))
		case savedTypeLSM:
			name := d.s()
			id, ok := g.lsmType(name)
			if !ok {
				return corruptf("type %d: %q is no LSM blob of this dump", i, name)
			}
			l.remap = append(l.remap, id)
		default:
			return corruptf("type %d: kind %d", i, kind)
		}
	}
	return nil
}

// typeOf is saved type index v as this graph's id; -1 is none.
func (l *loader) typeOf(v int64, what string) int32 {
	if v == -1 {
		return -1
	}
	if v < 0 || v >= int64(len(l.remap)) {
		l.d.fail("%s: type %d of %d", what, v, len(l.remap))
		return -1
	}
	return l.remap[v]
}

// roots reads the static roots.
func (l *loader) roots() error {
	d, g := l.d, l.g
	nr := d.count(maxSavedRoots, "roots")
	g.roots = make([]root, 0, min(nr, 1<<16))
	for i := 0; i < nr && d.err == nil; i++ {
		name, addr, id := d.s(), d.u(), btf.TypeID(d.u())
		t, err := g.spec.TypeByID(id)
		if err != nil {
			return corruptf("variable %s: BTF id %d: %v", name, id, err)
		}
		g.roots = append(g.roots, root{name: name, addr: addr, typ: t})
	}
	return nil
}

// nodes reads the graph's counters and each heap object's node.
func (l *loader) nodes() error {
	d, g := l.d, l.g
	l.nn = d.count(maxSavedNodes, "nodes")
	if d.err == nil && l.nn != len(g.typ) {
		return corruptf("%d nodes, the heap has %d", l.nn, len(g.typ))
	}
	g.objects = d.count(maxSavedNodes, "objects")
	g.readFails = d.count(maxSavedNodes, "read failures")
	g.curPass = uint8(d.count(len(passNames)-1, "pass"))
	g.chase = d.bool()
	l.froms = make([]int64, 0, min(l.nn, 1<<20))
	l.heads = make([]int64, 0, min(l.nn, 1<<20))
	for n := 0; n < l.nn && d.err == nil; n++ {
		g.typ[n] = l.typeOf(d.i(), "node")
		g.arr[n] = int32(d.count(1<<24, "array length"))
		g.mark[n] = Mark(d.count(int(Hand), "mark"))
		g.pass[n] = uint8(d.count(len(passNames)-1, "pass"))
		l.froms, l.heads = append(l.froms, d.i()), append(l.heads, d.i())
		if (g.typ[n] < 0) != (g.mark[n] == Unmarked) {
			d.fail("node %d: mark %d with type %d", n, g.mark[n], g.typ[n])
		}
	}
	return nil
}

// node is a saved node index, a root's when negative.
func (l *loader) node(v int64, what string) int32 {
	if v < -int64(len(l.g.roots)) || v >= int64(l.nn) {
		l.d.fail("%s %d out of range", what, v)
		return 0
	}
	return int32(v)
}

// claimIdx is a saved claim index; -1 is none.
func (l *loader) claimIdx(v int64, what string) int32 {
	if v < -1 || v >= int64(l.nc) {
		l.d.fail("%s: claim %d of %d", what, v, l.nc)
		return -1
	}
	return int32(v)
}

// claims reads the claims, then the nodes' links into them.
func (l *loader) claims() error {
	d, g := l.d, l.g
	l.nc = d.count(maxSavedClaims, "claims")
	g.claims = make([]claim, 0, min(l.nc, 1<<20))
	for i := 0; i < l.nc && d.err == nil; i++ {
		var c claim
		c.tgt = l.node(d.i(), "claim target")
		c.src = l.node(d.i(), "claim source")
		c.srcOff = uint32(d.count(1<<30, "offset"))
		c.toff = uint32(d.count(1<<30, "offset"))
		c.typ = l.typeOf(d.i(), "claim")
		c.flags = uint8(d.count(int(flagLink|flagUnion), "flags"))
		c.next = l.claimIdx(d.i(), "next claim")
		if c.tgt < 0 || c.typ < 0 {
			d.fail("claim %d: target %d, type %d", i, c.tgt, c.typ)
		}
		g.claims = append(g.claims, c)
	}
	for n := 0; n < len(l.froms) && d.err == nil; n++ {
		g.from[n] = l.claimIdx(l.froms[n], "node's claim")
		g.head[n] = l.claimIdx(l.heads[n], "node's first claim")
	}
	return nil
}

// conflicts reads the nodes' conflicting claims.
func (l *loader) conflicts() error {
	d, g := l.d, l.g
	ncf := d.count(l.nn, "conflicts")
	for i := 0; i < ncf && d.err == nil; i++ {
		n := l.node(int64(d.u()), "conflict node")
		k := d.count(l.nc, "conflict claims")
		for j := 0; j < k && d.err == nil; j++ {
			g.conf[n] = append(g.conf[n], l.claimIdx(int64(d.u()), "conflict"))
		}
	}
	return nil
}

// report reads the graph's report, the last section.
func (l *loader) report() error {
	d := l.d
	nrep := d.count(maxSavedReport, "report")
	rb := d.bytes(nrep)
	if d.err == nil {
		if err := json.Unmarshal(rb, &l.g.rep); err != nil {
			return corruptf("report: %v", err)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the report", len(d.b))
	}
	return nil
}

// checkChains refuses claim lists that loop.
func (g *Graph) checkChains() error {
	seen := make([]int32, len(g.claims))
	for n := range g.head {
		for c, steps := g.head[n], 0; c >= 0; c, steps = g.claims[c].next, steps+1 {
			if seen[c] == int32(n)+1 || steps > len(g.claims) {
				return corruptf("node %d's claims loop", n)
			}
			seen[c] = int32(n) + 1
		}
	}
	return nil
}

// savedHead is what checkSaved reads before the body.
type savedHead struct{ fp [32]byte }

// checkSaved checks the magic, version and checksum.
func checkSaved(data []byte) (*savedHead, error) {
	if len(data) < len(savedMagic)+1+32+4 || string(data[:len(savedMagic)]) != savedMagic {
		return nil, corruptf("not a saved type graph (no %q header)", savedMagic)
	}
	if v := data[len(savedMagic)]; v != savedVersion {
		return nil, corruptf("version %d; this kinst reads version %d", v, savedVersion)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)) != sum {
		return nil, corruptf("checksum mismatch (truncated or damaged)")
	}
	h := &savedHead{}
	copy(h.fp[:], data[len(savedMagic)+1:])
	return h, nil
}

// IsTypeResult is what setting one type by hand on a built graph did.
type IsTypeResult struct {
	Object        string `json:"object"`
	Type          string `json:"type"`
	NewlyTyped    int    `json:"newly_typed"` // objects typed now that were not before, this one included
	Typed         int    `json:"typed"`
	Untyped       int    `json:"untyped"`
	GreatestReach *Reach `json:"greatest_reach"`
	NS            int64  `json:"ns"`
}

// IsType sets the object at addr to struct typ by hand and reprocesses
// incrementally: conservative propagation from that object only, then
// the arrays, coalescence and inference passes over the objects still
// unmarked (each of which keeps its pending claims), and the report
// again. Objects typed before keep their types, so the result can
// differ from building the graph anew with Options.ByHand where an
// earlier guess now has a conflict; the conflict is counted either way.
func (g *Graph) IsType(addr uint64, typ string) (*IsTypeResult, error) {
	t0 := time.Now()
	n, off, ok := g.node(addr)
	if !ok || off != 0 {
		return nil, fmt.Errorf("istype: %#x is not the start of an allocated slab object", addr)
	}
	var st *btf.Struct
	if err := g.spec.TypeByName(typ, &st); err != nil {
		return nil, fmt.Errorf("istype: struct %s: %w", typ, err)
	}
	if g.mark[n] == ByCache {
		return nil, fmt.Errorf("istype: %#x is a %s by its cache already", addr, g.typeName(n))
	}
	before := g.rep.Typed
	g.typ[n], g.mark[n], g.arr[n], g.from[n] = g.ts.id(st), Hand, 0, -1
	delete(g.conf, n)
	g.queue = append(g.queue[:0], n)
	g.curPass = 1
	g.propagate()
	g.run(PassArrays, g.arrays)
	g.run(PassCoalescence, g.coalesce)
	g.run(PassInference, g.infer)
	passes := g.rep.Passes
	g.rep = Report{}
	g.report()
	g.rep.Passes = passes
	r := g.Report()
	return &IsTypeResult{Object: fmt.Sprintf("%#x", addr), Type: typ, NewlyTyped: r.Typed - before,
		Typed: r.Typed, Untyped: r.Untyped, GreatestReach: r.GreatestReach, NS: time.Since(t0).Nanoseconds()}, nil
}

// enc writes the varint fields.
type enc struct {
	b   *bytes.Buffer
	tmp [binary.MaxVarintLen64]byte
}

func (e *enc) u(v uint64) { e.b.Write(e.tmp[:binary.PutUvarint(e.tmp[:], v)]) }
func (e *enc) i(v int64)  { e.b.Write(e.tmp[:binary.PutVarint(e.tmp[:], v)]) }
func (e *enc) s(x string) { e.u(uint64(len(x))); e.b.WriteString(x) }
func (e *enc) bool(v bool) {
	if v {
		e.u(1)
	} else {
		e.u(0)
	}
}

// dec reads them; the first error sticks and later reads give zeros.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(format string, a ...any) {
	if d.err == nil {
		d.err = corruptf(format, a...)
	}
}

func (d *dec) u() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) i() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number that must be at most max.
func (d *dec) count(max int, what string) int {
	v := d.u()
	if v > uint64(max) {
		d.fail("%s: %d (at most %d)", what, v, max)
		return 0
	}
	return int(v)
}

func (d *dec) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("%d bytes wanted, %d left", n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *dec) s() string { return string(d.bytes(d.count(maxSavedName, "name length"))) }

func (d *dec) bool() bool { return d.count(1, "flag") == 1 }

// Heap is the heap the graph types.
func (g *Graph) Heap() *slab.Heap { return g.heap }

// How a saved type is made again.
const (
	savedTypeBTF = iota // a BTF struct, by id
	savedTypePtr        // "S *", by S's index
	savedTypeLSM        // an LSM blob the graph laid out, by name
)

// isLSMType reports whether name is one of the graph's LSM blob types.
func (g *Graph) isLSMType(name string) bool {
	_, ok := g.lsmType(name)
	return ok
}

// lsmType finds the LSM blob type called name, or the string type.
func (g *Graph) lsmType(name string) (int32, bool) {
	if name == stringTypeName {
		return g.ts.strID(), true
	}
	for _, l := range g.lsm {
		if g.ts.infos[l.typ].name == name {
			return l.typ, true
		}
	}
	return 0, false
}
