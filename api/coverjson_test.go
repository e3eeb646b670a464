package api

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// appendFunction writes what encoding/json writes for every shape of
// function (module and error or none, blocks nil, empty or many, each
// block's optional members and lines nil, empty or many) and for
// strings encoding/json escapes: control characters, quotes, HTML,
// non-ASCII, U+2028 and invalid UTF-8.
func TestCoverFunctionJSON(t *testing.T) {
	strs := []string{"", "vfs_read", "fs/read_write.c:451", `a"b`, `back\slash`, "<a&b>", "nul\x00us\x1f", "\b\f\n\r\t",
		"é", "line\u2028sep", "bad\xffutf8", "~!@#$%^*()_+{}|:?[];',./` ="}
	pick := func(r *rand.Rand) string { return strs[r.IntN(len(strs))] }
	ptr := func(r *rand.Rand) *string {
		if r.IntN(2) == 0 {
			return nil
		}
		s := pick(r)
		return &s
	}
	addr := func(r *rand.Rand) Addr {
		switch r.IntN(3) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64
		}
		return Addr(r.Uint64())
	}
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 2000 {
		f := CoverFunction{Function: pick(r), Address: addr(r), Total: r.IntN(5) - 1, Covered: r.IntN(1 << 20), Refused: -r.IntN(3)}
		if r.IntN(2) == 0 {
			f.Module = pick(r)
		}
		if r.IntN(4) == 0 {
			f.Error = pick(r)
		}
		switch r.IntN(4) {
		case 0: // nil
		case 1:
			f.Blocks = []CoverBlock{}
		default:
			for i := range r.IntN(4) + 1 {
				b := CoverBlock{Index: i - r.IntN(2), Inferred: r.IntN(2) == 0, Start: addr(r), End: addr(r),
					Covered: r.IntN(2) == 0, Point: ptr(r), Refused: ptr(r)}
				switch r.IntN(3) {
				case 0: // nil
				case 1:
					b.Lines = []string{}
				default:
					for range r.IntN(3) + 1 {
						b.Lines = append(b.Lines, pick(r))
					}
				}
				f.Blocks = append(f.Blocks, b)
			}
		}
		want, err := json.Marshal(&f)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendFunction(nil, &f, jsonIndent{}); string(got) != string(want) {
			t.Fatalf("function %d, compact:\n%s\njson.Marshal:\n%s", n, got, want)
		}
		want, _ = json.MarshalIndent(&f, "    ", "  ")
		if got := appendFunction(nil, &f, jsonIndent{on: true, prefix: "    "}); string(got) != string(want) {
			t.Fatalf("function %d, indented:\n%s\njson.MarshalIndent:\n%s", n, got, want)
		}
	}
	for _, a := range []Addr{0, 1, 0xffffffff81000000, math.MaxUint64} {
		if got, _ := a.MarshalText(); string(got) != fmt.Sprintf("%#x", uint64(a)) {
			t.Errorf("Addr(%#x).MarshalText() = %s", uint64(a), got)
		}
	}
}
