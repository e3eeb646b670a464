package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/typeid"
	"github.com/kinst/kinst/core/vfs"
	"github.com/kinst/kinst/kernel/typed"
)

// maxListEntries bounds `list`: a corrupt list ends there with an error.
const maxListEntries = 1 << 20

// typedEnv is the typed view of k: its BTF and symbols, its per-CPU
// areas, and the variables' types from vmlinux's DWARF when vmlinux (a
// debug vmlinux) is given and has any.
func typedEnv(k *core.Kernel, vmlinux string) (*typed.Env, func(), error) {
	e, done, err := k.TypedEnv(vmlinux)
	if err != nil {
		return nil, nil, err
	}
	e.Describe = describer(k)
	return e, done, nil
}

// address is where expr says an object is: a bare symbol's address, an
// object's in memory, or the value of a number or pointer.
func address(e *typed.Env, expr string) (uint64, error) {
	if a, ok := e.Symbol(expr); ok {
		return a, nil
	}
	v, err := e.Eval(expr)
	if err != nil {
		return 0, err
	}
	return e.Address(v)
}

// CorePrint is `kinst core DUMP p EXPR`: the value of a C expression over
// the kernel's variables and addresses, as crash's print shows it.
func CorePrint(k *core.Kernel, vmlinux, expr string, asJSON bool, w io.Writer) error {
	n, err := printValue(k, vmlinux, expr)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, n)
	}
	writePrint(w, expr, n)
	return nil
}

// printValue is p's answer.
func printValue(k *core.Kernel, vmlinux, expr string) (typed.Node, error) {
	e, done, err := typedEnv(k, vmlinux)
	if err != nil {
		return typed.Node{}, err
	}
	defer done()
	v, err := e.Eval(expr)
	if err != nil {
		return typed.Node{}, err
	}
	return e.Tree(expr, v), nil
}

// CoreStruct is `kinst core DUMP struct T ADDR [-m MEMBER,…]`: the struct
// of type T at ADDR, every member or the ones named, as crash's struct
// command prints it. T may carry the members after a dot, as crash
// spells it: task_struct.pid,comm.
func CoreStruct(k *core.Kernel, vmlinux, typ, at string, members []string, asJSON bool, w io.Writer) error {
	n, err := structValue(k, vmlinux, typ, at, members)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, n)
	}
	writeStruct(w, n)
	return nil
}

// structValue is struct's answer.
func structValue(k *core.Kernel, vmlinux, typ, at string, members []string) (typed.Node, error) {
	e, done, err := typedEnv(k, vmlinux)
	if err != nil {
		return typed.Node{}, err
	}
	defer done()
	typ, ms := splitMembers(typ)
	members = append(ms, members...)
	t, err := lookupStruct(e, typ)
	if err != nil {
		return typed.Node{}, err
	}
	a, err := address(e, at)
	if err != nil {
		return typed.Node{}, err
	}
	n := e.Tree("", typed.Value{Type: t, Addr: a, InMem: true})
	if len(members) > 0 {
		return typed.Select(n, members)
	}
	return n, nil
}

// splitMembers splits crash's "T.m1,m2" into T and the members.
func splitMembers(typ string) (string, []string) {
	typ = strings.TrimPrefix(strings.TrimSpace(typ), "struct ")
	t, ms, ok := strings.Cut(typ, ".")
	if !ok {
		return typ, nil
	}
	return t, strings.Split(ms, ",")
}

// lookupStruct finds a struct or union by name (with or without its
// keyword).
func lookupStruct(e *typed.Env, name string) (btf.Type, error) {
	if strings.HasPrefix(name, "union ") {
		return e.LookupType(name)
	}
	t, err := e.LookupType("struct " + strings.TrimPrefix(name, "struct "))
	if err != nil {
		if u, uerr := e.LookupType("union " + name); uerr == nil {
			return u, nil
		}
	}
	return t, err
}

// ListEntry is one entry of `kinst core DUMP list … --json`.
type ListEntry struct {
	Address string       `json:"address"`
	Members []typed.Node `json:"members,omitempty"`
}

// CoreList is `kinst core DUMP list STRUCT.MEMBER -H HEAD [-s MEMBER,…]`:
// the structs on the list_head at HEAD (an expression: an object in
// memory, or a pointer or address), linked through MEMBER, in order;
// with -s, the named members of each, as crash's list prints them. A
// list that breaks or loops is printed up to there, then the error.
func CoreList(k *core.Kernel, vmlinux, spec, head string, show []string, asJSON bool, w io.Writer) error {
	out, walkErr := listValue(k, vmlinux, spec, head, show)
	if asJSON {
		if out == nil {
			out = []ListEntry{}
		}
		if err := writeJSON(w, out); err != nil {
			return err
		}
		return walkErr
	}
	writeList(w, out)
	return walkErr
}

