package linux

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
)

// heapSection is the patch heap's section in kerninst.ko: 32 MiB of int3
// the assembler has to write out, which the loader need not copy since
// the driver fills the heap with int3 at load.
const heapSection = ".text.kinst_heap"

// makeNOBITS rewrites the ELF relocatable file at path so that section
// name occupies no bytes in the file: its type becomes SHT_NOBITS (the
// module loader then allocates and zeroes it, as for .bss) and the file
// bytes after it move down. Its address, size, flags and alignment are
// kept. Only 64-bit little-endian relocatable files (a .ko) are handled.
func makeNOBITS(path, name string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := nobits(b, name)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// nobits is makeNOBITS over the file's bytes.
func nobits(b []byte, name string) ([]byte, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Type != elf.ET_REL {
		return nil, fmt.Errorf("not a 64-bit little-endian relocatable ELF file")
	}
	idx := -1
	for i, s := range f.Sections {
		if s.Name == name {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("no section %s", name)
	}
	sec := f.Sections[idx]
	if sec.Type == elf.SHT_NOBITS {
		return b, nil
	}
	off, size := sec.Offset, sec.FileSize
	if off+size > uint64(len(b)) || size%4096 != 0 {
		return nil, fmt.Errorf("section %s at [%#x, +%#x) does not fit the file in whole pages", name, off, size)
	}
	le := binary.LittleEndian
	shoff := le.Uint64(b[0x28:])
	shentsize, shnum := uint64(le.Uint16(b[0x3a:])), uint64(le.Uint16(b[0x3c:]))
	if shentsize != 64 || shoff+shnum*shentsize > uint64(len(b)) {
		return nil, fmt.Errorf("bad section header table")
	}
	out := append(append(make([]byte, 0, uint64(len(b))-size), b[:off]...), b[off+size:]...)
	moved := func(o uint64) uint64 {
		if o >= off+size {
			return o - size
		}
		return o
	}
	newShoff := moved(shoff)
	le.PutUint64(out[0x28:], newShoff)
	for i := range shnum {
		h := out[newShoff+i*shentsize:]
		if i == uint64(idx) {
			le.PutUint32(h[4:], uint32(elf.SHT_NOBITS))
			continue
		}
		le.PutUint64(h[0x18:], moved(le.Uint64(h[0x18:])))
	}
	return out, nil
}
