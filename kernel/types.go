package kernel

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/kbtf"
)

// Types answers questions about a kernel's types from its BTF: the one
// place that says where a member lies in a struct. Every layout kinst
// reads (KernelLayout, ModuleLayout, TaskLayout, the postmortem task and
// runqueue fields) comes from here, never from numbers written down:
// struct layouts change with the kernel version and configuration.
type Types struct {
	Spec   *btf.Spec
	Source string // where the BTF came from, for messages
}

// ErrNoBTF is returned where a view has no BTF to answer from.
var ErrNoBTF = errors.New("no kernel BTF (CONFIG_DEBUG_INFO_BTF)")

// ErrLayout is matched by every LayoutError.
var ErrLayout = errors.New("kernel struct layout not in BTF")

// ErrNoMember is the cause of a LayoutError for a member the struct does
// not have (callers try the names of other kernel versions on it).
var ErrNoMember = errors.New("no such member")

// LayoutError names the type or member BTF did not describe as expected.
type LayoutError struct {
	Type, Member string
	Err          error
}

func (e *LayoutError) Error() string {
	if e.Member == "" {
		return fmt.Sprintf("BTF: struct %s: %v", e.Type, e.Err)
	}
	return fmt.Sprintf("BTF: struct %s.%s: %v", e.Type, e.Member, e.Err)
}

func (e *LayoutError) Is(t error) bool { return t == ErrLayout }
func (e *LayoutError) Unwrap() error   { return e.Err }

// BTFPath is where a running kernel publishes its BTF.
const BTFPath = "/sys/kernel/btf/vmlinux"

// LoadKernelTypes reads the running kernel's BTF (/sys/kernel/btf/vmlinux).
func LoadKernelTypes() (*Types, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("kernel BTF: %w", err)
	}
	return &Types{Spec: spec, Source: BTFPath}, nil
}

// LoadTypes reads raw BTF (/sys/kernel/btf/vmlinux, a .btf file), or the
// .BTF section of an ELF file (a vmlinux). A vmlinux is read section-only:
// Debian's has no symbol table, which btf.LoadSpec would want for fixing
// up data sections kinst does not need.
func LoadTypes(path string) (*Types, error) {
	f, err := elf.Open(path)
	if err != nil {
		raw, rerr := os.ReadFile(path)
		if rerr != nil {
			return nil, rerr
		}
		spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &Types{Spec: spec, Source: path}, nil
	}
	defer f.Close()
	sec := f.Section(".BTF")
	if sec == nil {
		return nil, fmt.Errorf("%s: ELF file without a .BTF section", path)
	}
	raw, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &Types{Spec: spec, Source: path}, nil
}

// maxBTF bounds the BTF blob read from kernel memory (6.1's is ~5 MiB).
const maxBTF = 64 << 20

// ReadTypes reads the BTF the kernel keeps in its own image, between the
// symbols __start_BTF and __stop_BTF (CONFIG_DEBUG_INFO_BTF).
func ReadTypes(p *Program) (*Types, error) {
	syms, err := p.KernelSymbols()
	if err != nil {
		return nil, err
	}
	start, ok1 := syms.Address("__start_BTF")
	stop, ok2 := syms.Address("__stop_BTF")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: no __start_BTF/__stop_BTF symbols", ErrNoBTF)
	}
	if stop <= start || stop-start > maxBTF {
		return nil, fmt.Errorf("__start_BTF %#x … __stop_BTF %#x is not a plausible range", start, stop)
	}
	// The BTF loader copies what it reads: hand it the memory directly
	// rather than a copy of it.
	spec, err := btf.LoadSpecFromReader(&memRange{p.mem, start, stop - start})
	if err != nil {
		return nil, err
	}
	return &Types{Spec: spec, Source: fmt.Sprintf("kernel memory %#x-%#x", start, stop)}, nil
}

// memRange is an io.ReaderAt over [start, start+size) of kernel memory.
type memRange struct {
	r           Reader
	start, size uint64
}

func (m *memRange) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || uint64(off) >= m.size {
		return 0, io.EOF
	}
	n := min(uint64(len(p)), m.size-uint64(off))
	if err := m.r.Read(m.start+uint64(off), p[:n]); err != nil {
		return 0, err
	}
	if int(n) < len(p) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// Struct finds a struct by name.
func (t *Types) Struct(name string) (*btf.Struct, error) {
	var s *btf.Struct
	if err := t.Spec.TypeByName(name, &s); err != nil {
		return nil, &LayoutError{Type: name, Err: err}
	}
	return s, nil
}

// Size is the size in bytes of struct name.
func (t *Types) Size(name string) (uint32, error) {
	s, err := t.Struct(name)
	if err != nil {
		return 0, err
	}
	return s.Size, nil
}

