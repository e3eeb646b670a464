package core

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/kinst/kinst/core/dump"
)

// ErrNeedsFreeBSDKernel: the request needs the FreeBSD kernel's symbols
// and types (its kernel file or CTF), which this package does not read.
var ErrNeedsFreeBSDKernel = errors.New("needs the FreeBSD kernel's symbols and types, which kinst does not read yet")

// FreeBSD is a FreeBSD amd64 minidump seen without the FreeBSD kernel's
// symbols or types: what the dump format itself says (header, physical
// memory map, kernel pmap, message buffer). Tasks, stacks and symbols
// would need the kernel's ELF image and CTF, which are not read yet.
type FreeBSD struct {
	Dump *dump.Minidump
}

// OpenFreeBSD returns the FreeBSD view of d when d is a FreeBSD
// minidump. It does not take ownership of d.
func OpenFreeBSD(d dump.Dump) (*FreeBSD, bool) {
	m, ok := d.(*dump.Minidump)
	if !ok {
		return nil, false
	}
	return &FreeBSD{Dump: m}, true
}

// MemoryBytes is the machine's physical memory as the dump describes it:
// the sum of the dump_avail ranges (version 3), or the span the page
// bitmap covers from address 0 (versions 1 and 2; the kernel rounds the
// bitmap up, so this can exceed the RAM by a little).
func (f *FreeBSD) MemoryBytes() uint64 {
	if av := f.Dump.DumpAvail(); av != nil {
		var n uint64
		for _, r := range av {
			n += r.End - r.Start
		}
		return n
	}
	return f.Dump.BitmapPages() * 4096
}

// ReadVirt reads n bytes of kernel virtual memory through the dump's
// pmap (from KernBase) and direct map.
func (f *FreeBSD) ReadVirt(addr uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := f.Dump.ReadVirt(b, addr); err != nil {
		return nil, err
	}
	return b, nil
}

// FreeBSD's struct msgbuf (sys/sys/msgbuf.h), amd64 offsets: msg_ptr,
// msg_magic, msg_size, msg_wseq, msg_rseq. Stable since the sequence-
// numbered ring of FreeBSD 5, older than minidumps.
const (
	fbsdMsgMagic    = 0x063062
	fbsdMsgMagicOff = 8
	fbsdMsgSizeOff  = 12
	fbsdMsgWseqOff  = 16
	fbsdMsgRseqOff  = 20
	fbsdMsgHdrLen   = 24
)

// MessageBuffer is a FreeBSD kernel message buffer put in log order.
type MessageBuffer struct {
	// Text is the buffer from its oldest byte to its newest, without the
	// NULs of a ring not yet filled. When the ring has wrapped, the first
	// line is usually the tail of an overwritten one.
	Text []byte
	// Size is the ring's size (msg_size).
	Size int
	// Ordered: the kernel's struct msgbuf was found after the text, so
	// the write position (WriteSeq % Size) is known. Without it the text
	// is turned to start after its last run of NULs, which is right
	// only for a ring that has not wrapped.
	Ordered  bool
	WriteSeq uint32
	ReadSeq  uint32
}

// MessageBuffer reads the dump's msgbuf part in log order. The minidump
// holds the ring's msg_size bytes as they lie in memory; the write
// position is in the struct msgbuf the kernel keeps right after them
// (msgbufinit), which the dumper's page-rounded write takes along when
// kern.msgbufsize is a multiple of the page size (the default, 96 KiB).
func (f *FreeBSD) MessageBuffer() *MessageBuffer {
	ring := f.Dump.MessageBuffer()
	mb := &MessageBuffer{Size: len(ring)}
	start := 0
	le := binary.LittleEndian
	if t := f.Dump.MessageBufferTail(); len(ring) > 0 && len(t) >= fbsdMsgHdrLen &&
		le.Uint32(t[fbsdMsgMagicOff:]) == fbsdMsgMagic && int(le.Uint32(t[fbsdMsgSizeOff:])) == len(ring) {
		mb.Ordered = true
		mb.WriteSeq = le.Uint32(t[fbsdMsgWseqOff:])
		mb.ReadSeq = le.Uint32(t[fbsdMsgRseqOff:])
		start = int(mb.WriteSeq % uint32(len(ring)))
	} else if i := bytes.LastIndexByte(ring, 0); i >= 0 {
		// Start after the last NUL run; one that reaches the end of the
		// ring means the text starts at 0.
		start = (i + 1) % len(ring)
	}
	text := make([]byte, 0, len(ring))
	text = append(text, ring[start:]...)
	text = append(text, ring[:start]...)
	mb.Text = bytes.ReplaceAll(text, []byte{0}, nil)
	return mb
}

// MessageLine is one line of a FreeBSD message buffer. Messages logged
// through the kernel's log(9) carry a syslog priority, "<N>", which
// dmesg strips; plain printf output has none (Priority -1).
type MessageLine struct {
	Priority int    `json:"priority"`
	Text     string `json:"text"`
}

// Lines splits the buffer into lines, taking off "<N>" priorities as
// dmesg does. A final line without a newline is kept.
func (mb *MessageBuffer) Lines() []MessageLine {
	var out []MessageLine
	rest := mb.Text
	for len(rest) > 0 {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		ml := MessageLine{Priority: -1, Text: string(line)}
		if len(line) > 2 && line[0] == '<' {
			if j := bytes.IndexByte(line, '>'); j > 1 {
				if p, err := strconv.Atoi(string(line[1:j])); err == nil && p >= 0 {
					ml = MessageLine{Priority: p, Text: string(line[j+1:])}
				}
			}
		}
		out = append(out, ml)
	}
	return out
}

// Refuse is the error for a request the FreeBSD view cannot serve.
func (f *FreeBSD) Refuse(what string) error {
	return fmt.Errorf("%s on a FreeBSD minidump (version %d) %w; info, log and rd work", what, f.Dump.Version, ErrNeedsFreeBSDKernel)
}
