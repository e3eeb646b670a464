package slab

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// findAliases reads the names of merged caches from sysfs's kernfs
// nodes: a mergeable cache's directory under /sys/kernel/slab has a
// unique id (":A-0000192"), and its own name and each alias merged into
// it (__kmem_cache_alias) are symlinks to that directory. slab_caches
// holds only the real caches, and the kernel keeps no other list of
// alias names once sysfs is up (early aliases wait on alias_list until
// slab_sysfs_init, then move to sysfs), so this is the only place a dump
// has them.
func (h *Heap) findAliases() {
	l := h.l
	if !l.aliasesKnown() {
		h.AliasSource = "none: this kernel's BTF lacks the sysfs (kernfs) members; aliases unknown"
		return
	}
	byKN := map[uint64]*Cache{}
	parents := map[uint64]bool{}
	for _, c := range h.Caches {
		if c.sysfsKN == 0 {
			continue
		}
		byKN[c.sysfsKN] = c
		if p, err := h.readU64(c.sysfsKN + uint64(l.knParent.Off)); err == nil && p != 0 {
			parents[p] = true
		}
	}
	if len(parents) == 0 {
		h.AliasSource = "none: no cache is in sysfs (kmem_cache.kobj.sd); aliases unknown"
		return
	}
	links := 0
	// Each cache has a directory and a link per name; a tree much larger
	// than that is corrupt.
	maxEntries := 64*len(h.Caches) + 4096
	for dir := range parents {
		// kernfs_node.dir.children: an rbtree of kernfs_node.rb.
		root, err := h.readU64(dir + uint64(l.knChildren.Off+l.rbRoot.Off))
		if err != nil {
			h.anomaly(Anomaly{What: fmt.Sprintf("sysfs slab directory %#x: %v", dir, err)})
			continue
		}
		stack := []uint64{root}
		seen := map[uint64]bool{}
		for len(stack) > 0 {
			rb := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if rb == 0 || seen[rb] {
				continue
			}
			if len(seen) >= maxEntries {
				h.anomaly(Anomaly{What: fmt.Sprintf("sysfs slab directory %#x: more than %d entries (corrupt tree?)", dir, len(seen))})
				break
			}
			seen[rb] = true
			kn := rb - uint64(l.knRB.Off)
			nb := make([]byte, max(l.knFlags.End(), l.knTarget.End(), l.knName.End(), l.knRB.Off+l.rbRight.End()))
			if err := h.k.ReadVirt(nb, kn); err != nil {
				h.anomaly(Anomaly{What: fmt.Sprintf("sysfs node %#x: %v", kn, err)})
				continue
			}
			stack = append(stack, binary.LittleEndian.Uint64(nb[l.knRB.Off+l.rbLeft.Off:]), binary.LittleEndian.Uint64(nb[l.knRB.Off+l.rbRight.Off:]))
			name, err := h.readString(l.knName.U64(nb), 64)
			if err != nil {
				continue
			}
			if c, ok := byKN[kn]; ok {
				c.SysfsName = name
			}
			if l.knFlags.U64(nb)&0xf != l.kernfsLink {
				continue
			}
			c, ok := byKN[l.knTarget.U64(nb)]
			if !ok {
				continue
			}
			links++
			if name != c.Name {
				c.Aliases = append(c.Aliases, name)
			}
		}
	}
	for _, c := range h.Caches {
		sort.Strings(c.Aliases)
	}
	h.AliasSource = fmt.Sprintf("sysfs: the symlinks in /sys/kernel/slab, read from the kernfs nodes in memory (%d links)", links)
}
