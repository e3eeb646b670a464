// Package dumpview is the crash-dump backend of the kernel view
// (kernel.Program): it turns the physical memory and notes a core/dump
// reader provides into kernel virtual memory (x86-64 4- and 5-level page
// walks, the kernel image mapping, KASLR and phys_base from VMCOREINFO),
// symbols (the kallsyms tables in the dump's memory, and the modules'
// own), and types (BTF from __start_BTF…__stop_BTF, or a vmlinux / BTF
// file). Everything else, the module list and per-CPU data included, is
// the kernel view's and reads the same as on a live kernel.
//
// Kernel-version caveats: the kallsyms tables are located through
// VMCOREINFO, which exports them since Linux 6.0. Only x86-64 dumps are
// understood.
package dumpview

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/kernel"
)

// ErrWrongTypes: BTF given beside the dump describes another kernel.
var ErrWrongTypes = errors.New("types from another kernel")

// ErrMissing: the dump lacks information a request needs.
var ErrMissing = errors.New("missing from the dump")

// MissingError names what the dump lacks and where it was looked for; it
// matches ErrMissing.
type MissingError struct{ What, Where string }

// ErrNotKernel is matched by the error of New for a dump that is not a
// kernel's: a user process's core.
var ErrNotKernel = errors.New("not a kernel dump")

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s not found in %s", e.What, e.Where)
}
func (e *MissingError) Is(t error) bool { return t == ErrMissing }

// Options selects alternative sources of types.
type Options struct {
	// BTF is a raw BTF file or an ELF (vmlinux) with a .BTF section, used
	// instead of the BTF in the dump's memory.
	BTF string
	// Vmlinux is the kernel's ELF image; its .BTF section is used
	// instead of the dump's copy.
	Vmlinux string
	// FallbackBTF is a BTF file used when the dump's memory holds none
	// that can be read (a live kernel's /sys/kernel/btf/vmlinux); it
	// must agree with VMCOREINFO's layouts as BTF does.
	FallbackBTF string
}

// View is a Linux crash dump seen as a kernel: the kernel view
// (kernel.Program) over the dump's memory, with what only a dump has:
// the container, its VMCOREINFO and the address translation. A View is
// safe for concurrent use.
type View struct {
	*kernel.Program
	Dump dump.Dump
	Info *VMCoreInfo

	physBase uint64 // NUMBER(phys_base), two's complement
	imageEnd uint64 // end of the kernel image mapping
	pgd      uint64 // physical address of the kernel's top-level page table
	levels   int    // 4 or 5

	mu  sync.Mutex        // protects tlb
	tlb map[uint64]uint64 // virtual page → physical page (or notMapped)
}

// Open opens a dump and prepares its kernel view.
func Open(path string, o Options) (*View, error) {
	d, err := dump.Open(path)
	if err != nil {
		return nil, err
	}
	v, err := New(d, o)
	if err != nil {
		d.Close()
		return nil, err
	}
	return v, nil
}

// New builds the kernel view of an opened dump; the View owns d. The dump
// must carry VMCOREINFO (QEMU's -device vmcoreinfo with the guest's
// qemu_fw_cfg module, or kdump).
func New(d dump.Dump, o Options) (*View, error) {
	if _, ok := d.(*dump.Minidump); ok {
		return nil, errors.New("a FreeBSD minidump has no Linux kernel view")
	}
	text := d.VMCoreInfo()
	if e, ok := d.(*dump.ELF); ok && text == "" && e.Process() != nil {
		p := e.Process()
		return nil, fmt.Errorf("this is the core of a user process (pid %d, %s: %q), %w: kinst core reads a kernel's (kdump's vmcore, QEMU's dump-guest-memory, /proc/kcore), gdb a process's", p.PID, p.Name, p.Args, ErrNotKernel)
	}
	if text == "" {
		return nil, &MissingError{What: "VMCOREINFO", Where: "the dump's notes (boot QEMU with -device vmcoreinfo and load qemu_fw_cfg in the guest, or take the dump with kdump)"}
	}
	info, err := ParseVMCoreInfo(text)
	if err != nil {
		return nil, err
	}
	v := &View{Dump: d, Info: info, tlb: map[uint64]uint64{}, levels: 4}
	v.physBase = uint64(info.Numbers["phys_base"])
	size := uint64(info.Numbers["KERNEL_IMAGE_SIZE"])
	if size == 0 {
		size = 1 << 30
	}
	v.imageEnd = startKernelMap + size
	if info.Numbers["pgtable_l5_enabled"] == 1 {
		v.levels = 5
	}
	// The kernel's own top-level table, not a CPU's CR3: an idle CPU runs
	// on a borrowed user mm (lazy TLB), whose kernel half is the same but
	// whose pages a dumper may have excluded. CR3 is the fallback.
	top, ok := info.Symbols["init_top_pgt"]
	if !ok {
		top, ok = info.Symbols["swapper_pg_dir"]
	}
	switch {
	case ok:
		v.pgd = top - startKernelMap + v.physBase
	case len(d.CPUs()) > 0 && d.CPUs()[0].Regs.CR3 != 0:
		v.pgd = d.CPUs()[0].Regs.CR3 & pteAddrMask
	default:
		return nil, &MissingError{What: "the kernel page table (SYMBOL(init_top_pgt) or CR3)", Where: "VMCOREINFO and the CPU notes"}
	}
	v.Program = kernel.New(kernel.Source{
		Memory:        memory{v},
		Symbols:       v.loadKallsyms,
		Types:         func(p *kernel.Program) (*kernel.Types, error) { return loadTypes(p, o, info) },
		ModuleSymbols: true,
		Release:       info.OSRelease,
	})
	return v, nil
}

