package core

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/internal/dumpgen"
)

// openMinidump writes gen to a file and opens its FreeBSD view.
func openMinidump(t *testing.T, gen *dumpgen.Minidump) *FreeBSD {
	t.Helper()
	b, err := gen.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "vmcore.0")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := dump.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	f, ok := OpenFreeBSD(d)
	if !ok {
		t.Fatalf("OpenFreeBSD(%s dump) = false", d.Format())
	}
	return f
}

// msgMinidump is a minidump with one dumped page and the given msgbuf.
func msgMinidump(version int, ring, trailer []byte) *dumpgen.Minidump {
	m := &dumpgen.Minidump{Version: version, KernBase: 0xffffffff80000000, DmapBase: 0xfffff80000000000, DmapEnd: 0xfffffc0000000000,
		Msgbuf: ring, MsgbufTrailer: trailer, Pages: map[uint64][]byte{0x1000: make([]byte, 4096)}, MaxPhys: 0x40000}
	if version == 3 {
		m.DumpAvail = [][2]uint64{{0x1000, 0x40000}}
	}
	return m
}

// logStream is n numbered kernel messages, some with a log(9) priority.
func logStream(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		if i%3 == 0 {
			fmt.Fprintf(&b, "<6>")
		}
		fmt.Fprintf(&b, "message %d: the quick brown fox\n", i)
	}
	b.WriteString("panic: page fault\n")
	return b.Bytes()
}

// stripPriority removes a line's leading "<N>", as dmesg prints it.
func stripPriority(l string) string {
	if strings.HasPrefix(l, "<6>") {
		return l[3:]
	}
	return l
}

func TestFreeBSDMessageBuffer(t *testing.T) {
	const total = 8192 // kern.msgbufsize, page-aligned as the default is
	for _, tc := range []struct {
		name    string
		stream  []byte
		trailer bool // struct msgbuf after the ring
		ordered bool
		// wantTail: the output is the last len(ring) bytes of the stream
		// (priorities aside); otherwise the whole stream.
		wantTail bool
	}{
		{"wrapped", logStream(400), true, true, true},
		{"not-wrapped", logStream(20), true, true, false},
		{"not-wrapped-no-header", logStream(20), false, false, false},
		{"exactly-full", bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz012345678901234567890123456789\n"), 8120/67+1)[:8120], true, true, false},
	} {
		for version := 1; version <= 3; version++ {
			t.Run(fmt.Sprintf("%s/v%d", tc.name, version), func(t *testing.T) {
				ring, hdr := dumpgen.MsgbufRing(total, tc.stream, 0xfffff80000200000)
				if !tc.trailer {
					hdr = nil
				}
				f := openMinidump(t, msgMinidump(version, ring, hdr))
				mb := f.MessageBuffer()
				if mb.Ordered != tc.ordered || mb.Size != total-dumpgen.MsgbufHdrSize {
					t.Fatalf("ordered %v size %d, want %v %d", mb.Ordered, mb.Size, tc.ordered, total-dumpgen.MsgbufHdrSize)
				}
				want := tc.stream
				if tc.wantTail {
					want = tc.stream[len(tc.stream)-mb.Size:]
				}
				if !bytes.Equal(mb.Text, want) {
					t.Fatalf("text:\n%.200q…\nwant:\n%.200q…", mb.Text, want)
				}
				// Lines: every whole line of the stream's tail, priority
				// taken off; a wrapped ring starts with a partial line.
				orig := strings.Split(strings.TrimSuffix(string(tc.stream), "\n"), "\n")
				got := mb.Lines()
				if len(got) > len(orig) {
					t.Fatalf("%d lines from a stream of %d", len(got), len(orig))
				}
				orig = orig[len(orig)-len(got):]
				for i, l := range got {
					w := stripPriority(orig[i])
					if i == 0 && tc.wantTail {
						if !strings.HasSuffix(orig[i], l.Text) {
							t.Errorf("first line %q is not the end of %q", l.Text, orig[i])
						}
						continue
					}
					if l.Text != w || (l.Priority == 6) != strings.HasPrefix(orig[i], "<6>") {
						t.Errorf("line %d = %+v, want %q", i, l, orig[i])
					}
				}
				if last := got[len(got)-1]; tc.name != "exactly-full" && last.Text != "panic: page fault" {
					t.Errorf("last line %q", last.Text)
				}
			})
		}
	}
}

// A header whose magic or size does not match is not trusted: the text
// is shown as stored (after the last NUL), not turned at a bogus position.
func TestFreeBSDMessageBufferBadHeader(t *testing.T) {
	ring, hdr := dumpgen.MsgbufRing(8192, []byte("boot\nhello\n"), 0)
	for name, corrupt := range map[string]func([]byte){
		"magic": func(h []byte) { h[8] ^= 1 },
		"size":  func(h []byte) { h[12]++ },
	} {
		t.Run(name, func(t *testing.T) {
			h := append([]byte{}, hdr...)
			h[16] = 3 // a write position that would rotate the text
			corrupt(h)
			mb := openMinidump(t, msgMinidump(3, ring, h)).MessageBuffer()
			if mb.Ordered || string(mb.Text) != "boot\nhello\n" {
				t.Errorf("ordered %v text %q", mb.Ordered, mb.Text)
			}
		})
	}
}

func TestFreeBSDMessageLines(t *testing.T) {
	mb := &MessageBuffer{Text: []byte("<4>warn\nplain\n<13>user\n<x>odd\n<>empty\n<-1>neg\nno newline")}
	want := []MessageLine{{4, "warn"}, {-1, "plain"}, {13, "user"}, {-1, "<x>odd"}, {-1, "<>empty"}, {-1, "<-1>neg"}, {-1, "no newline"}}
	got := mb.Lines()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Lines() = %v, want %v", got, want)
	}
}

