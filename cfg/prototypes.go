package cfg

import "github.com/kinst/kinst/kernel"

// argOrder is the x86-64 calling convention's integer argument registers.
var argOrder = [kernel.MaxArgRegs]LiveSet{regRDI, regRSI, regRDX, regRCX, regR8, regR9}

// argSet is the argument registers a call to name reads.
func argSet(p kernel.Prototypes, name string) LiveSet {
	pr, ok := p[name]
	if !ok {
		return argRegs
	}
	var s LiveSet
	for i := 0; i < pr.ArgRegs; i++ {
		s |= argOrder[i]
	}
	return s
}

// retSet is what a return from name hands back.
func retSet(p kernel.Prototypes, name string) LiveSet {
	pr, ok := p[name]
	switch {
	case !ok || pr.RetRegs < 0 || pr.RetRegs >= 2:
		return retRegs
	case pr.RetRegs == 1:
		return regRAX
	}
	return 0
}