// writeList prints list's entries as crash does: an address a line, the
// members asked for under it.
func writeList(w io.Writer, out []ListEntry) {
	for _, le := range out {
		fmt.Fprintln(w, le.Address)
		for _, m := range le.Members {
			fmt.Fprintf(w, "  %s = ", m.Name)
			typed.Write(w, m)
		}
	}
}

// writeStruct prints struct's answer: the type and address, then the
// members.
func writeStruct(w io.Writer, n typed.Node) {
	fmt.Fprintf(w, "%s %s ", n.Type, n.Address)
	typed.Write(w, n)
}

// writePrint prints p's answer: EXPR = VALUE.
func writePrint(w io.Writer, expr string, n typed.Node) {
	fmt.Fprintf(w, "%s = ", expr)
	typed.Write(w, n)
}

// listValue is list's answer: the entries read, and why the walk
// stopped short, if it did.
func listValue(k *core.Kernel, vmlinux, spec, head string, show []string) ([]ListEntry, error) {
	e, done, err := typedEnv(k, vmlinux)
	if err != nil {
		return nil, err
	}
	defer done()
	typ, path, linked := strings.Cut(strings.TrimPrefix(spec, "struct "), ".")
	if linked && path == "" {
		return nil, fmt.Errorf("list %s: want STRUCT.MEMBER, the member that links the entries", spec)
	}
	t, err := lookupStruct(e, typ)
	if err != nil {
		return nil, err
	}
	var addrs []uint64
	var walkErr error
	if linked {
		h, err := address(e, head)
		if err != nil {
			return nil, fmt.Errorf("list head %s: %w", head, err)
		}
		addrs, walkErr = e.ListEntries(h, t, path, maxListEntries)
	} else {
		// No member: HEAD is an xarray (or an IDR, whose root is one)
		// holding pointers to STRUCT.
		xa, err := xarrayOf(e, head)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w (list STRUCT.MEMBER walks a linked list)", spec, err)
		}
		addrs, walkErr = e.XArrayEntries(xa, maxListEntries)
	}
	var out []ListEntry
	for _, a := range addrs {
		le := ListEntry{Address: fmt.Sprintf("%#x", a)}
		if len(show) > 0 {
			n, err := typed.Select(e.Tree("", typed.Value{Type: t, Addr: a, InMem: true}), show)
			if err != nil {
				return out, err
			}
			le.Members = n.Members
		}
		out = append(out, le)
	}
	return out, walkErr
}

// xarrayOf is the address of the struct xarray expr names: an xarray, or
// an IDR's root (idr_rt).
func xarrayOf(e *typed.Env, expr string) (uint64, error) {
	v, err := e.Eval(expr)
	if err != nil {
		return 0, fmt.Errorf("-H %s: %w", expr, err)
	}
	if s, ok := btf.UnderlyingType(v.Type).(*btf.Struct); ok && s.Name == "idr" {
		if v, err = e.Member(v, "idr_rt"); err != nil {
			return 0, err
		}
	}
	if s, ok := btf.UnderlyingType(v.Type).(*btf.Struct); !ok || s.Name != "xarray" {
		return 0, fmt.Errorf("-H %s has type %s, not struct xarray or idr", expr, typed.TypeString(v.Type))
	}
	return e.Address(v)
}

// FilesReport is `kinst core DUMP files PID --json`.
type FilesReport struct {
	PID   int        `json:"pid"`
	Task  string     `json:"task"`
	Comm  string     `json:"comm"`
	Files []vfs.File `json:"files"`
}

