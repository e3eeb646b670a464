package codegen

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

func TestCounterPatch(t *testing.T) {
	for _, tc := range relocCases {
		for _, addr := range patchAddrs {
			for _, saveFlags := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s@%#x/flags=%v", tc.name, addr, saveFlags), func(t *testing.T) {
					site := Site{Addr: siteAddr, Bytes: tc.code}
					code, err := CounterPatch(addr, site, counter, saveFlags)
					if err != nil {
						t.Fatal(err)
					}
					if err := Verify(code, addr, site, counter, saveFlags); err != nil {
						t.Fatalf("Verify: %v", err)
					}
					// Decoded independently: [pushfq] lock incq [popfq] relocated.
					out, err := decodeAll(code, addr)
					if err != nil {
						t.Fatal(err)
					}
					i := 0
					if saveFlags {
						if out[i].inst.Op != x86asm.PUSHFQ {
							t.Fatalf("first %s, want pushfq", gnu(out[i].inst, out[i].pc))
						}
						i++
					}
					inc := out[i]
					m, _ := inc.inst.Args[0].(x86asm.Mem)
					if inc.inst.Op != x86asm.INC || inc.inst.Prefix[0] != x86asm.PrefixLOCK || inc.inst.MemBytes != 8 || m.Base != x86asm.RIP ||
						inc.pc+uint64(inc.inst.Len)+uint64(int64(int32(m.Disp))) != counter {
						t.Fatalf("%s, want lock incq of %#x", gnu(inc.inst, inc.pc), uint64(counter))
					}
					i++
					if saveFlags {
						if out[i].inst.Op != x86asm.POPFQ {
							t.Fatalf("%s, want popfq", gnu(out[i].inst, out[i].pc))
						}
						i++
					}
					rest := out[i].pc - addr
					if int(rest) != CounterPrefixLen(saveFlags) {
						t.Errorf("instrumentation is %d bytes, CounterPrefixLen says %d", rest, CounterPrefixLen(saveFlags))
					}
					if err := checkSemantics(site, out[i].pc, code[rest:]); err != nil {
						t.Errorf("relocated part: %v", err)
					}
				})
			}
		}
	}
}

// TestVerifyCatchesCorruption: any change to any byte of any patch is
// caught, named cases first.
func TestVerifyCatchesCorruption(t *testing.T) {
	addr := patchAddrs[0]
	rip := Site{Addr: siteAddr, Bytes: cat([]byte{0x48, 0x8b, 0x05}, i32(0x1000))}
	code, err := CounterPatch(addr, rip, counter, true)
	if err != nil {
		t.Fatal(err)
	}
	// pushfq(1) lock incq(8) popfq(1) mov(7) jmp(5)
	for name, off := range map[string]int{
		"counter disp":     1 + 4,
		"counter disp top": 1 + 7,
		"popfq":            9,
		"relocated opcode": 10 + 1,
		"relocated disp":   10 + 3,
		"relocated modrm":  10 + 2,
		"jmp back opcode":  17,
		"jmp back disp":    17 + 1,
	} {
		bad := bytes.Clone(code)
		bad[off] ^= 0x04
		if err := Verify(bad, addr, rip, counter, true); !errors.Is(err, ErrVerify) {
			t.Errorf("%s (+%d) corrupted: Verify = %v", name, off, err)
		} else {
			t.Logf("%-17s %v", name, err)
		}
	}
	for _, tc := range relocCases {
		site := Site{Addr: siteAddr, Bytes: tc.code}
		for _, saveFlags := range []bool{false, true} {
			code, err := CounterPatch(addr, site, counter, saveFlags)
			if err != nil {
				t.Fatal(err)
			}
			for i := range code {
				for _, mask := range []byte{0x01, 0x02, 0x10, 0x80, 0xff} {
					bad := bytes.Clone(code)
					bad[i] ^= mask
					if err := Verify(bad, addr, site, counter, saveFlags); !errors.Is(err, ErrVerify) {
						t.Errorf("%s: byte %d ^ %#x (% x): Verify = %v", tc.name, i, mask, bad, err)
					}
				}
			}
			for n := range code {
				if err := Verify(code[:n], addr, site, counter, saveFlags); !errors.Is(err, ErrVerify) {
					t.Errorf("%s: truncated to %d bytes: Verify = %v", tc.name, n, err)
				}
			}
			if err := Verify(append(bytes.Clone(code), 0x90), addr, site, counter, saveFlags); !errors.Is(err, ErrVerify) {
				t.Errorf("%s: trailing byte: %v", tc.name, err)
			}
			if err := Verify(code, addr, site, counter+8, saveFlags); !errors.Is(err, ErrVerify) {
				t.Errorf("%s: wrong counter: %v", tc.name, err)
			}
			if err := Verify(code, addr+16, site, counter, saveFlags); !errors.Is(err, ErrVerify) {
				t.Errorf("%s: wrong patch address: %v", tc.name, err)
			}
			if err := Verify(code, addr, site, counter, !saveFlags); !errors.Is(err, ErrVerify) {
				t.Errorf("%s: flags mismatch: %v", tc.name, err)
			}
		}
	}
}

// TestVerifyOtherSite: a patch is only good for its own site.
func TestVerifyOtherSite(t *testing.T) {
	addr := patchAddrs[0]
	for i, a := range relocCases {
		code, err := CounterPatch(addr, Site{Addr: siteAddr, Bytes: a.code}, counter, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(code, addr, Site{Addr: siteAddr + 0x10, Bytes: a.code}, counter, false); err == nil {
			// Position-independent relocations (ret, jmp *%rax) only
			// differ when the site does.
			if k, _ := analyze(Site{Addr: siteAddr, Bytes: a.code}); k.kind != kindRet && k.kind != kindIndirectJmp || k.l.rip >= 0 {
				t.Errorf("%s: verifies for a site 16 bytes away", a.name)
			}
		}
		b := relocCases[(i+1)%len(relocCases)]
		if err := Verify(code, addr, Site{Addr: siteAddr, Bytes: b.code}, counter, false); err == nil {
			t.Errorf("%s: verifies as %s", a.name, b.name)
		}
	}
}

func TestVerifyUnsupportedSite(t *testing.T) {
	err := Verify([]byte{0xf0, 0x48, 0xff, 0x05, 0, 0, 0, 0, 0xcc}, patchAddrs[0], Site{Addr: siteAddr, Bytes: []byte{0xcc}}, counter, false)
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("Verify of an int3 site: %v", err)
	}
}

// TestVerifyRandomBytes: whatever the patch holds, Verify answers with an
// error, never a panic.
func TestVerifyRandomBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range relocCases {
		site := Site{Addr: siteAddr, Bytes: tc.code}
		good, err := CounterPatch(patchAddrs[0], site, counter, false)
		if err != nil {
			t.Fatal(err)
		}
		for range 300 {
			b := bytes.Clone(good)
			// Keep the prefix intact some of the time so the checks
			// further in are reached.
			from := rng.IntN(len(b))
			for i := from; i < len(b); i++ {
				b[i] = byte(rng.Uint32())
			}
			if rng.IntN(2) == 0 {
				b = binary.LittleEndian.AppendUint64(b, rng.Uint64())
			}
			if err := Verify(b, patchAddrs[0], site, counter, false); err == nil && !bytes.Equal(b, good) {
				t.Errorf("%s: random % x verifies", tc.name, b)
			}
		}
	}
}
