package typegraph

import (
	"bytes"
	"encoding/binary"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
)

// The security modules' blobs (security/security.c): each object with
// LSM state (inode, file, cred, task, …) points through a void * member
// at one blob holding every enabled module's part at the offset
// lsm_set_blob_sizes gave it. At boot each module's struct
// lsm_blob_sizes has its sizes replaced by its offsets and the global
// blob_sizes sums them; lsm_names lists the enabled modules in the
// order they got them. From these the graph builds each blob's layout
// as a struct of the modules' parts, types the blob caches
// (lsm_inode_cache, lsm_file_cache) by it, and follows the owners'
// void * members to the blobs as it follows typed pointers.

// lsmParts is each module's part of each blob: a struct, or "*S" for a
// pointer to S (AppArmor's cred part is its label).
var lsmParts = map[string]map[string]string{
	// landlock's file part is 6.7's (truncate and ioctl rights).
	"landlock": {"lbs_cred": "landlock_cred_security", "lbs_file": "landlock_file_security", "lbs_inode": "landlock_inode_security", "lbs_superblock": "landlock_superblock_security"},
	// From 6.9 IMA and EVM are modules of their own (ordered last) with
	// parts of the inode blob; 6.12's IPE has superblock and inode parts
	// (the inode's with fs-verity signatures only).
	"ima":      {"lbs_inode": "*ima_iint_cache"},
	"evm":      {"lbs_inode": "evm_iint_cache"},
	"ipe":      {"lbs_superblock": "ipe_superblock", "lbs_inode": "ipe_inode"},
	"apparmor": {"lbs_cred": "*aa_label", "lbs_file": "aa_file_ctx", "lbs_sock": "aa_sk_ctx", "lbs_task": "aa_task_ctx"},
	"tomoyo":   {"lbs_task": "tomoyo_task"},
	"bpf":      {"lbs_inode": "bpf_storage_blob", "lbs_task": "bpf_storage_blob"},
	"selinux": {"lbs_cred": "task_security_struct", "lbs_file": "file_security_struct", "lbs_inode": "inode_security_struct",
		"lbs_sock": "sk_security_struct", "lbs_superblock": "superblock_security_struct", "lbs_ipc": "ipc_security_struct", "lbs_msg_msg": "msg_security_struct"},
	"smack": {"lbs_cred": "task_smack", "lbs_file": "*smack_known", "lbs_inode": "inode_smack", "lbs_sock": "socket_smack",
		"lbs_superblock": "superblock_smack", "lbs_ipc": "*smack_known", "lbs_msg_msg": "*smack_known"},
}

// lsmBlobs are the blobs: the lsm_blob_sizes member, the owner's void *
// member that points at the blob, and the cache blobs of that kind come
// from ("" : kmalloc).
var lsmBlobs = []struct{ field, owner, member, cache string }{
	{"lbs_cred", "cred", "security", ""},
	{"lbs_file", "file", "f_security", "lsm_file_cache"},
	{"lbs_inode", "inode", "i_security", "lsm_inode_cache"},
	{"lbs_sock", "sock", "sk_security", ""},
	{"lbs_superblock", "super_block", "s_security", ""},
	{"lbs_ipc", "kern_ipc_perm", "security", ""},
	{"lbs_msg_msg", "msg_msg", "security", ""},
	{"lbs_task", "task_struct", "security", ""},
}

// memberKey is a member of a struct.
type memberKey struct {
	s    string // the struct's name (BTF may hold several structs of one name)
	name string
}

// lsmBlob is one blob's layout as the dump's kernel set it up.
type lsmBlob struct {
	field string
	typ   int32
	cache string
}

