package bpfkprobe

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// TestProgramEncodes checks the program assembles, that its one branch
// resolves to the exit path, and that it does an atomic 64-bit add of 1 to
// what the map lookup returned.
func TestProgramEncodes(t *testing.T) {
	insns := Program(3)
	var buf bytes.Buffer
	if err := insns.Marshal(&buf, binary.LittleEndian); err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var sawLookup, sawAdd bool
	for i, in := range insns {
		switch {
		case in.IsBuiltinCall() && in.Constant == int64(asm.FnMapLookupElem):
			sawLookup = true
		case in.OpCode.Class().IsStore() && in.OpCode.Mode() == asm.AtomicMode && in.OpCode.Size() == asm.DWord:
			if !sawLookup || in.Dst != asm.R0 {
				t.Errorf("insn %d: atomic add before the lookup or not to its result: %v", i, in)
			}
			sawAdd = true
		case in.OpCode.JumpOp() == asm.JEq:
			if in.Reference() != "out" {
				t.Errorf("insn %d: branch to %q, want out", i, in.Reference())
			}
		}
	}
	if !sawLookup || !sawAdd {
		t.Errorf("lookup %v, atomic add %v:\n%v", sawLookup, sawAdd, insns)
	}
	if last := insns[len(insns)-1]; last.OpCode.JumpOp() != asm.Exit {
		t.Errorf("last instruction %v, want exit", last)
	}
}
