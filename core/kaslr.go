package core

import (
	"debug/elf"
	"fmt"
)

// defaultKernelText is where an x86-64 kernel is linked by default:
// __START_KERNEL_map plus CONFIG_PHYSICAL_START (0x1000000), the address
// of _text before KASLR slides it.
const defaultKernelText = 0xffffffff81000000

// KernelOffsetProblem checks VMCOREINFO's KERNELOFFSET against the
// symbols: kallsyms' _text less the offset must be where the kernel is
// linked (the vmlinux's _text with Options.Vmlinux, else x86-64's
// default), and VMCOREINFO's own SYMBOL(_stext) must be kallsyms'
// _stext. It returns "" when they agree or cannot be compared, else what
// disagrees.
func (k *Kernel) KernelOffsetProblem() string {
	s, err := k.KernelSymbols()
	if err != nil {
		return ""
	}
	off := k.Info.KernelOffset
	if a, ok := s.Address("_stext"); ok {
		if v, ok := k.Info.Symbols["_stext"]; ok && v != a {
			return fmt.Sprintf("VMCOREINFO puts _stext at %#x, kallsyms at %#x: the VMCOREINFO is of another boot", v, a)
		}
	}
	text, ok := s.Address("_text")
	if !ok {
		return ""
	}
	link, where := uint64(defaultKernelText), "x86-64's default link address"
	if k.opts.Vmlinux != "" {
		if a, ok := elfSymbol(k.opts.Vmlinux, "_text"); ok {
			link, where = a, "_text in "+k.opts.Vmlinux
		}
	}
	if text-off != link {
		return fmt.Sprintf("KERNELOFFSET %#x disagrees with the symbols: kallsyms has _text at %#x, which is %s (%#x) plus %#x", off, text, where, link, text-link)
	}
	return ""
}

// elfSymbol is a symbol's value in an ELF file's symbol table.
func elfSymbol(path, name string) (uint64, bool) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return 0, false
	}
	for _, s := range syms {
		if s.Name == name {
			return s.Value, true
		}
	}
	return 0, false
}