func TestFreeBSDMemoryBytes(t *testing.T) {
	for version, want := range map[int]uint64{1: 0x40000, 2: 0x40000, 3: 0x3f000} {
		f := openMinidump(t, msgMinidump(version, []byte("x\n"), nil))
		if got := f.MemoryBytes(); got != want {
			t.Errorf("v%d: MemoryBytes() = %#x, want %#x", version, got, want)
		}
	}
}

func TestNewRefusesMinidump(t *testing.T) {
	f := openMinidump(t, msgMinidump(2, []byte("x\n"), nil))
	if _, err := New(f.Dump, Options{}); err == nil || !strings.Contains(err.Error(), "FreeBSD") {
		t.Errorf("New(minidump) = %v, want an error naming FreeBSD", err)
	}
	if err := f.Refuse("listing tasks (ps)"); !errors.Is(err, ErrNeedsFreeBSDKernel) {
		t.Errorf("Refuse = %v", err)
	}
}

// FuzzFreeBSDMessageBuffer: any ring and any bytes where the struct
// msgbuf should be give text made of the ring's bytes, never a panic.
func FuzzFreeBSDMessageBuffer(f *testing.F) {
	ring, hdr := dumpgen.MsgbufRing(8192, logStream(300), 0)
	f.Add(ring[:100], hdr)
	f.Add([]byte("a\x00b\nc"), hdr[:20])
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, ring, hdr []byte) {
		if len(ring) == 0 || len(ring) > 1<<16 {
			return
		}
		if room := (len(ring)+4095)/4096*4096 - len(ring); len(hdr) > room {
			hdr = hdr[:room]
		}
		if len(hdr) >= 16 {
			binary.LittleEndian.PutUint32(hdr[8:], 0x063062) // mostly a valid struct
			binary.LittleEndian.PutUint32(hdr[12:], uint32(len(ring)))
		}
		mb := openMinidump(t, msgMinidump(3, ring, hdr)).MessageBuffer()
		if len(mb.Text) != len(ring)-bytes.Count(ring, []byte{0}) {
			t.Fatalf("text of %d bytes from a ring of %d with %d NULs", len(mb.Text), len(ring), bytes.Count(ring, []byte{0}))
		}
		mb.Lines()
	})
}
