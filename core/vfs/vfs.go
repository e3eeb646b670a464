// Package vfs reads a kernel's files and mounts out of its memory, as
// crash's files and mount commands do: a task's open files with their
// paths, and a mount namespace's mounts. It walks the kernel's own
// structures through kernel/typed, so what it reads is what BTF says the
// layout is:
//
//   - a task's files: task_struct.files → files_struct.fdt → fdtable's fd
//     array of max_fds struct file pointers;
//   - a path: dentries up through d_parent to their mount's root, then to
//     the mount point in the parent mount (struct mount, which holds the
//     vfsmount), until the namespace's root mount;
//   - a namespace's mounts: mnt_namespace.list of mount.mnt_list before
//     6.8, the rb-tree mnt_namespace.mounts of mount.mnt_node after.
package vfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/kernel/typed"
)

// maxDepth bounds a path's components and maxMounts a namespace's
// mounts: a corrupt dump must not walk for ever.
const (
	maxDepth  = 256
	maxMounts = 1 << 16
	maxFDs    = 1 << 20
)

// File is one open file of a task; its JSON is `kinst core DUMP files
// PID --json`'s.
type File struct {
	FD     int    `json:"fd"`
	File   string `json:"file"` // struct file
	Dentry string `json:"dentry"`
	Inode  string `json:"inode"`
	Type   string `json:"type"` // REG DIR CHR BLK FIFO SOCK LNK, from i_mode
	Path   string `json:"path"`
	Error  string `json:"error,omitempty"` // what of it could not be read
}

// Mount is one mount of a namespace; its JSON is `kinst core DUMP mount
// --json`'s.
type Mount struct {
	Mount      string `json:"mount"` // struct mount
	SuperBlock string `json:"super_block"`
	Type       string `json:"type"` // the file system type's name
	Device     string `json:"device"`
	Dir        string `json:"dir"` // where it is mounted
	Error      string `json:"error,omitempty"`
}

// Reader reads a kernel's structures by type.
type Reader struct {
	e                                 *typed.Env
	task, file, mount, ns, dentry, sb btf.Type
	fdtable                           btf.Type
	mntOff                            uint64 // of the vfsmount in struct mount
}

// New prepares a reader over e; it fails if BTF lacks the structs.
func New(e *typed.Env) (*Reader, error) {
	r := &Reader{e: e}
	for _, t := range []struct {
		p    *btf.Type
		name string
	}{{&r.task, "task_struct"}, {&r.file, "file"}, {&r.mount, "mount"}, {&r.ns, "mnt_namespace"}, {&r.dentry, "dentry"}, {&r.sb, "super_block"}, {&r.fdtable, "fdtable"}} {
		var err error
		if *t.p, err = e.LookupType("struct " + t.name); err != nil {
			return nil, err
		}
	}
	var err error
	if r.mntOff, err = typed.OffsetOf(r.mount, "mnt"); err != nil {
		return nil, err
	}
	return r, nil
}

// follow is the member path of v, each "->" a pointer followed on the
// way: "f_inode->i_mode".
func (r *Reader) follow(v typed.Value, path string) (typed.Value, error) {
	for i, part := range strings.Split(path, "->") {
		var err error
		if i > 0 {
			if v, err = r.e.Deref(v); err != nil {
				return typed.Value{}, err
			}
		}
		if v, err = r.e.Member(v, part); err != nil {
			return typed.Value{}, err
		}
	}
	return v, nil
}

// ptr is the pointer at path in v.
func (r *Reader) ptr(v typed.Value, path string) (uint64, error) {
	m, err := r.e.Member(v, path)
	if err != nil {
		return 0, err
	}
	return r.e.Uint(m)
}

// Files lists the open files of the task_struct at task.
func (r *Reader) Files(task uint64) ([]File, error) {
	files, err := r.e.Member(typed.Object(r.task, task), "files")
	if err != nil {
		return nil, err
	}
	fs, err := r.e.Deref(files)
	if err != nil {
		return nil, fmt.Errorf("the task's files: %w (a kernel thread's, or an exiting task's)", err)
	}
	fdt, err := r.ptr(fs, "fdt")
	if err != nil {
		return nil, err
	}
	tab := typed.Object(r.fdtable, fdt)
	maxv, err := r.e.Member(tab, "max_fds")
	if err != nil {
		return nil, err
	}
	n, err := r.e.Uint(maxv)
	if err != nil {
		return nil, err
	}
	if n > maxFDs {
		return nil, fmt.Errorf("fdtable at %#x claims %d descriptors: not a file table", fdt, n)
	}
	fdArr, err := r.ptr(tab, "fd")
	if err != nil {
		return nil, err
	}
	ptrs := make([]byte, 8*n)
	if err := r.e.Mem.Read(fdArr, ptrs); err != nil {
		return nil, fmt.Errorf("fd array at %#x: %w", fdArr, err)
	}
	var out []File
	for i := range int(n) {
		f := binary.LittleEndian.Uint64(ptrs[8*i:])
		if f == 0 {
			continue
		}
		out = append(out, r.fileAt(i, f))
	}
	return out, nil
}

// fileAt describes the struct file at f, open as fd.
func (r *Reader) fileAt(fd int, f uint64) File {
	out := File{FD: fd, File: hex(f)}
	fv := typed.Object(r.file, f)
	mnt, err1 := r.ptr(fv, "f_path.mnt")
	dentry, err2 := r.ptr(fv, "f_path.dentry")
	inode, err3 := r.ptr(fv, "f_inode")
	if err := errors.Join(err1, err2, err3); err != nil {
		out.Error = err.Error()
		return out
	}
	out.Dentry, out.Inode = hex(dentry), hex(inode)
	if mode, err := r.follow(fv, "f_inode->i_mode"); err == nil {
		if m, err := r.e.Uint(mode); err == nil {
			out.Type = fileType(m)
		}
	}
	p, err := r.Path(mnt, dentry)
	if err != nil {
		out.Error = err.Error()
	}
	out.Path = p
	return out
}

