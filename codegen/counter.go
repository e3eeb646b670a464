package codegen

// lockIncq is "lock incq disp32(%rip)" up to its displacement.
var lockIncq = []byte{0xf0, 0x48, 0xff, 0x05}

// lenLockIncq is the length of "lock incq disp32(%rip)".
const lenLockIncq = 8

// CounterPatch builds a patch placed at patchAddr that counts executions
// of site:
//
//	[pushfq]                  only if saveFlags (flags live at the site)
//	lock incq counter(%rip)   counter is the kernel address of a u64
//	[popfq]
//	<site's instruction, relocated>
//	jmp site.Addr+len         omitted after an unconditional transfer
//
// The increment is locked so that CPUs running the site at once never lose
// a count, and RIP-relative so that it needs no scratch register. The
// kernel is built without a red zone, so pushfq below %rsp is safe.
func CounterPatch(patchAddr uint64, site Site, counter uint64, saveFlags bool) ([]byte, error) {
	in, err := analyze(site)
	if err != nil {
		return nil, err
	}
	var b []byte
	if saveFlags {
		b = append(b, opPushfq)
	}
	d, err := rel32(patchAddr+uint64(len(b))+lenLockIncq, counter)
	if err != nil {
		return nil, err
	}
	b = appendLE32(append(b, lockIncq...), d)
	if saveFlags {
		b = append(b, opPopfq)
	}
	return in.relocate(b, patchAddr+uint64(len(b)))
}

// CounterPrefixLen is the length of a counter patch's instrumentation,
// before the relocated instruction.
func CounterPrefixLen(saveFlags bool) int {
	if saveFlags {
		return 1 + lenLockIncq + 1
	}
	return lenLockIncq
}
