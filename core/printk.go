package core

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/kinst/kinst/kernel/dumpview"
)

// LogRecord is one printk record.
type LogRecord struct {
	Seq    uint64 `json:"seq"`
	TimeNS uint64 `json:"ts_nsec"`
	Level  int    `json:"level"`
	Text   string `json:"text"`
}

// Descriptor states of the lockless ring buffer (printk_ringbuffer.h):
// the top two bits of state_var; the rest is the record id.
const (
	descCommitted = 1
	descFinalized = 2
	descStateBits = 64 - 2
	descIDMask    = 1<<descStateBits - 1
	maxRingBits   = 28
	maxRingBytes  = 512 << 20 // log_buf_len is at most 2^25 bytes in practice
)

// Log reads the printk ring buffer (the lockless printk_ringbuffer of
// Linux 5.10 and later), oldest record first, using the layout VMCOREINFO
// describes. Records that the dump caught half-written are skipped.
func (k *Kernel) Log() ([]LogRecord, error) {
	prbSym, ok := k.Info.Symbols["prb"]
	if !ok {
		return nil, &dumpview.MissingError{What: "SYMBOL(prb) (the lockless printk ring buffer of Linux 5.10+)", Where: "VMCOREINFO"}
	}
	l, err := prbLayoutOf(k.Info)
	if err != nil {
		return nil, err
	}
	prb, err := k.ReadU64(prbSym)
	if err != nil {
		return nil, fmt.Errorf("printk: prb: %w", err)
	}
	var errs []error
	rd := func(a uint64) uint64 {
		x, e := k.ReadU64(a)
		if e != nil {
			errs = append(errs, e)
		}
		return x
	}
	dr, tr := prb+l.descRing, prb+l.textRing
	cbits, sbits := uint(rd(dr+l.countBits)&0xffffffff), uint(rd(tr+l.sizeBits)&0xffffffff)
	descs, infos, data := rd(dr+l.descsOff), rd(dr+l.infosOff), rd(tr+l.dataOff)
	head, tail := rd(dr+l.headID), rd(dr+l.tailID)
	if len(errs) > 0 {
		return nil, fmt.Errorf("printk: %v", errs[0])
	}
	if cbits > maxRingBits || sbits > maxRingBits {
		return nil, fmt.Errorf("printk: ring sizes 2^%d descriptors, 2^%d text bytes are not plausible", cbits, sbits)
	}
	count, size := uint64(1)<<cbits, uint64(1)<<sbits
	if total := count*(l.descSize+l.infoSize) + size; total > maxRingBytes {
		return nil, fmt.Errorf("printk: a ring of %d descriptors and %d text bytes (%d MiB) is not plausible", count, size, total>>20)
	}
	db, err := k.ReadBytes(descs, int(count*l.descSize))
	if err != nil {
		return nil, fmt.Errorf("printk: descriptors: %w", err)
	}
	ib, err := k.ReadBytes(infos, int(count*l.infoSize))
	if err != nil {
		return nil, fmt.Errorf("printk: infos: %w", err)
	}
	text, err := k.ReadBytes(data, int(size))
	if err != nil {
		return nil, fmt.Errorf("printk: text ring: %w", err)
	}
	le := binary.LittleEndian
	var out []LogRecord
	for id := tail & descIDMask; ; id = (id + 1) & descIDMask {
		i := id & (count - 1)
		d := db[i*l.descSize:]
		sv := le.Uint64(d[l.stateVar:])
		state := sv >> descStateBits
		if sv&descIDMask == id && (state == descCommitted || state == descFinalized) {
			begin, next := le.Uint64(d[l.textLpos+l.lposBegin:]), le.Uint64(d[l.textLpos+l.lposNext:])
			info := ib[i*l.infoSize:]
			if body, ok := blockData(text, sbits, begin, next); ok {
				n := min(int(le.Uint16(info[l.infoLen:])), len(body))
				out = append(out, LogRecord{Seq: le.Uint64(info[l.infoSeq:]), TimeNS: le.Uint64(info[l.infoTS:]),
					Level: int(info[l.infoLen+3] >> 5), Text: string(body[:n])})
			}
		}
		if id == head&descIDMask || len(out) > int(count) {
			break
		}
	}
	return out, nil
}

