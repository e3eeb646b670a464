package kernel

import (
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
)

// notifierBlock is a struct notifier_block as 6.1 lays it out:
// notifier_call, next, priority.
func notifierBlock(call, next uint64, prio int32) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b, call)
	binary.LittleEndian.PutUint64(b[8:], next)
	binary.LittleEndian.PutUint32(b[16:], uint32(prio))
	return b
}

func TestReadDieChain(t *testing.T) {
	call, next, prio := Field{0, 8}, Field{8, 8}, Field{16, 4}
	const head, a, b, c = 0xffffffff83000000, 0xffff888001000000, 0xffff888001000100, 0xffffffffc0001000
	ptr := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	for _, tc := range []struct {
		name string
		mem  memReader
		want []DieNotifier
		err  string
	}{
		{"empty", memReader{head: ptr(0)}, nil, ""},
		{"three", memReader{head: ptr(a), a: notifierBlock(0xffffffff81001000, b, 0x7fffffff),
			b: notifierBlock(0xffffffff81002000, c, 0x7fffffff), c: notifierBlock(0xffffffffc0000010, 0, 0)},
			[]DieNotifier{{0xffffffff81001000, 0x7fffffff}, {0xffffffff81002000, 0x7fffffff}, {0xffffffffc0000010, 0}}, ""},
		{"loop", memReader{head: ptr(a), a: notifierBlock(0xffffffff81001000, b, 1), b: notifierBlock(0xffffffff81002000, a, 1)},
			[]DieNotifier{{0xffffffff81001000, 1}, {0xffffffff81002000, 1}}, "does not end"},
		{"unreadable block", memReader{head: ptr(a)}, nil, "notifier_block"},
		{"unreadable head", memReader{}, nil, "die_chain"},
	} {
		got, err := readDieChain(tc.mem, head, call, next, prio)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		}
	}
}
