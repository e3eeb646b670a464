package codegen

// lenLockInc is the length of "lock incq disp32(%rip)".
const lenLockInc = 8

// lockIncOpcode is "lock incq disp32(%rip)" up to its displacement.
var lockIncOpcode = []byte{0xf0, 0x48, 0xff, 0x05}

// CounterPatch builds a patch placed at patchAddr that counts executions
// of site:
//
//	[pushfq]                         only if saveFlags (flags live at site)
//	lock incq counter(%rip)          counter is the kernel address of a u64
//	[popfq]
//	<site's instruction, relocated>
//	jmp site.Addr+len                omitted after an unconditional transfer
//
// The increment is locked so concurrent CPUs never lose a count, and
// RIP-relative so it needs no scratch register.
func CounterPatch(patchAddr uint64, site Site, counter uint64, saveFlags bool) ([]byte, error) {
	var b []byte
	if saveFlags {
		b = append(b, opPushfq)
	}
	d, err := rel32(patchAddr+uint64(len(b))+lenLockInc, counter)
	if err != nil {
		return nil, err
	}
	b = appendLE32(append(b, lockIncOpcode...), d)
	if saveFlags {
		b = append(b, opPopfq)
	}
	r, err := Relocate(patchAddr+uint64(len(b)), site)
	if err != nil {
		return nil, err
	}
	return append(b, r...), nil
}

// CounterPrefixLen is the length of a counter patch's instrumentation,
// before the relocated instruction.
func CounterPrefixLen(saveFlags bool) int {
	if saveFlags {
		return 1 + lenLockInc + 1
	}
	return lenLockInc
}
