package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/core/typeid"
)

// SearchHit is one quadword of the dump equal to a value searched for.
type SearchHit struct {
	Value   string `json:"value"`
	Phys    string `json:"phys"`
	Address string `json:"address"` // the kernel address it is seen at
	// Seen says which mapping Address is in: "kernel image", "stack" (a
	// task's, through its page tables), "module NAME" or "direct map".
	Seen string         `json:"seen"`
	What *typeid.Result `json:"what"`
}

// SearchReport is `kinst core DUMP search VALUE… --json`.
type SearchReport struct {
	Values []string    `json:"values"`
	Hits   []SearchHit `json:"hits"`
	// Scanned is the bytes of memory the dump holds that were read.
	Scanned uint64 `json:"scanned_bytes"`
	Capped  bool   `json:"capped,omitempty"` // more hits than the report keeps
}

// searchCap bounds a search's hits: a value as common as 0 would list
// most of memory.
const searchCap = 10000

// CoreSearch is `kinst core DUMP search VALUE…` (crash's search -k): every
// aligned quadword of the memory the dump holds that equals one of the
// values, at the kernel address it is seen at -- the kernel image, a
// task's stack (through its page tables: stacks are vmalloc'd), else the
// direct map -- and what that memory is (whattype: the slab object and
// member, the task's stack, the variable). What a leak's or a
// use-after-free's hunt asks: who still points at this object.
func CoreSearch(k *core.Kernel, values []uint64, asJSON bool, w io.Writer) error {
	if len(values) == 0 {
		return errors.New("search: give one or more values")
	}
	h, id, err := openIdentifier(k)
	if err != nil {
		return err
	}
	seen := searchMappings(k, h.PageOffset)
	want := map[uint64]bool{}
	rep := SearchReport{}
	for _, v := range values {
		want[v] = true
		rep.Values = append(rep.Values, fmt.Sprintf("%#x", v))
	}
	buf := make([]byte, 1<<20)
	for _, r := range k.Dump.PhysRanges() {
		for at := r.Start &^ 7; at < r.End && !rep.Capped; {
			n := min(uint64(len(buf)), r.End-at)
			got, err := k.Dump.ReadPhys(buf[:n], at)
			if err != nil && got == 0 {
				if !errors.Is(err, dump.ErrNotPresent) {
					return fmt.Errorf("search: read %#x: %w", at, err)
				}
				got = int(min(n, 4096-at%4096)) // the page is not dumped
				at += uint64(got)
				continue
			}
			rep.Scanned += uint64(got)
			for off := 0; off+8 <= got; off += 8 {
				v := le64(buf[off:])
				if !want[v] {
					continue
				}
				pa := at + uint64(off)
				va, how := seen(pa)
				if how == "kernel image" {
					// A page the image once had and the kernel freed after
					// boot (section gaps, unused brk) may be a slab's now,
					// its old alias still mapped: what it is now decides.
					if r, err := id.WhatType(h.PageOffset + pa); err == nil && r.Kind == typeid.KindSlab {
						va, how = h.PageOffset+pa, "direct map"
					}
				}
				hit := SearchHit{Value: fmt.Sprintf("%#x", v), Phys: fmt.Sprintf("%#x", pa), Address: fmt.Sprintf("%#x", va), Seen: how}
				if r, err := id.WhatType(va); err == nil {
					hit.What = r
				}
				if rep.Hits = append(rep.Hits, hit); len(rep.Hits) == searchCap {
					rep.Capped = true
					break
				}
			}
			at += uint64(got)
		}
	}
	if asJSON {
		return writeJSON(w, rep)
	}
	tw := newTable(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "VALUE\tADDRESS\tSEEN AT\tWHAT")
	for _, h := range rep.Hits {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", strings.TrimPrefix(h.Value, "0x"), strings.TrimPrefix(h.Address, "0x"), h.Seen, whatLine(h.What))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	note := ""
	if rep.Capped {
		note = fmt.Sprintf(" (the first %d kept)", searchCap)
	}
	_, err = fmt.Fprintf(w, "%d hit(s) in %d MiB of memory%s\n", len(rep.Hits), rep.Scanned>>20, note)
	return err
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// searchMappings says at which kernel address a physical address is
// seen: in the kernel's image, in a task's stack (whose vmalloc'd pages
// are found through the page tables), else in the direct map.
func searchMappings(k *core.Kernel, pageOffset uint64) func(pa uint64) (uint64, string) {
	physBase := uint64(k.Info.Numbers["phys_base"])
	const startKernelMap = 0xffffffff80000000
	var text, end uint64
	if s, err := k.LookupSymbol("_text"); err == nil {
		text = s.Addr
	}
	if s, err := k.LookupSymbol("_end"); err == nil {
		end = s.Addr
	}
	type seenPage struct {
		va  uint64
		how string
	}
	pages := map[uint64]seenPage{} // physical page → where it is seen
	mapRange := func(base, size uint64, how string) {
		for off := uint64(0); off < size; off += 4096 {
			if pa, err := k.Translate(base + off); err == nil {
				pages[pa&^4095] = seenPage{base + off, how}
			}
		}
	}
	if tasks, err := k.Tasks(); err == nil {
		for _, t := range tasks {
			if base, ok := t.Stack(); ok {
				mapRange(base, 4*4096, "stack")
			}
		}
	}
	// Modules' memory is vmalloc'd too (their variables: a list head, an
	// array of pointers).
	if mods, err := k.Modules(); err == nil {
		for _, m := range mods {
			mapRange(m.Base, m.Size, "module "+m.Name)
			for _, o := range m.Other {
				mapRange(o[0], o[1], "module "+m.Name)
			}
		}
	}
	return func(pa uint64) (uint64, string) {
		// A stack's or a module's page first: the image's pages the
		// kernel freed after boot (init, the gaps between its sections)
		// are reused, their old addresses still mapped.
		if p, ok := pages[pa&^4095]; ok {
			return p.va + pa%4096, p.how
		}
		if va := pa - physBase + startKernelMap; text != 0 && va >= text && va < end {
			if got, err := k.Translate(va); err == nil && got == pa {
				return va, "kernel image"
			}
		}
		return pageOffset + pa, "direct map"
	}
}

// whatLine is whattype's answer on one line.
func whatLine(r *typeid.Result) string {
	if r == nil {
		return "?"
	}
	parts := []string{r.Kind}
	str := func(p *string) string { return strOr(p, "") }
	switch r.Kind {
	case typeid.KindSlab:
		s := str(r.Cache)
		if r.Object != nil {
			s += " " + *r.Object
			if r.Offset != nil {
				s += fmt.Sprintf("+%#x", *r.Offset)
			}
		}
		if t := str(r.Type); t != "" {
			s += " (" + t
			if m := str(r.Member); m != "" {
				s += "." + m
			}
			s += ")"
		}
		if st := str(r.State); st != "" {
			s += " " + st
		}
		parts = append(parts, s)
	case typeid.KindStack:
		if r.Task != nil {
			parts = append(parts, fmt.Sprintf("of %d (%s)", r.Task.PID, r.Task.Comm))
		}
	}
	if r.Symbol != "" {
		parts = append(parts, r.Symbol)
	}
	if r.Detail != "" && !slices.Contains(parts, r.Detail) {
		parts = append(parts, r.Detail)
	}
	return strings.Join(parts, " ")
}
