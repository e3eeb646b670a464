package core

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/kbtf"
)

// Types answers struct layout questions from the kernel's BTF.
type Types struct {
	Spec   *btf.Spec
	Source string // where the BTF came from
}

// maxBTF bounds the BTF blob read from the dump.
const maxBTF = 64 << 20

// Types loads the kernel's BTF: from Options.BTF or Options.Vmlinux when
// given, else from the dump's memory between __start_BTF and __stop_BTF
// (CONFIG_DEBUG_INFO_BTF keeps it in .BTF, mapped with the image).
func (k *Kernel) Types() (*Types, error) {
	return k.types.get("BTF", k.loadTypes)
}

func (k *Kernel) loadTypes() (*Types, error) {
	for _, f := range []string{k.opts.BTF, k.opts.Vmlinux} {
		if f == "" {
			continue
		}
		spec, err := loadBTFFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		return &Types{Spec: spec, Source: f}, nil
	}
	s, err := k.Symbols()
	if err != nil {
		return nil, err
	}
	start, err1 := s.Addr("__start_BTF")
	stop, err2 := s.Addr("__stop_BTF")
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("%w (kernel built without CONFIG_DEBUG_INFO_BTF? pass --btf or --vmlinux)", err)
	}
	if stop <= start || stop-start > maxBTF {
		return nil, fmt.Errorf("__start_BTF %#x … __stop_BTF %#x is not a plausible range", start, stop)
	}
	// The BTF loader copies what it reads; hand it the dump's memory
	// directly rather than a copy of it.
	spec, err := btf.LoadSpecFromReader(&virtRange{k, start, stop - start})
	if err != nil {
		return nil, err
	}
	return &Types{Spec: spec, Source: fmt.Sprintf("dump memory %#x-%#x", start, stop)}, nil
}

// virtRange is an io.ReaderAt over [start, start+size) of kernel virtual
// memory.
type virtRange struct {
	k           *Kernel
	start, size uint64
}

func (r *virtRange) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || uint64(off) >= r.size {
		return 0, io.EOF
	}
	n := min(uint64(len(p)), r.size-uint64(off))
	if err := r.k.ReadVirt(p[:n], r.start+uint64(off)); err != nil {
		return 0, err
	}
	if int(n) < len(p) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// loadBTFFile reads raw BTF, or the .BTF section of an ELF file. A
// vmlinux is read section-only: Debian's has no symbol table, which
// btf.LoadSpec would want for fixing up data sections we do not need.
func loadBTFFile(path string) (*btf.Spec, error) {
	f, err := elf.Open(path)
	if err != nil {
		raw, rerr := os.ReadFile(path)
		if rerr != nil {
			return nil, rerr
		}
		return btf.LoadSpecFromReader(bytes.NewReader(raw))
	}
	defer f.Close()
	sec := f.Section(".BTF")
	if sec == nil {
		return nil, errors.New("ELF file without a .BTF section")
	}
	raw, err := sec.Data()
	if err != nil {
		return nil, err
	}
	return btf.LoadSpecFromReader(bytes.NewReader(raw))
}

// Struct finds a struct by name.
func (t *Types) Struct(name string) (*btf.Struct, error) {
	var s *btf.Struct
	if err := t.Spec.TypeByName(name, &s); err != nil {
		return nil, fmt.Errorf("struct %s: %w", name, err)
	}
	return s, nil
}

// Offset returns the byte offset of a member path such as "thread.sp" or
// "thread_info.cpu" in struct name, looking through anonymous structs and
// unions as C does.
func (t *Types) Offset(name, path string) (uint64, error) {
	s, err := t.Struct(name)
	if err != nil {
		return 0, err
	}
	var typ btf.Type = s
	var off uint64
	for _, part := range strings.Split(path, ".") {
		m, o, ok := findMember(typ, part)
		if !ok {
			return 0, fmt.Errorf("struct %s has no member %s", name, path)
		}
		off += o
		typ = m.Type
	}
	return off, nil
}

// findMember looks for name among a composite's members, descending into
// anonymous members; it returns the member and its byte offset.
func findMember(typ btf.Type, name string) (btf.Member, uint64, bool) {
	m, ok := kbtf.Member(typ, name)
	return m, uint64(m.Offset.Bytes()), ok
}

// MemberSize returns the size in bytes of a member path's type.
func (t *Types) MemberSize(name, path string) (uint64, error) {
	s, err := t.Struct(name)
	if err != nil {
		return 0, err
	}
	var typ btf.Type = s
	for _, part := range strings.Split(path, ".") {
		m, _, ok := findMember(typ, part)
		if !ok {
			return 0, fmt.Errorf("struct %s has no member %s", name, path)
		}
		typ = m.Type
	}
	n, err := btf.Sizeof(typ)
	return uint64(n), err
}
