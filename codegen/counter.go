package codegen

// lockIncq is "lock incq disp32(%rip)" up to its displacement.
var lockIncq = []byte{0xf0, 0x48, 0xff, 0x05}

// lenLockIncq is the length of "lock incq disp32(%rip)".
const lenLockIncq = 8

// CounterPatch builds a patch placed at patchAddr that counts executions
// of site: a BuildPatch of one Counter snippet with every register live.
//
//	[pushfq]                  only if saveFlags (flags live at the site)
//	lock incq counter(%rip)   counter is the kernel address of a u64
//	[popfq]
//	<site's instruction, relocated>
//	jmp site.Addr+len         omitted after an unconditional transfer
func CounterPatch(patchAddr uint64, site Site, counter uint64, saveFlags bool) ([]byte, error) {
	p, err := BuildPatch(patchAddr, PatchSpec{Site: site, Live: Live{Regs: 0xffff, Flags: saveFlags},
		Snippets: []Snippet{Counter{Addr: counter}}})
	if err != nil {
		return nil, err
	}
	return p.Code, nil
}

// CounterPrefixLen is the length of a counter patch's instrumentation,
// before the relocated instruction.
func CounterPrefixLen(saveFlags bool) int {
	if saveFlags {
		return 1 + lenLockIncq + 1
	}
	return lenLockIncq
}
