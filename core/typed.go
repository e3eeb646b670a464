package core

import (
	"debug/elf"
	"errors"
	"fmt"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/kernel/typed"
)

// TypedEnv is the typed view of k, for C expressions and typed objects
// (kernel/typed): its memory, BTF and symbols, its per-CPU areas, and the
// types of variables that are not per-CPU from vmlinux's DWARF when
// vmlinux (a debug vmlinux) is given and has any (6.1's BTF types only
// per-CPU variables). done releases the DWARF.
func (k *Kernel) TypedEnv(vmlinux string) (e *typed.Env, done func(), err error) {
	types, err := k.Types()
	if err != nil {
		return nil, nil, err
	}
	syms, err := k.Symbols()
	if err != nil {
		return nil, nil, err
	}
	e = &typed.Env{
		Mem:    k,
		Spec:   types.Spec,
		Symbol: syms.Address,
		SymbolAt: func(a uint64) (string, bool) {
			s, off, ok := k.SymbolAt(a)
			if !ok {
				return "", false
			}
			name := fmt.Sprintf("%s+%#x", s.Name, off)
			if s.Module != "" {
				name += " [" + s.Module + "]"
			}
			return name, true
		},
		PerCPU: k.PerCPUAddr,
	}
	done = func() {}
	if vmlinux != "" && hasDWARF(vmlinux) {
		f, err := debuginfo.Open(vmlinux)
		if err != nil {
			return nil, nil, err
		}
		done = func() { f.Close() }
		e.VarType = func(name string) (btf.Type, error) {
			t, err := f.Variable(name)
			if errors.Is(err, debuginfo.ErrNoVariable) {
				return nil, fmt.Errorf("%w: %v", typed.ErrNoType, err)
			}
			if err != nil {
				return nil, err
			}
			return e.FromDWARF(t)
		}
	}
	return e, done, nil
}

// hasDWARF says whether the ELF file at path has a .debug_info section.
func hasDWARF(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Section(".debug_info") != nil
}
