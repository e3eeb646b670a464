package elfsym

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Errors that say what is wrong with a file given to OpenFile; the
// errors OpenFile returns match them with errors.Is.
var (
	// ErrNotELF: the file does not start with the ELF magic number (an
	// empty file, a device, a script, ...).
	ErrNotELF = errors.New("not an ELF file")
	// ErrTruncated: a part of the file that its headers describe lies
	// beyond its end (a partial copy or download).
	ErrTruncated = errors.New("truncated")
)

// NotELFError is a file that is not an ELF file.
type NotELFError struct {
	Path string
	Size int64  // bytes in the file
	Head []byte // its first bytes (up to 4)
	Dir  bool   // the path is a directory
}

func (e *NotELFError) Error() string {
	if e.Dir {
		return fmt.Sprintf("%s: not an ELF file (a directory)", e.Path)
	}
	if e.Size == 0 {
		return fmt.Sprintf("%s: not an ELF file (empty)", e.Path)
	}
	return fmt.Sprintf("%s: not an ELF file (starts with % x, not 7f 45 4c 46)", e.Path, e.Head)
}

func (e *NotELFError) Is(target error) bool { return target == ErrNotELF }

// TruncatedError is a part of a file (the ELF header, the program or
// section headers, a section) that its headers place past the file's end.
type TruncatedError struct {
	Path string // "" when not known where the error arose
	What string // "ELF header", "section headers", "section .eh_frame", ...
	Off  uint64 // file offset of the part
	Need uint64 // its size in bytes
	Size int64  // the file's size; -1 when not known
}

func (e *TruncatedError) Error() string {
	s := fmt.Sprintf("truncated: %s at %#x needs %#x bytes", e.What, e.Off, e.Need)
	if e.Size >= 0 {
		s += fmt.Sprintf(", file has %#x", e.Size)
	} else {
		s += ", the file ends before"
	}
	if e.Path != "" {
		s = e.Path + ": " + s
	}
	return s
}

func (e *TruncatedError) Is(target error) bool { return target == ErrTruncated }

// SectionData returns the (decompressed) contents of section s, with a
// TruncatedError when the file ends before the section does.
func SectionData(s *elf.Section) ([]byte, error) {
	b, err := s.Data()
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		return nil, &TruncatedError{What: "section " + s.Name, Off: s.Offset, Need: s.FileSize, Size: -1}
	}
	if err != nil {
		return nil, fmt.Errorf("section %s: %w", s.Name, err)
	}
	return b, nil
}

// WithPath prefixes err, from reading the file at path, with the path,
// and gives a TruncatedError without the file's size that size.
func WithPath(path string, err error) error {
	var te *TruncatedError
	if errors.As(err, &te) && te.Path == "" && te.Size < 0 {
		if fi, serr := os.Stat(path); serr == nil {
			te.Size = fi.Size()
		}
	}
	return fmt.Errorf("%s: %w", path, err)
}

// diagnose says why debug/elf could not open the file at path, which it
// failed to with err: not ELF, or which part lies past the end. It
// returns nil when it finds nothing wrong.
func diagnose(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	if fi.IsDir() {
		return &NotELFError{Path: path, Dir: true}
	}
	hdr := make([]byte, 64)
	n, _ := io.ReadFull(f, hdr)
	hdr = hdr[:n]
	size := fi.Size()
	if !fi.Mode().IsRegular() {
		size = int64(n) // a device or pipe: what it gave
	}
	if n < 4 || string(hdr[:4]) != elf.ELFMAG {
		return &NotELFError{Path: path, Size: size, Head: hdr[:min(n, 4)]}
	}
	trunc := func(what string, off, need uint64) error {
		if off+need < off || off+need > uint64(size) {
			return &TruncatedError{Path: path, What: what, Off: off, Need: need, Size: size}
		}
		return nil
	}
	if n < int(elf.EI_NIDENT) {
		return trunc("ELF identification", 0, uint64(elf.EI_NIDENT))
	}
	is64 := elf.Class(hdr[elf.EI_CLASS]) == elf.ELFCLASS64
	var bo binary.ByteOrder = binary.LittleEndian
	if elf.Data(hdr[elf.EI_DATA]) == elf.ELFDATA2MSB {
		bo = binary.BigEndian
	}
	var hsize uint64 = 52
	if is64 {
		hsize = 64
	}
	if err := trunc("ELF header", 0, hsize); err != nil {
		return err
	}
	var phoff, shoff uint64
	var phentsize, phnum, shentsize, shnum, shstrndx uint64
	if is64 {
		phoff, shoff = bo.Uint64(hdr[32:]), bo.Uint64(hdr[40:])
		phentsize, phnum = uint64(bo.Uint16(hdr[54:])), uint64(bo.Uint16(hdr[56:]))
		shentsize, shnum, shstrndx = uint64(bo.Uint16(hdr[58:])), uint64(bo.Uint16(hdr[60:])), uint64(bo.Uint16(hdr[62:]))
	} else {
		phoff, shoff = uint64(bo.Uint32(hdr[28:])), uint64(bo.Uint32(hdr[32:]))
		phentsize, phnum = uint64(bo.Uint16(hdr[42:])), uint64(bo.Uint16(hdr[44:]))
		shentsize, shnum, shstrndx = uint64(bo.Uint16(hdr[46:])), uint64(bo.Uint16(hdr[48:])), uint64(bo.Uint16(hdr[50:]))
	}
	if phnum > 0 {
		if err := trunc("program headers", phoff, phnum*phentsize); err != nil {
			return err
		}
	}
	if shoff == 0 {
		return nil
	}
	if shnum == 0 { // the real count is in section header 0
		shnum = 1
	}
	if err := trunc("section headers", shoff, shnum*shentsize); err != nil {
		return err
	}
	if shstrndx == uint64(elf.SHN_UNDEF) || shstrndx >= shnum {
		return nil
	}
	sh := make([]byte, shentsize)
	if _, err := f.ReadAt(sh, int64(shoff+shstrndx*shentsize)); err != nil {
		return nil
	}
	var off, sz uint64
	if is64 && len(sh) >= 40 {
		off, sz = bo.Uint64(sh[24:]), bo.Uint64(sh[32:])
	} else if !is64 && len(sh) >= 24 {
		off, sz = uint64(bo.Uint32(sh[16:])), uint64(bo.Uint32(sh[20:]))
	}
	return trunc("section name table", off, sz)
}

// checkSections reports the first section (with contents in the file)
// that runs past the end of a file of size bytes.
func checkSections(path string, f *elf.File, size int64) error {
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOBITS || s.Type == elf.SHT_NULL {
			continue
		}
		if end := s.Offset + s.FileSize; end < s.Offset || end > uint64(size) {
			return &TruncatedError{Path: path, What: "section " + s.Name, Off: s.Offset, Need: s.FileSize, Size: size}
		}
	}
	return nil
}
