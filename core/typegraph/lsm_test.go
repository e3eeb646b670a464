package typegraph

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab/slabtest"
)

// TestLSMBlobs: the inode's security blob (a void *) is typed as the
// layout the dump's lsm_names, blob_sizes and each module's
// lsm_blob_sizes give, and only when they agree with each other; the
// blob's parts then type what they point at.
func TestLSMBlobs(t *testing.T) {
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	var sizes []btf.Member
	for i, f := range []string{"lbs_cred", "lbs_file", "lbs_inode", "lbs_superblock", "lbs_ipc", "lbs_msg_msg", "lbs_task"} {
		sizes = append(sizes, mem(f, i32, uint32(4*i)))
	}
	for _, tc := range []struct {
		name  string
		names string           // lsm_names ("" : no such symbol)
		inode map[string]int32 // lbs_inode of blob_sizes ("total") and of each module
		want  string           // the blob's type, "" untyped
	}{
		{"layout", "capability,landlock,yama,bpf", map[string]int32{"total": 32, "landlock": 16, "bpf": 24}, "lsm_inode_blob"},
		{"module without a part", "capability,landlock,selinux,bpf", map[string]int32{"total": 32, "landlock": 16, "bpf": 24}, "lsm_inode_blob"},
		{"module not enabled", "capability,landlock", map[string]int32{"total": 32, "landlock": 16, "bpf": 24}, ""},
		{"offsets swapped", "capability,landlock,bpf", map[string]int32{"total": 32, "landlock": 24, "bpf": 16}, ""},
		{"total disagrees", "capability,landlock,bpf", map[string]int32{"total": 40, "landlock": 16, "bpf": 24}, ""},
		{"no lsm_names", "", map[string]int32{"total": 32, "landlock": 16, "bpf": 24}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := slabtest.Types(false)
			cb := &btf.Struct{Name: "callback_head", Size: 16, Members: []btf.Member{mem("next", u64, 0), mem("func", u64, 8)}}
			lobj := &btf.Struct{Name: "landlock_object", Size: 64, Members: []btf.Member{mem("x", u64, 0)}}
			lis := &btf.Struct{Name: "landlock_inode_security", Size: 8, Members: []btf.Member{mem("object", ptr(lobj), 0)}}
			bls := &btf.Struct{Name: "bpf_local_storage", Size: 128, Members: []btf.Member{mem("x", u64, 0)}}
			bsb := &btf.Struct{Name: "bpf_storage_blob", Size: 8, Members: []btf.Member{mem("storage", ptr(bls), 0)}}
			lbs := &btf.Struct{Name: "lsm_blob_sizes", Size: 28, Members: sizes}
			inode := &btf.Struct{Name: "inode", Size: 40, Members: []btf.Member{mem("i_ino", u64, 0), mem("i_security", ptr(&btf.Void{}), 8), mem("pad", u64, 16)}}
			im := slabtest.NewImageTypes(t, false, append(base, cb, lobj, lis, bls, bsb, lbs, inode))
			ic := im.AddCache("inode", 40, 40, 0, 0)
			k32 := im.AddCache("kmalloc-32", 32, 32, 0, 0)
			k64 := im.AddCache("kmalloc-64", 64, 64, 0, 0)
			k128 := im.AddCache("kmalloc-128", 128, 128, 0, 0)
			si := im.AddSlab(ic, 1, nil)
			s32 := im.AddSlab(k32, 1, nil)
			s64 := im.AddSlab(k64, 1, nil)
			s128 := im.AddSlab(k128, 1, nil)
			im.Finish()
			blob, obj, stor := k32.Obj(s32, 0), k64.Obj(s64, 0), k128.Obj(s128, 0)
			im.U64(ic.Obj(si, 0)+8, blob)
			im.U64(blob+16, obj)
			im.U64(blob+24, stor)
			if tc.names != "" {
				im.Syms["lsm_names"] = im.Alloc(8)
				im.U64(im.Syms["lsm_names"], im.Str(tc.names))
			}
			for sym, key := range map[string]string{"blob_sizes": "total", "landlock_blob_sizes": "landlock", "bpf_lsm_blob_sizes": "bpf", "selinux_blob_sizes": "selinux"} {
				a := im.Alloc(28)
				im.Syms[sym] = a
				im.Write(a+8, []byte{byte(tc.inode[key]), 0, 0, 0})
			}
			g := buildImageGraph(t, im)
			at, ok := g.TypeAt(blob + 24)
			if tc.want == "" {
				if ok {
					t.Errorf("blob typed %+v, want untyped", at)
				}
				return
			}
			if !ok || at.Type != tc.want || at.Mark != Known || at.Member != "lsm_inode_blob.bpf.storage" ||
				len(at.Chain) != 1 || at.Chain[0].Member != "inode.i_security" {
				t.Fatalf("blob: %+v, want %s known through inode.i_security", at, tc.want)
			}
			for a, want := range map[uint64]string{obj: "landlock_object", stor: "bpf_local_storage"} {
				if at, ok := g.TypeAt(a); !ok || at.Type != want || !strings.HasPrefix(at.Chain[1].Member, "lsm_inode_blob.") {
					t.Errorf("%#x: %+v, want %s through the blob", a, at, want)
				}
			}
		})
	}
}

