package kernel

import (
	"errors"
	"fmt"
)

// ErrNoCPU is matched by errors for a CPU the kernel does not have.
var ErrNoCPU = errors.New("no such CPU")

// PerCPU data: each CPU has its own copy of every per-CPU variable, at the
// variable's symbol value (an offset, which KASLR does not move) plus the
// CPU's base, __per_cpu_offset[cpu]. x86-64 SMP kernels only (the
// per-CPU offset array is what x86's setup_per_cpu_areas fills).

// NumCPUs is nr_cpu_ids: how many CPU ids the kernel uses (possible CPUs,
// not the online ones).
func (p *Program) NumCPUs() (int, error) {
	return p.ncpu.get(func() (int, error) {
		syms, err := p.KernelSymbols()
		if err != nil {
			return 0, err
		}
		a, ok := syms.Address("nr_cpu_ids")
		if !ok {
			return 0, &NoSymbolError{Name: "nr_cpu_ids"}
		}
		n, err := p.ReadU32(a)
		if err != nil {
			return 0, fmt.Errorf("nr_cpu_ids: %w", err)
		}
		if n == 0 || n > 1<<16 {
			return 0, fmt.Errorf("nr_cpu_ids = %d is not plausible", n)
		}
		return int(n), nil
	})
}

// PerCPUOffset returns CPU cpu's per-CPU base.
func (p *Program) PerCPUOffset(cpu int) (uint64, error) {
	offs, err := p.percpu.get(func() (uint64, error) {
		syms, err := p.KernelSymbols()
		if err != nil {
			return 0, err
		}
		a, ok := syms.Address("__per_cpu_offset")
		if !ok {
			return 0, &NoSymbolError{Name: "__per_cpu_offset"}
		}
		return a, nil
	})
	if err != nil {
		return 0, err
	}
	if n, err := p.NumCPUs(); cpu < 0 || (err == nil && cpu >= n) {
		return 0, fmt.Errorf("CPU %d: %w", cpu, ErrNoCPU)
	}
	base, err := p.ReadU64(offs + 8*uint64(cpu))
	if err != nil {
		return 0, fmt.Errorf("__per_cpu_offset[%d]: %w", cpu, err)
	}
	return base, nil
}

// PerCPUAddr returns the address of CPU cpu's copy of the per-CPU
// variable whose symbol value (offset) is v.
func (p *Program) PerCPUAddr(v uint64, cpu int) (uint64, error) {
	base, err := p.PerCPUOffset(cpu)
	return base + v, err
}

// PerCPUVar returns the address of CPU cpu's copy of the per-CPU
// variable called name.
func (p *Program) PerCPUVar(name string, cpu int) (uint64, error) {
	syms, err := p.KernelSymbols()
	if err != nil {
		return 0, err
	}
	v, ok := syms.Address(name)
	if !ok {
		return 0, &NoSymbolError{Name: name}
	}
	return p.PerCPUAddr(v, cpu)
}

// ReadPerCPU reads CPU cpu's copy of the per-CPU variable called name
// into b.
func (p *Program) ReadPerCPU(name string, cpu int, b []byte) error {
	a, err := p.PerCPUVar(name, cpu)
	if err != nil {
		return err
	}
	return p.Read(a, b)
}