// initLSM reads the blobs' layouts and marks the owners' void *
// members as pointers to them.
func (g *Graph) initLSM() {
	var names []string
	if p, err := g.k.SymbolAddr("lsm_names"); err == nil {
		var w [8]byte
		if g.k.ReadVirt(w[:], p) == nil {
			if s, ok := g.cString(binary.LittleEndian.Uint64(w[:]), 512); ok {
				names = strings.Split(s, ",")
			}
		}
	}
	if len(names) == 0 {
		return
	}
	b := btflayout.New(g.spec)
	sizes := func(sym string) map[string]int32 {
		a, err := g.k.SymbolAddr(sym)
		if err != nil {
			return nil
		}
		out := map[string]int32{}
		for _, bl := range lsmBlobs {
			f, _, err := b.Lookup("lsm_blob_sizes", bl.field)
			if err != nil || f.Size != 4 {
				continue
			}
			var v [4]byte
			if g.k.ReadVirt(v[:], a+uint64(f.Off)) != nil {
				return nil
			}
			out[bl.field] = int32(binary.LittleEndian.Uint32(v[:]))
		}
		return out
	}
	total := sizes("blob_sizes")
	mods := map[string]map[string]int32{}
	for _, n := range names {
		sym := n + "_blob_sizes"
		switch n {
		case "bpf":
			sym = "bpf_lsm_blob_sizes"
		case "ipe":
			sym = "ipe_blobs"
		}
		if _, ok := lsmParts[n]; ok {
			if s := sizes(sym); s != nil {
				mods[n] = s
			}
		}
	}
	for _, bl := range lsmBlobs {
		if st := g.lsmLayout(bl.field, names, total[bl.field], mods); st != nil {
			id := g.ts.id(st)
			g.lsm = append(g.lsm, lsmBlob{field: bl.field, typ: id, cache: bl.cache})
			var os *btf.Struct
			if g.structByName(bl.owner, &os) == nil {
				if f, ft, err := b.Lookup(bl.owner, bl.member); err == nil && f.Size == 8 && pointee(ft) != nil {
					g.ts.voids[memberKey{os.Name, bl.member}] = id
				}
			}
		}
	}
}

// partless are modules known to ask for no part of any blob.
var partless = map[string]bool{"capability": true, "lockdown": true, "yama": true, "loadpin": true, "safesetid": true, "integrity": true}

// lsmLayout lays out one blob: each enabled module with a part in it, in
// lsm_names order, got the offset where the parts before it end, aligned
// to 8 bytes (lsm_set_blob_size; a module that asked for none keeps 0),
// and the parts add up to blob_sizes' total. A module kinst knows no part
// of (not in lsmParts, its part's struct not in BTF) leaves a gap that
// the next offset or the total closes; anything else that does not add
// up leaves the blob untyped.
func (g *Graph) lsmLayout(field string, names []string, total int32, mods map[string]map[string]int32) *btf.Struct {
	if total <= 0 {
		return nil
	}
	st := &btf.Struct{Name: "lsm_" + strings.TrimPrefix(field, "lbs_") + "_blob", Size: uint32(total)}
	run := int32(0)
	if field == "lbs_inode" {
		// The inode blob starts with an rcu_head (lsm_set_blob_sizes).
		var rcu *btf.Struct
		if g.structByName("callback_head", &rcu) != nil {
			return nil
		}
		st.Members = append(st.Members, btf.Member{Name: "rcu", Type: rcu})
		run = int32(rcu.Size)
	}
	base := run
	gap := false // an unknown part may lie before the next offset
	align := func(v int32) int32 { return (v + 7) &^ 7 }
	for _, n := range names {
		s, ok := mods[n]
		if !ok {
			gap = gap || !partless[n]
			continue
		}
		part, ok := lsmParts[n][field]
		v := s[field]
		if !ok || (v == 0 && run != base) || (v == 0 && !ok) {
			continue // asked for no part of this blob
		}
		if v < align(run) || (v > align(run) && !gap) {
			return nil
		}
		var pt btf.Type
		var size int32
		var ps *btf.Struct
		p, isPtr := strings.CutPrefix(part, "*")
		if g.structByName(p, &ps) != nil {
			// A part whose struct this kernel's BTF lacks: its size is
			// unknown, so what follows may start anywhere after it.
			run, gap = v+1, true
			continue
		}
		if isPtr {
			pt, size = &btf.Pointer{Target: ps}, 8
		} else {
			pt, size = ps, int32(ps.Size)
		}
		st.Members = append(st.Members, btf.Member{Name: n, Type: pt, Offset: btf.Bits(8 * v)})
		run, gap = v+size, false
	}
	if run > total || (align(run) != total && !gap) || len(st.Members) == 0 || (field == "lbs_inode" && len(st.Members) == 1) {
		return nil
	}
	return st
}

// cString reads a NUL-terminated string of at most max bytes, a page
// at a time.
func (g *Graph) cString(a uint64, max int) (string, bool) {
	var out []byte
	for len(out) < max {
		n := 4096 - int(a&4095)
		b := make([]byte, n)
		if g.k.ReadVirt(b, a) != nil {
			return "", false
		}
		if i := bytes.IndexByte(b, 0); i >= 0 {
			return string(append(out, b[:i]...)), true
		}
		out = append(out, b...)
		a += uint64(n)
	}
	return "", false
}

// lsmCacheType is the blob a dedicated LSM cache holds, -1 if none.
func (g *Graph) lsmCacheType(name string, objSize uint32, aliases int) int32 {
	for _, bl := range g.lsm {
		if bl.cache == name && aliases == 0 && g.ts.infos[bl.typ].size == objSize {
			return bl.typ
		}
	}
	return -1
}
