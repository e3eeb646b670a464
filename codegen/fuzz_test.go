package codegen

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// mustRefuse lists, independently of the package's own tables, what no
// relocation may accept.
var mustRefuse = map[x86asm.Op]bool{
	x86asm.INT: true, x86asm.INTO: true, x86asm.ICEBP: true,
	x86asm.UD0: true, x86asm.UD1: true, x86asm.UD2: true,
	x86asm.HLT: true, x86asm.STI: true, x86asm.MWAIT: true,
	x86asm.SYSCALL: true, x86asm.SYSRET: true, x86asm.SYSENTER: true, x86asm.SYSEXIT: true,
	x86asm.IRET: true, x86asm.IRETD: true, x86asm.IRETQ: true,
	x86asm.LCALL: true, x86asm.LJMP: true, x86asm.LRET: true, x86asm.XBEGIN: true,
}

// FuzzRelocate: any decodable instruction is either refused with a typed
// error, or relocated into code that does what it does (checked by the
// tests' own rules), that Verify accepts, and in which Verify notices any
// changed byte.
func FuzzRelocate(f *testing.F) {
	for _, tc := range relocCases {
		f.Add(tc.code)
	}
	for _, code := range refusedCases {
		f.Add(code)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		inst, err := x86dec.Decode(b)
		if err != nil || inst.Op == 0 {
			return
		}
		site := Site{Addr: siteAddr, Bytes: b[:inst.Len]}
		for _, addr := range patchAddrs {
			code, err := Relocate(addr, site)
			if err != nil {
				if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrOutOfReach) {
					t.Fatalf("% x: untyped error %v", site.Bytes, err)
				}
				continue
			}
			for _, a := range inst.Args {
				if m, ok := a.(x86asm.Mem); mustRefuse[inst.Op] || ok && m.Base == x86asm.EIP {
					t.Fatalf("% x (%s) relocated, must be refused", site.Bytes, gnu(inst, siteAddr))
				}
			}
			if err := checkSemantics(site, addr, code); err != nil {
				t.Fatalf("% x (%s) relocated to:%s\n%v", site.Bytes, gnu(inst, siteAddr), listingOf(code, addr), err)
			}
			if err := VerifyRelocation(code, addr, site); err != nil {
				t.Fatalf("% x: relocated code does not verify: %v", site.Bytes, err)
			}
			for i := range code {
				bad := bytes.Clone(code)
				bad[i] ^= 1 << (i % 8)
				if VerifyRelocation(bad, addr, site) == nil {
					t.Fatalf("% x: changed byte %d of % x went unnoticed", site.Bytes, i, code)
				}
			}
			patch, err := CounterPatch(addr, site, counter, true)
			if err != nil {
				t.Fatalf("% x: CounterPatch: %v", site.Bytes, err)
			}
			if err := Verify(patch, addr, site, counter, true); err != nil {
				t.Fatalf("% x: Verify: %v", site.Bytes, err)
			}
		}
	})
}

func listingOf(code []byte, addr uint64) string {
	out, err := decodeAll(code, addr)
	if err != nil {
		return err.Error()
	}
	return listing(out)
}