// Member is where a member path lies in a struct.
type Member struct {
	Off  uint64 // bytes from the start of the struct
	Size uint64
	Type btf.Type
}

// Member finds a member path in struct name: members separated by dots,
// looked up through anonymous structs and unions as C does, with [N] to
// step into an array ("thread.sp", "mem[0].base"). Bitfields are refused.
func (t *Types) Member(name, path string) (Member, error) {
	s, err := t.Struct(name)
	if err != nil {
		return Member{}, err
	}
	m, err := MemberOf(s, path)
	if err != nil {
		return Member{}, &LayoutError{Type: name, Member: path, Err: err}
	}
	return m, nil
}

// MemberOf finds a member path in any struct or union type (see
// Types.Member); its errors are the bare causes (ErrNoMember, …).
func MemberOf(typ btf.Type, path string) (Member, error) {
	var off uint64
	for _, part := range strings.Split(path, ".") {
		name, index, err := splitIndex(part)
		if err != nil {
			return Member{}, err
		}
		m, ok := kbtf.Member(typ, name)
		if !ok {
			return Member{}, fmt.Errorf("%w %s", ErrNoMember, name)
		}
		if m.BitfieldSize != 0 || m.Offset%8 != 0 {
			return Member{}, fmt.Errorf("%s is a bitfield", name)
		}
		off += uint64(m.Offset.Bytes())
		typ = m.Type
		for _, i := range index {
			arr, ok := btf.UnderlyingType(typ).(*btf.Array)
			if !ok {
				return Member{}, fmt.Errorf("%s is not an array", name)
			}
			if i >= uint64(arr.Nelems) {
				return Member{}, fmt.Errorf("%s[%d] is past its %d elements", name, i, arr.Nelems)
			}
			size, err := btf.Sizeof(arr.Type)
			if err != nil {
				return Member{}, fmt.Errorf("%s: %w", name, err)
			}
			off += i * uint64(size)
			typ = arr.Type
		}
	}
	size, err := btf.Sizeof(typ)
	if err != nil {
		return Member{}, err
	}
	return Member{Off: off, Size: uint64(size), Type: typ}, nil
}

// splitIndex splits "mem[1][2]" into "mem" and [1 2].
func splitIndex(part string) (string, []uint64, error) {
	name, rest, _ := strings.Cut(part, "[")
	if rest == "" {
		if name == "" {
			return "", nil, errors.New("empty member name")
		}
		return name, nil, nil
	}
	var index []uint64
	for _, r := range strings.Split("["+rest, "]") {
		if r == "" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimPrefix(r, "["), 10, 64)
		if err != nil || !strings.HasPrefix(r, "[") {
			return "", nil, fmt.Errorf("bad index in %q", part)
		}
		index = append(index, n)
	}
	return name, index, nil
}

// Offset returns the byte offset of a member path in struct name.
func (t *Types) Offset(name, path string) (uint64, error) {
	m, err := t.Member(name, path)
	return m.Off, err
}

// MemberSize returns the size in bytes of a member path's type.
func (t *Types) MemberSize(name, path string) (uint64, error) {
	m, err := t.Member(name, path)
	return m.Size, err
}

// Field returns a member path as a Field to read from a copy of the
// struct. want is its required size in bytes; 0 accepts any scalar up to
// 8 bytes, or an array, as the caller reads it.
func (t *Types) Field(name, path string, want uint32) (Field, error) {
	m, err := t.Member(name, path)
	if err != nil {
		return Field{}, err
	}
	switch {
	case want != 0 && m.Size != uint64(want):
		err = fmt.Errorf("is %d bytes, want %d", m.Size, want)
	case want == 0 && m.Size > 8:
		if _, arr := btf.UnderlyingType(m.Type).(*btf.Array); !arr {
			err = fmt.Errorf("is %d bytes, want a scalar", m.Size)
		}
	case m.Off+m.Size > 1<<32:
		err = fmt.Errorf("lies past 4 GiB")
	}
	if err != nil {
		return Field{}, &LayoutError{Type: name, Member: path, Err: err}
	}
	return Field{Off: uint32(m.Off), Size: uint32(m.Size)}, nil
}

// EnumValue returns the value of enumerator value of enum name.
func (t *Types) EnumValue(name, value string) (uint64, error) {
	var e *btf.Enum
	if err := t.Spec.TypeByName(name, &e); err != nil {
		return 0, &LayoutError{Type: "enum " + name, Err: err}
	}
	for _, v := range e.Values {
		if v.Name == value {
			return v.Value, nil
		}
	}
	return 0, &LayoutError{Type: "enum " + name, Member: value, Err: errors.New("no such value")}
}

// HasMember reports whether struct name has a member path, to choose
// between the layouts of different kernel versions by what BTF says.
func (t *Types) HasMember(name, path string) bool {
	_, err := t.Member(name, path)
	return err == nil
}