// prbLayout is the printk ring buffer's layout, as VMCOREINFO gives it.
type prbLayout struct {
	descRing, textRing, countBits, descsOff, infosOff, headID, tailID uint64
	stateVar, textLpos, lposBegin, lposNext, sizeBits, dataOff        uint64
	infoSeq, infoTS, infoLen, descSize, infoSize                      uint64
}

// prbLayoutOf reads the layout from VMCOREINFO and checks it fits its
// own sizes.
func prbLayoutOf(v *dumpview.VMCoreInfo) (prbLayout, error) {
	var errs []error
	off := func(name string) uint64 {
		o, err := v.Offset(name)
		if err != nil {
			errs = append(errs, err)
		}
		return uint64(o)
	}
	var l prbLayout
	l.descRing, l.textRing = off("printk_ringbuffer.desc_ring"), off("printk_ringbuffer.text_data_ring")
	l.countBits, l.descsOff, l.infosOff = off("prb_desc_ring.count_bits"), off("prb_desc_ring.descs"), off("prb_desc_ring.infos")
	l.headID, l.tailID = off("prb_desc_ring.head_id"), off("prb_desc_ring.tail_id")
	l.stateVar, l.textLpos = off("prb_desc.state_var"), off("prb_desc.text_blk_lpos")
	l.lposBegin, l.lposNext = off("prb_data_blk_lpos.begin"), off("prb_data_blk_lpos.next")
	l.sizeBits, l.dataOff = off("prb_data_ring.size_bits"), off("prb_data_ring.data")
	l.infoSeq, l.infoTS, l.infoLen = off("printk_info.seq"), off("printk_info.ts_nsec"), off("printk_info.text_len")
	l.descSize, l.infoSize = uint64(v.Sizes["prb_desc"]), uint64(v.Sizes["printk_info"])
	if len(errs) > 0 || l.descSize == 0 || l.infoSize == 0 {
		return l, fmt.Errorf("printk: VMCOREINFO lacks the ring buffer layout: %v", errs)
	}
	if max(l.stateVar+8, l.textLpos+max(l.lposBegin, l.lposNext)+8) > l.descSize || max(l.infoSeq+8, l.infoTS+8, l.infoLen+4) > l.infoSize {
		return l, fmt.Errorf("printk: VMCOREINFO's ring buffer layout does not fit its own sizes (prb_desc %d, printk_info %d bytes)", l.descSize, l.infoSize)
	}
	return l, nil
}

// blockData returns a record's text from the data ring: a block is an
// 8-byte id followed by the text, and one that would wrap starts again
// at the ring's beginning (get_data in printk_ringbuffer.c).
func blockData(ring []byte, sizeBits uint, begin, next uint64) ([]byte, bool) {
	if begin&1 != 0 && next&1 != 0 {
		return nil, false // data-less record
	}
	size := uint64(1) << sizeBits
	wraps := func(l uint64) uint64 { return l >> sizeBits }
	var start, n uint64
	switch {
	case wraps(begin) == wraps(next) && begin < next:
		start, n = begin&(size-1), next-begin
	case wraps(begin+size) == wraps(next):
		start, n = 0, next&(size-1)
	default:
		return nil, false
	}
	if n < 8 || start+n > size {
		return nil, false
	}
	return ring[start+8 : start+n], true
}

// PanicMessage returns the message of the last "Kernel panic - not
// syncing:" record, or "" if the log has none.
func PanicMessage(recs []LogRecord) string {
	const prefix = "Kernel panic - not syncing: "
	for i := len(recs) - 1; i >= 0; i-- {
		if msg, ok := strings.CutPrefix(recs[i].Text, prefix); ok {
			return strings.TrimSpace(msg)
		}
	}
	return ""
}