// CoreFiles is `kinst core DUMP files PID|TASK`: a task's open files,
// as crash's files prints them.
func CoreFiles(k *core.Kernel, which uint64, asJSON bool, w io.Writer) error {
	t, err := findTask(k, which)
	if err != nil {
		return err
	}
	r, _, done, err := vfsReader(k)
	if err != nil {
		return err
	}
	defer done()
	fs, err := r.Files(t.Addr)
	if err != nil {
		return fmt.Errorf("files of pid %d: %w", t.PID, err)
	}
	rep := FilesReport{PID: t.PID, Task: t.Address, Comm: t.Comm, Files: fs}
	if rep.Files == nil {
		rep.Files = []vfs.File{}
	}
	if asJSON {
		return writeJSON(w, rep)
	}
	fmt.Fprintf(w, "PID: %d  TASK: %s  COMMAND: %q\n", t.PID, t.Address, t.Comm)
	tw := newTable(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, " FD\tFILE\tDENTRY\tINODE\tTYPE\tPATH")
	for _, f := range fs {
		fmt.Fprintf(tw, "%3d\t%s\t%s\t%s\t%s\t%s\n", f.FD, f.File, f.Dentry, f.Inode, f.Type, withError(f.Path, f.Error))
	}
	return tw.Flush()
}

// CoreMount is `kinst core DUMP mount`: the mounts of init's mount
// namespace (the first task's, else init_task's), as crash's mount
// prints them.
func CoreMount(k *core.Kernel, asJSON bool, w io.Writer) error {
	r, e, done, err := vfsReader(k)
	if err != nil {
		return err
	}
	defer done()
	var nsExpr string
	if t, err := findTask(k, 1); err == nil {
		nsExpr = fmt.Sprintf("((struct task_struct *)%#x)->nsproxy->mnt_ns", t.Addr)
	} else if a, ok := e.Symbol("init_task"); ok {
		nsExpr = fmt.Sprintf("((struct task_struct *)%#x)->nsproxy->mnt_ns", a)
	} else {
		return errors.New("mount: neither pid 1 nor init_task to take the mount namespace from")
	}
	nsv, err := e.Eval(nsExpr)
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	ns, err := e.Uint(nsv)
	if err != nil {
		return err
	}
	ms, err := r.Mounts(ns)
	if err != nil {
		return err
	}
	if asJSON {
		if ms == nil {
			ms = []vfs.Mount{}
		}
		return writeJSON(w, ms)
	}
	tw := newTable(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "MOUNT\tSUPERBLK\tTYPE\tDEVNAME\tDIRNAME")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Mount, m.SuperBlock, m.Type, m.Device, withError(m.Dir, m.Error))
	}
	return tw.Flush()
}

// vfsReader is the file and mount reader of k, and the typed view it
// reads through.
func vfsReader(k *core.Kernel) (*vfs.Reader, *typed.Env, func(), error) {
	e, done, err := typedEnv(k, "")
	if err != nil {
		return nil, nil, nil, err
	}
	r, err := vfs.New(e)
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	return r, e, done, nil
}

// findTask is the task with pid which, or whose task_struct is at which.
func findTask(k *core.Kernel, which uint64) (core.Task, error) {
	tasks, err := k.Tasks()
	if err != nil {
		return core.Task{}, err
	}
	for _, t := range tasks {
		if uint64(t.PID) == which || t.Addr == which {
			return t, nil
		}
	}
	return core.Task{}, fmt.Errorf("no task has pid or address %d (%#x)", which, which)
}

// withError is s, then why it is incomplete in angle brackets, as crash
// marks what it could not read.
func withError(s, why string) string {
	if why == "" {
		return s
	}
	return s + " <" + why + ">"
}

// describer says what a heap address is, as whattype does from its cache
// alone (no type graph): "task_struct+0x10", "kmalloc-64 object+0x8",
// "stack of pid 42". The heap is walked on the first pointer that needs
// it, once.
func describer(k *core.Kernel) func(uint64) (string, bool) {
	var once sync.Once
	var id *typeid.Identifier
	return func(a uint64) (string, bool) {
		if a < kernelHalf {
			return "", false
		}
		once.Do(func() {
			if h, err := openHeap(k); err == nil {
				id, _ = typeid.New(kernelView{k}, h)
			}
		})
		if id == nil {
			return "", false
		}
		r, err := id.WhatType(a)
		if err != nil {
			return "", false
		}
		switch {
		case r.Kind == typeid.KindStack && r.Task != nil:
			return fmt.Sprintf("stack of pid %d", r.Task.PID), true
		case r.Kind != typeid.KindSlab || r.Cache == nil:
			return "", false
		}
		off := int64(0)
		if r.Offset != nil {
			off = *r.Offset
		}
		what := *r.Cache + " object"
		if r.Type != nil {
			what = *r.Type
		}
		if off != 0 {
			what += fmt.Sprintf("+%#x", off)
		}
		if r.State != nil && *r.State == "free" {
			what += ", free"
		}
		return what, true
	}
}
