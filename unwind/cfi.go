package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrFormat is matched by every FormatError.
var ErrFormat = errors.New("malformed call frame information")

// FormatError is malformed CFI at an offset of a section.
type FormatError struct {
	Section string
	Offset  int
	Msg     string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s+%#x: %s", e.Section, e.Offset, e.Msg)
}

func (e *FormatError) Is(target error) bool { return target == ErrFormat }

// Pointer encodings (DW_EH_PE_*, LSB "Exception Frames").
const (
	peAbsptr  = 0x00
	peULEB128 = 0x01
	peUdata2  = 0x02
	peUdata4  = 0x03
	peUdata8  = 0x04
	peSLEB128 = 0x09
	peSdata2  = 0x0a
	peSdata4  = 0x0b
	peSdata8  = 0x0c

	pePCRel   = 0x10
	peTextRel = 0x20
	peDataRel = 0x30
	peFuncRel = 0x40
	peAligned = 0x50

	peIndirect = 0x80
	peOmit     = 0xff
)

// cfiSection is one CFI section as it sits in the file.
type cfiSection struct {
	name string
	data []byte
	addr uint64 // sh_addr: the base of pcrel pointers (0 for .debug_frame)
	eh   bool   // .eh_frame: CIE id 0, relative CIE pointers, augmentations
}

// bases are what the relative pointer encodings add to a value.
type bases struct {
	text, data uint64
	// readPtr reads a pointer-sized word of the file image at a link-time
	// address, for DW_EH_PE_indirect.
	readPtr func(addr uint64) (uint64, bool)
}

// cie is a Common Information Entry.
type cie struct {
	offset    int
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	fdeEnc    byte // encoding of FDE addresses ('R'); absptr without
	hasAug    bool // 'z': FDEs carry augmentation data
	signal    bool // 'S': the frames are signal frames
	addrSize  int
	initial   []byte
	initialAt int // section offset of initial
}

// fde is a Frame Description Entry: the instructions for [begin, end).
type fde struct {
	offset     int
	cie        *cie
	begin, end uint64
	insns      []byte
	sec        *cfiSection
	insnsAt    int // section offset of insns, for errors and set_loc
}

// cfiReader decodes the primitive forms of a CFI section.
type cfiReader struct {
	sec *cfiSection
	b   bases
	pos int
	end int
	err error
}

func (r *cfiReader) fail(msg string, args ...any) {
	if r.err == nil {
		r.err = &FormatError{Section: r.sec.name, Offset: r.pos, Msg: fmt.Sprintf(msg, args...)}
	}
}

func (r *cfiReader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || r.end-r.pos < n {
		r.fail("entry truncated (want %d bytes, %d left)", n, r.end-r.pos)
		r.pos = r.end
		return nil
	}
	b := r.sec.data[r.pos : r.pos+n]
	r.pos += n
	return b
}

func (r *cfiReader) u8() uint8 {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *cfiReader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *cfiReader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *cfiReader) u64() uint64 {
	if b := r.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// initialLength reads the length of an entry: 4 bytes, or 0xffffffff
// and 8 bytes in the 64-bit DWARF format, whose offsets are then 8 bytes.
func (r *cfiReader) initialLength() (length uint64, offsize int) {
	if length = uint64(r.u32()); length == 0xffffffff {
		return r.u64(), 8
	}
	return length, 4
}

// leb reads a LEB128 number: its bits, how many it had, and its last
// byte (whose bit 6 is the sign of a signed number).
func (r *cfiReader) leb() (v uint64, shift uint, last byte) {
	for {
		c := r.u8()
		if r.err != nil {
			return 0, 0, 0
		}
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			return v, shift, c
		}
	}
}

func (r *cfiReader) uleb() uint64 {
	v, _, _ := r.leb()
	return v
}

func (r *cfiReader) sleb() int64 {
	v, shift, last := r.leb()
	if shift < 64 && last&0x40 != 0 {
		v |= ^uint64(0) << shift
	}
	return int64(v)
}