// TestLSMBlobsIntegrity: from 6.9 IMA and EVM have parts of the inode
// blob (IMA's a pointer to its ima_iint_cache, EVM's an evm_iint_cache),
// after the other modules; the layout must include them to add up.
func TestLSMBlobsIntegrity(t *testing.T) {
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	var sizes []btf.Member
	for i, f := range []string{"lbs_cred", "lbs_file", "lbs_inode", "lbs_superblock", "lbs_ipc", "lbs_msg_msg", "lbs_task"} {
		sizes = append(sizes, mem(f, i32, uint32(4*i)))
	}
	for _, tc := range []struct {
		name, names string
		typed       bool
	}{
		{"ima and evm", "capability,lockdown,yama,ima,evm", true},
		{"evm unknown to the layout", "capability,ima,evm,future", true}, // a module without an inode part is fine
		{"evm part missing", "capability,ima", false},                    // blob_sizes counts evm's part: no layout
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := slabtest.Types(false)
			cb := &btf.Struct{Name: "callback_head", Size: 16, Members: []btf.Member{mem("next", u64, 0), mem("func", u64, 8)}}
			iint := &btf.Struct{Name: "ima_iint_cache", Size: 64, Members: []btf.Member{mem("version", u64, 0)}}
			evm := &btf.Struct{Name: "evm_iint_cache", Size: 8, Members: []btf.Member{mem("flags", u64, 0)}}
			lbs := &btf.Struct{Name: "lsm_blob_sizes", Size: 28, Members: sizes}
			inode := &btf.Struct{Name: "inode", Size: 40, Members: []btf.Member{mem("i_ino", u64, 0), mem("i_security", ptr(&btf.Void{}), 8), mem("pad", u64, 16)}}
			im := slabtest.NewImageTypes(t, false, append(base, cb, iint, evm, lbs, inode))
			ic := im.AddCache("inode", 40, 40, 0, 0)
			k32 := im.AddCache("kmalloc-32", 32, 32, 0, 0)
			k64 := im.AddCache("kmalloc-64", 64, 64, 0, 0)
			si := im.AddSlab(ic, 1, nil)
			s32 := im.AddSlab(k32, 1, nil)
			s64 := im.AddSlab(k64, 1, nil)
			im.Finish()
			blob, cache := k32.Obj(s32, 0), k64.Obj(s64, 0)
			im.U64(ic.Obj(si, 0)+8, blob)
			im.U64(blob+16, cache)
			im.Syms["lsm_names"] = im.Alloc(8)
			im.U64(im.Syms["lsm_names"], im.Str(tc.names))
			// rcu_head 16, IMA's pointer at 16, EVM's part at 24: 32.
			for sym, v := range map[string]byte{"blob_sizes": 32, "ima_blob_sizes": 16, "evm_blob_sizes": 24} {
				a := im.Alloc(28)
				im.Syms[sym] = a
				im.Write(a+8, []byte{v, 0, 0, 0})
			}
			g := buildImageGraph(t, im)
			at, ok := g.TypeAt(cache)
			if !tc.typed {
				if ok {
					t.Errorf("typed %+v with a layout that does not add up", at)
				}
				return
			}
			if !ok || at.Type != "ima_iint_cache" || len(at.Chain) != 2 || at.Chain[1].Member != "lsm_inode_blob.ima" {
				t.Fatalf("IMA's cache: %+v, want ima_iint_cache through lsm_inode_blob.ima", at)
			}
		})
	}
}
