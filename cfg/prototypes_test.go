package cfg

import (
	"testing"

	"github.com/kinst/kinst/kernel"
)

func TestPrototypeRegisters(t *testing.T) {
	p := kernel.Prototypes{
		"two_args_void": {ArgRegs: 2, RetRegs: 0},
		"varargs":       {ArgRegs: 6, RetRegs: 1},
		"pair":          {ArgRegs: 0, RetRegs: 2},
	}
	for _, tc := range []struct {
		name      string
		args, ret LiveSet
	}{
		{"two_args_void", regRDI | regRSI, 0},
		{"varargs", argRegs, regRAX},
		{"pair", 0, retRegs},
		{"unknown", argRegs, retRegs}, // no BTF: everything may be read and returned
	} {
		if s := argSet(p, tc.name); s != tc.args {
			t.Errorf("argSet(%s) = %v, want %v", tc.name, s, tc.args)
		}
		if s := retSet(p, tc.name); s != tc.ret {
			t.Errorf("retSet(%s) = %v, want %v", tc.name, s, tc.ret)
		}
	}
}
