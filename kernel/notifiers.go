package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrNoDieChain is returned when the kernel has no die_chain symbol
// (kallsyms without data symbols): its notifiers cannot be named.
var ErrNoDieChain = errors.New("die_chain not among the symbols")

// DieNotifier is one notifier_block on the kernel's die chain.
type DieNotifier struct {
	Func     uint64 // notifier_call
	Priority int32
}

// maxDieNotifiers bounds the walk of die_chain: a kernel registers a
// handful (hw_breakpoint, kprobes, uprobes, kgdb, kinst's own).
const maxDieNotifiers = 256

// DieNotifiers reads the kernel's die chain (die_chain in
// kernel/notifier.c, an atomic_notifier_head) in call order: highest
// priority first, and among equal priorities the first registered first.
// notify_die calls every one of them for each int3 in kernel mode (and
// each #DB, #UD, #GP, …) until one says it handled it; those before
// kinst's own run before kinst's redirect, so a splice's int3 in one of
// them recurses until the NMI nesting count overflows (BUG in
// irqentry_nmi_enter). Present in every kernel kinst knows (2.6 on); the
// layout comes from BTF.
func (p *Program) DieNotifiers() ([]DieNotifier, error) {
	syms, err := p.KernelSymbols()
	if err != nil {
		return nil, err
	}
	chain, ok := syms.Address("die_chain")
	if !ok {
		return nil, ErrNoDieChain
	}
	t, err := p.Types()
	if err != nil {
		return nil, err
	}
	head, err1 := t.Field("atomic_notifier_head", "head", 8)
	call, err2 := t.Field("notifier_block", "notifier_call", 8)
	next, err3 := t.Field("notifier_block", "next", 8)
	prio, err4 := t.Field("notifier_block", "priority", 4)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	return readDieChain(p.mem, chain+uint64(head.Off), call, next, prio)
}

// readDieChain walks the notifier_block list whose first pointer is at
// first.
func readDieChain(r Reader, first uint64, call, next, prio Field) ([]DieNotifier, error) {
	size := max(call.Off+8, next.Off+8, prio.Off+4)
	b := make([]byte, size)
	nb, err := readU64(r, first)
	if err != nil {
		return nil, fmt.Errorf("die_chain: %w", err)
	}
	var out []DieNotifier
	seen := map[uint64]bool{}
	for nb != 0 {
		if seen[nb] || len(out) >= maxDieNotifiers {
			return out, fmt.Errorf("die_chain: the list does not end (at notifier_block %#x)", nb)
		}
		seen[nb] = true
		if err := r.Read(nb, b); err != nil {
			return out, fmt.Errorf("die_chain: notifier_block %#x: %w", nb, err)
		}
		out = append(out, DieNotifier{
			Func:     binary.LittleEndian.Uint64(b[call.Off:]),
			Priority: int32(binary.LittleEndian.Uint32(b[prio.Off:])),
		})
		nb = binary.LittleEndian.Uint64(b[next.Off:])
	}
	return out, nil
}

// readU64 reads one little-endian 64-bit word from r.
func readU64(r Reader, addr uint64) (uint64, error) {
	var b [8]byte
	if err := r.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}