func (r *cfiReader) cstring() string {
	for i := r.pos; i < r.end; i++ {
		if r.sec.data[i] == 0 {
			s := string(r.sec.data[r.pos:i])
			r.pos = i + 1
			return s
		}
	}
	r.fail("unterminated string")
	return ""
}

// encoded reads a pointer in encoding enc. funcBase is the FDE's start,
// for DW_EH_PE_funcrel.
func (r *cfiReader) encoded(enc byte, addrSize int, funcBase uint64) uint64 {
	if enc == peOmit {
		return 0
	}
	if enc&0x70 == peAligned {
		r.pos = (r.pos + addrSize - 1) &^ (addrSize - 1)
	}
	fieldAddr := r.sec.addr + uint64(r.pos)
	var v uint64
	switch enc & 0x0f {
	case peAbsptr:
		if addrSize == 4 {
			v = uint64(r.u32())
		} else {
			v = r.u64()
		}
	case peULEB128:
		v = r.uleb()
	case peUdata2:
		v = uint64(r.u16())
	case peUdata4:
		v = uint64(r.u32())
	case peUdata8:
		v = r.u64()
	case peSLEB128:
		v = uint64(r.sleb())
	case peSdata2:
		v = uint64(int64(int16(r.u16())))
	case peSdata4:
		v = uint64(int64(int32(r.u32())))
	case peSdata8:
		v = r.u64()
	default:
		r.fail("unknown pointer format %#x", enc)
		return 0
	}
	switch enc & 0x70 {
	case 0, peAligned:
	case pePCRel:
		v += fieldAddr
	case peTextRel:
		v += r.b.text
	case peDataRel:
		v += r.b.data
	case peFuncRel:
		v += funcBase
	default:
		r.fail("unknown pointer application %#x", enc)
		return 0
	}
	if enc&peIndirect != 0 {
		if r.b.readPtr == nil {
			r.fail("indirect pointer %#x without a file image", v)
			return 0
		}
		p, ok := r.b.readPtr(v)
		if !ok {
			r.fail("indirect pointer %#x is outside the file image", v)
			return 0
		}
		v = p
	}
	return v
}

// cieAt parses the CIE at cieOff, which the FDE at off names before the
// linear walk has reached it.
func cieAt(sec *cfiSection, b bases, cieOff, off int) (*cie, error) {
	data := sec.data
	if cieOff < 0 || cieOff >= len(data) {
		return nil, &FormatError{sec.name, off, fmt.Sprintf("FDE's CIE pointer %#x is outside the section", cieOff)}
	}
	cr := &cfiReader{sec: sec, b: b, pos: cieOff, end: len(data)}
	l, co := cr.initialLength()
	if cr.err != nil || l > uint64(len(data)-cr.pos) {
		return nil, &FormatError{sec.name, off, fmt.Sprintf("FDE's CIE at %#x is malformed", cieOff)}
	}
	cr.end = cr.pos + int(l)
	cr.pos += co // the CIE id
	return parseCIE(cr, cieOff)
}

