package dumpview

import (
	"fmt"
	"strconv"
	"strings"
)

// VMCoreInfo is the kernel's own description of itself that it leaves for
// dump readers (kernel/crash_core.c): "KEY=value" lines, with keys such
// as OSRELEASE, KERNELOFFSET, SYMBOL(name), OFFSET(struct.member),
// SIZE(type), LENGTH(array) and NUMBER(name).
type VMCoreInfo struct {
	Raw       map[string]string
	OSRelease string
	// KernelOffset is the KASLR slide of the kernel image.
	KernelOffset uint64
	Symbols      map[string]uint64
	Offsets      map[string]int64
	Sizes        map[string]int64
	Lengths      map[string]int64
	Numbers      map[string]int64
}

// ParseVMCoreInfo parses VMCOREINFO text. Unknown keys are kept in Raw;
// a known key with a malformed value is an error.
func ParseVMCoreInfo(text string) (*VMCoreInfo, error) {
	v := &VMCoreInfo{Raw: map[string]string{}, Symbols: map[string]uint64{}, Offsets: map[string]int64{},
		Sizes: map[string]int64{}, Lengths: map[string]int64{}, Numbers: map[string]int64{}}
	for i, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("VMCOREINFO line %d: no '=' in %q", i+1, line)
		}
		v.Raw[key] = val
		kind, name, paren := strings.Cut(key, "(")
		if paren && strings.HasSuffix(name, ")") {
			name = strings.TrimSuffix(name, ")")
			var err error
			switch kind {
			case "SYMBOL":
				v.Symbols[name], err = strconv.ParseUint(val, 16, 64)
			case "OFFSET":
				v.Offsets[name], err = strconv.ParseInt(val, 10, 64)
			case "SIZE":
				v.Sizes[name], err = strconv.ParseInt(val, 10, 64)
			case "LENGTH":
				v.Lengths[name], err = strconv.ParseInt(val, 10, 64)
			case "NUMBER":
				v.Numbers[name], err = parseNumber(val)
			}
			if err != nil {
				return nil, fmt.Errorf("VMCOREINFO line %d: %s: %w", i+1, key, err)
			}
			continue
		}
		switch key {
		case "OSRELEASE":
			v.OSRelease = val
		case "KERNELOFFSET":
			off, err := strconv.ParseUint(val, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("VMCOREINFO line %d: KERNELOFFSET: %w", i+1, err)
			}
			v.KernelOffset = off
		}
	}
	return v, nil
}

// Need returns the listed symbols, or an error naming the first missing.
func (v *VMCoreInfo) Need(names ...string) ([]uint64, error) {
	out := make([]uint64, len(names))
	for i, n := range names {
		a, ok := v.Symbols[n]
		if !ok {
			return nil, &MissingError{What: "SYMBOL(" + n + ")", Where: "VMCOREINFO"}
		}
		out[i] = a
	}
	return out, nil
}

// Offset returns OFFSET(name) or an error.
func (v *VMCoreInfo) Offset(name string) (int64, error) {
	o, ok := v.Offsets[name]
	if !ok {
		return 0, &MissingError{What: "OFFSET(" + name + ")", Where: "VMCOREINFO"}
	}
	return o, nil
}

// parseNumber reads a NUMBER() value: decimal, possibly negative ("%ld"),
// or hexadecimal with 0x, which 6.12's x86 code writes for addresses such
// as NUMBER(VMALLOC_START)=0xffffd10240000000 (kept as the two's
// complement int64 of the address).
func parseNumber(s string) (int64, error) {
	if h, ok := strings.CutPrefix(s, "0x"); ok {
		u, err := strconv.ParseUint(h, 16, 64)
		return int64(u), err
	}
	return strconv.ParseInt(s, 10, 64)
}