// fileType is S_IFMT of mode as crash prints it.
func fileType(mode uint64) string {
	switch mode & 0o170000 {
	case 0o100000:
		return "REG"
	case 0o040000:
		return "DIR"
	case 0o020000:
		return "CHR"
	case 0o060000:
		return "BLK"
	case 0o010000:
		return "FIFO"
	case 0o140000:
		return "SOCK"
	case 0o120000:
		return "LNK"
	}
	return "?"
}

// Path is the path of dentry in the vfsmount mnt, from the root of the
// mount tree mnt is in, as d_path writes it (without a chroot's root).
func (r *Reader) Path(mnt, dentry uint64) (string, error) {
	mount := mnt - r.mntOff
	var parts []string
	for range maxDepth {
		mv := typed.Object(r.mount, mount)
		root, err := r.ptr(mv, "mnt.mnt_root")
		if err != nil {
			return "", err
		}
		parent, err := r.ptr(typed.Object(r.dentry, dentry), "d_parent")
		if err != nil {
			return "", err
		}
		if dentry == root || dentry == parent {
			up, err := r.ptr(mv, "mnt_parent")
			if err != nil {
				return "", err
			}
			if up == mount || up == 0 {
				if dentry != root && len(parts) == 0 {
					// A pseudo file system's dentry (a pipe, a
					// socket), named as its d_dname names it.
					return r.pseudoName(mount, dentry)
				}
				slices.Reverse(parts)
				return "/" + strings.Join(parts, "/"), nil
			}
			if dentry, err = r.ptr(mv, "mnt_mountpoint"); err != nil {
				return "", err
			}
			mount = up
			continue
		}
		name, err := r.name(dentry)
		if err != nil {
			return "", err
		}
		parts = append(parts, name)
		dentry = parent
	}
	return "", fmt.Errorf("the path of dentry %#x is deeper than %d: a loop", dentry, maxDepth)
}

// pseudoName is what /proc/PID/fd shows for a dentry of a kernel-internal
// mount: pipe:[INO], socket:[INO], anon_inode:NAME, else its own name.
func (r *Reader) pseudoName(mount, dentry uint64) (string, error) {
	name, err := r.name(dentry)
	if err != nil {
		return "", err
	}
	fs := ""
	if t, err := r.follow(typed.Object(r.mount, mount), "mnt.mnt_sb->s_type->name"); err == nil {
		fs, _ = r.e.String(t, 64)
	}
	ino := func() uint64 {
		v, err := r.follow(typed.Object(r.dentry, dentry), "d_inode->i_ino")
		if err != nil {
			return 0
		}
		n, _ := r.e.Uint(v)
		return n
	}
	switch fs {
	case "pipefs":
		return fmt.Sprintf("pipe:[%d]", ino()), nil
	case "sockfs":
		return fmt.Sprintf("socket:[%d]", ino()), nil
	case "anon_inodefs":
		return "anon_inode:" + name, nil
	}
	return name, nil
}

// name is a dentry's own name.
func (r *Reader) name(dentry uint64) (string, error) {
	n, err := r.e.Member(typed.Object(r.dentry, dentry), "d_name.name")
	if err != nil {
		return "", err
	}
	p, err := r.e.Uint(n)
	if err != nil {
		return "", err
	}
	return r.e.String(typed.Value{Type: n.Type, Imm: p}, 256)
}

// Mounts lists the mounts of the mnt_namespace at ns.
func (r *Reader) Mounts(ns uint64) ([]Mount, error) {
	nsv := typed.Object(r.ns, ns)
	var mounts []uint64
	if list, err := r.e.Member(nsv, "list"); err == nil {
		if mounts, err = r.e.ListEntries(list.Addr, r.mount, "mnt_list", maxMounts); err != nil {
			return nil, err
		}
	} else {
		// 6.8 and later: an rb-tree of mounts by id.
		root, err := r.ptr(nsv, "mounts.rb_node")
		if err != nil {
			return nil, fmt.Errorf("mnt_namespace has neither list nor mounts: %w", err)
		}
		off, err := typed.OffsetOf(r.mount, "mnt_node")
		if err != nil {
			return nil, err
		}
		nodes, err := r.e.RBNodes(root, maxMounts)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			mounts = append(mounts, n-off)
		}
	}
	var out []Mount
	for _, m := range mounts {
		out = append(out, r.mountAt(m))
	}
	return out, nil
}

// mountAt describes the struct mount at m.
func (r *Reader) mountAt(m uint64) Mount {
	out := Mount{Mount: hex(m)}
	mv := typed.Object(r.mount, m)
	sb, err := r.ptr(mv, "mnt.mnt_sb")
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.SuperBlock = hex(sb)
	if t, err := r.follow(mv, "mnt.mnt_sb->s_type->name"); err == nil {
		out.Type, _ = r.e.String(t, 64)
	}
	if d, err := r.e.Member(mv, "mnt_devname"); err == nil {
		out.Device, _ = r.e.String(d, 256)
	}
	root, err := r.ptr(mv, "mnt.mnt_root")
	if err != nil {
		out.Error = err.Error()
		return out
	}
	if out.Dir, err = r.Path(m+r.mntOff, root); err != nil {
		out.Error = err.Error()
	}
	return out
}

func hex(a uint64) string { return fmt.Sprintf("%#x", a) }