// parseCFI reads every FDE of a section, with its CIE.
func parseCFI(sec *cfiSection, b bases) ([]fde, error) {
	cies := map[int]*cie{}
	fdes := make([]fde, 0, len(sec.data)/40) // FDEs of compiled code average about 40 bytes
	data := sec.data
	for off := 0; off < len(data); {
		r := &cfiReader{sec: sec, b: b, pos: off, end: len(data)}
		length, offsize := r.initialLength()
		if r.err != nil {
			return nil, r.err
		}
		if length == 0 { // a zero terminator; linkers may put more after it
			off = r.pos
			continue
		}
		if length > uint64(len(data)-r.pos) {
			return nil, &FormatError{sec.name, off, fmt.Sprintf("length %#x runs past the section end", length)}
		}
		r.end = r.pos + int(length)
		next := r.end
		idPos := r.pos
		var id uint64
		if offsize == 8 {
			id = r.u64()
		} else {
			id = uint64(r.u32())
		}
		isCIE := (sec.eh && id == 0) || (!sec.eh && (id == 0xffffffff || id == 1<<64-1))
		if isCIE {
			if _, ok := cies[off]; !ok {
				c, err := parseCIE(r, off)
				if err != nil {
					return nil, err
				}
				cies[off] = c
			}
			off = next
			continue
		}
		cieOff := int(id)
		if sec.eh {
			cieOff = idPos - int(id)
		}
		c, ok := cies[cieOff]
		if !ok {
			var err error
			if c, err = cieAt(sec, b, cieOff, off); err != nil {
				return nil, err
			}
			cies[cieOff] = c
		}
		f := fde{offset: off, cie: c, sec: sec}
		enc := c.fdeEnc
		if !sec.eh {
			enc = peAbsptr
		}
		f.begin = r.encoded(enc, c.addrSize, 0)
		size := r.encoded(enc&0x0f, c.addrSize, 0)
		f.end = f.begin + size
		if c.hasAug {
			r.bytes(int(r.uleb())) // the LSDA pointer
		}
		if r.err != nil {
			return nil, r.err
		}
		f.insnsAt = r.pos
		f.insns = data[r.pos:r.end]
		fdes = append(fdes, f)
		off = next
	}
	return fdes, nil
}

// parseCIE reads a CIE from after its id field.
func parseCIE(r *cfiReader, off int) (*cie, error) {
	c := &cie{offset: off, addrSize: 8, fdeEnc: peAbsptr}
	version := r.u8()
	if version != 1 && version != 3 && version != 4 {
		return nil, &FormatError{r.sec.name, off, fmt.Sprintf("CIE version %d (want 1, 3 or 4)", version)}
	}
	aug := r.cstring()
	if len(aug) >= 2 && aug[:2] == "eh" { // GCC 2.x: the address of an exception table
		r.bytes(8)
		aug = aug[2:]
	}
	if version == 4 {
		c.addrSize = int(r.u8())
		if seg := r.u8(); seg != 0 {
			return nil, &FormatError{r.sec.name, off, fmt.Sprintf("segment selector size %d", seg)}
		}
		if c.addrSize != 4 && c.addrSize != 8 {
			return nil, &FormatError{r.sec.name, off, fmt.Sprintf("address size %d", c.addrSize)}
		}
	}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if version == 1 {
		c.raReg = uint64(r.u8())
	} else {
		c.raReg = r.uleb()
	}
	if len(aug) > 0 && aug[0] == 'z' {
		c.hasAug = true
		n := int(r.uleb())
		augEnd := r.pos + n
		if r.err == nil && (n < 0 || augEnd > r.end) {
			r.fail("augmentation data runs past the CIE")
		}
	augLoop:
		for _, ch := range aug[1:] {
			switch ch {
			case 'L':
				r.u8() // LSDA encoding: only FDEs use it, through the augmentation length
			case 'P':
				enc := r.u8()
				r.encoded(enc, c.addrSize, 0) // the personality routine
			case 'R':
				c.fdeEnc = r.u8()
			case 'S':
				c.signal = true
			case 'B', 'G': // AArch64 BTI and MTE markers, no data
			default:
				break augLoop // unknown: the length lets us skip the rest
			}
		}
		if r.err == nil {
			r.pos = augEnd
		}
	} else if aug != "" {
		return nil, &FormatError{r.sec.name, off, fmt.Sprintf("unknown augmentation %q", aug)}
	}
	if r.err != nil {
		return nil, r.err
	}
	if c.codeAlign == 0 {
		return nil, &FormatError{r.sec.name, off, "code alignment factor 0"}
	}
	c.initial = r.sec.data[r.pos:r.end]
	c.initialAt = r.pos
	return c, nil
}
