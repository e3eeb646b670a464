package typeid

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
)

// CacheType is the type of a cache's objects where the cache itself
// says it: a dedicated cache holds one struct.
type CacheType struct {
	Type btf.Type // nil: unknown
	Name string   // the struct's name
	// How says how the type was found, or why none was.
	How string
}

// knownCaches maps the kernel's dedicated caches whose names are not
// their struct's to that struct (each created with sizeof(struct …)).
// An entry is used only if the struct's size agrees with the cache's
// object size, as every rule here is.
var knownCaches = map[string]string{
	"filp":                  "file",           // fs/file_table.c
	"inode_cache":           "inode",          // fs/inode.c: inodes of file systems without their own
	"files_cache":           "files_struct",   // kernel/fork.c
	"signal_cache":          "signal_struct",  // kernel/fork.c
	"sighand_cache":         "sighand_struct", // kernel/fork.c
	"fs_cache":              "fs_struct",      // kernel/fork.c
	"cred_jar":              "cred",           // kernel/cred.c
	"proc_inode_cache":      "proc_inode",     // fs/proc/inode.c
	"shmem_inode_cache":     "shmem_inode_info",
	"sock_inode_cache":      "socket_alloc", // net/socket.c
	"ext4_inode_cache":      "ext4_inode_info",
	"radix_tree_node":       "xa_node", // lib/radix-tree.c: #define radix_tree_node xa_node since 4.20
	"nsproxy":               "nsproxy",
	"anon_vma_chain":        "anon_vma_chain",
	"kernfs_node_cache":     "kernfs_node",
	"kernfs_iattrs_cache":   "kernfs_iattrs",
	"mnt_cache":             "mount", // fs/namespace.c
	"skbuff_head_cache":     "sk_buff",
	"uid_cache":             "user_struct",
	"pool_workqueue":        "pool_workqueue",
	"vmap_area":             "vmap_area",
	"sigqueue":              "sigqueue",
	"task_delay_info":       "task_delay_info",
	"key_jar":               "key",
	"bdev_cache":            "bdev_inode",
	"mqueue_inode_cache":    "mqueue_inode_info",
	"hugetlbfs_inode_cache": "hugetlbfs_inode_info",
	"debugfs_inode_cache":   "debugfs_inode_info",
	"tracefs_inode_cache":   "tracefs_inode",
}

// CacheTypes gives each cache of the heap its type where the cache holds
// one struct. The rules, in order, each checked against the cache's
// object size (equal to sizeof the struct, or larger only for a struct
// that ends in a variable-size part, as task_struct's FPU state and
// pid's numbers[] do):
//
//   - the cache is named after the struct (task_struct, dentry, mm_struct);
//   - the cache is one of the kernel's dedicated caches named otherwise
//     (filp holds struct file, cred_jar struct cred: knownCaches);
//   - the cache's name less "_cache" or "_cachep" is the struct's.
//
// A merged cache (refcount above 1) holds the objects of every cache
// merged into it, so it gets no type from its name; nor do the kmalloc
// caches, whose objects the typegraph is to type.
func CacheTypes(spec *btf.Spec, h *slab.Heap) map[*slab.Cache]CacheType {
	out := map[*slab.Cache]CacheType{}
	for _, c := range h.Caches {
		out[c] = cacheType(spec, c)
	}
	return out
}

func cacheType(spec *btf.Spec, c *slab.Cache) CacheType {
	if c.Refcount > 1 {
		n := c.Refcount - 1
		return CacheType{How: fmt.Sprintf("merged cache: holds the objects of %d other cache(s) too (%s), so its name says no one type", n, strings.Join(c.Aliases, ", "))}
	}
	if strings.HasPrefix(c.Name, "kmalloc-") || strings.HasPrefix(c.Name, "dma-kmalloc-") {
		return CacheType{How: "general-purpose kmalloc cache: no one type"}
	}
	type cand struct{ name, rule string }
	cands := []cand{{c.Name, "named after the struct"}}
	if s, ok := knownCaches[c.Name]; ok {
		cands = append(cands, cand{s, "the kernel's dedicated cache for this struct"})
	}
	for _, suf := range []string{"_cachep", "_cache"} {
		if s, ok := strings.CutSuffix(c.Name, suf); ok && s != "" {
			cands = append(cands, cand{s, fmt.Sprintf("named after the struct with %q appended", suf)})
		}
	}
	var why []string
	for _, cd := range cands {
		var st *btf.Struct
		if err := spec.TypeByName(cd.name, &st); err != nil {
			continue
		}
		size := uint64(st.Size)
		switch {
		case size == uint64(c.ObjectSize):
			return CacheType{Type: st, Name: st.Name, How: fmt.Sprintf("cache %s: %s (struct %s), sizes equal (%d)", c.Name, cd.rule, st.Name, size)}
		}
		if tail, ok := VariableTail(st); ok && tail.Offset <= uint64(c.ObjectSize) && tail.Offset > 0 {
			return CacheType{Type: st, Name: st.Name, How: fmt.Sprintf("cache %s: %s (struct %s); object size %d, sizeof %d: its last member %s (at %d) has the size the kernel chose at run time", c.Name, cd.rule, st.Name, c.ObjectSize, size, tail.Path, tail.Offset)}
		}
		{
			why = append(why, fmt.Sprintf("struct %s is %d bytes, the objects %d", st.Name, size, c.ObjectSize))
		}
	}
	if len(why) > 0 {
		return CacheType{How: "no struct fits: " + strings.Join(why, "; ")}
	}
	return CacheType{How: "no struct is named after the cache"}
}

// Tail is the innermost last member of a struct when it is an array or a
// union: the part whose size the kernel may choose at run time (a flexible
// array member such as pid.numbers[], or
// task_struct.thread.fpu.__fpstate.regs, sized at boot from the CPU's
// xstate features).
type Tail struct {
	Path   string // member path from the struct
	Offset uint64 // byte offset in the struct
	Array  bool   // an array (else a union)
	Elems  uint32 // an array's declared length (0: a flexible array member)
}

// VariableTail finds t's variable tail, if it has one.
func VariableTail(t btf.Type) (Tail, bool) {
	var path []string
	var off uint64
	for depth := 0; depth < maxDepth; depth++ {
		var members []btf.Member
		switch c := btf.UnderlyingType(t).(type) {
		case *btf.Struct:
			members = c.Members
		case *btf.Union:
			if depth > 0 {
				return Tail{Path: strings.Join(path, "."), Offset: off}, true
			}
			members = c.Members
		case *btf.Array:
			return Tail{Path: strings.Join(path, "."), Offset: off, Array: true, Elems: c.Nelems}, depth > 0
		default:
			return Tail{}, false
		}
		if len(members) == 0 {
			return Tail{}, false
		}
		m := members[len(members)-1]
		if m.BitfieldSize != 0 {
			return Tail{}, false
		}
		off += uint64(m.Offset.Bytes())
		if m.Name != "" {
			path = append(path, m.Name)
		}
		t = m.Type
	}
	return Tail{}, false
}