// Close closes the dump.
func (v *View) Close() error { return v.Dump.Close() }

// memory is the dump's kernel virtual memory as the view reads it.
type memory struct{ v *View }

func (m memory) Read(addr uint64, b []byte) error { return m.v.ReadVirt(b, addr) }

func (v *View) loadKallsyms() (*kernel.Symbols, error) {
	a, err := v.Info.Need("kallsyms_names", "kallsyms_num_syms", "kallsyms_token_table", "kallsyms_token_index", "kallsyms_offsets", "kallsyms_relative_base")
	if err != nil {
		return nil, fmt.Errorf("kallsyms: %w (VMCOREINFO exports the kallsyms tables since Linux 6.0)", err)
	}
	s, err := kernel.ReadKallsyms(memory{v}, kernel.KallsymsTables{Names: a[0], NumSyms: a[1], TokenTable: a[2], TokenIndex: a[3], Offsets: a[4], RelativeBase: a[5]})
	if err != nil {
		return nil, fmt.Errorf("kallsyms: %w", err)
	}
	return s, nil
}

// loadTypes reads the BTF of Options.BTF or Options.Vmlinux when given,
// else the one in the dump's memory between __start_BTF and __stop_BTF
// (CONFIG_DEBUG_INFO_BTF keeps it in .BTF, mapped with the image). A
// file's BTF must agree with the layouts VMCOREINFO records.
func loadTypes(p *kernel.Program, o Options, info *VMCoreInfo) (*kernel.Types, error) {
	for _, f := range []string{o.BTF, o.Vmlinux} {
		if f != "" {
			t, err := kernel.LoadTypes(f)
			if err != nil {
				return nil, fmt.Errorf("BTF: %w", err)
			}
			if err := CheckTypes(t, info); err != nil {
				return nil, fmt.Errorf("BTF of %s: %w", f, err)
			}
			return t, nil
		}
	}
	t, err := kernel.ReadTypes(p)
	if err != nil && o.FallbackBTF != "" {
		if ft, ferr := kernel.LoadTypes(o.FallbackBTF); ferr == nil && CheckTypes(ft, info) == nil {
			return ft, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("BTF: %w (kernel built without CONFIG_DEBUG_INFO_BTF? pass --btf or --vmlinux)", err)
	}
	return t, nil
}

// CheckTypes compares the struct sizes and member offsets VMCOREINFO
// records (SIZE(page), OFFSET(page.flags), OFFSET(printk_info.seq)…) with
// BTF's; entries BTF cannot resolve are skipped. A disagreement means the
// BTF is of another kernel (build or configuration); the error matches
// ErrWrongTypes and names the first few.
func CheckTypes(t *kernel.Types, info *VMCoreInfo) error {
	var bad []string
	checked := 0
	for _, name := range slices.Sorted(maps.Keys(info.Sizes)) {
		if got, err := t.Size(name); err == nil {
			checked++
			if want := info.Sizes[name]; int64(got) != want {
				bad = append(bad, fmt.Sprintf("SIZE(%s) is %d in VMCOREINFO, %d in the BTF", name, want, got))
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(info.Offsets)) {
		st, path, ok := strings.Cut(key, ".")
		if !ok {
			continue
		}
		if got, err := t.Offset(st, path); err == nil {
			checked++
			if want := info.Offsets[key]; int64(got) != want {
				bad = append(bad, fmt.Sprintf("OFFSET(%s) is %d in VMCOREINFO, %d in the BTF", key, want, got))
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	more := ""
	if len(bad) > 3 {
		more = fmt.Sprintf(" (and %d more)", len(bad)-3)
		bad = bad[:3]
	}
	return fmt.Errorf("%w: the dump's kernel is %q, and of %d layouts VMCOREINFO records, %s%s",
		ErrWrongTypes, info.OSRelease, checked, strings.Join(bad, "; "), more)
}
