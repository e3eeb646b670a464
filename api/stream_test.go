package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// The streaming encoders write what encoding/json writes, and the
// streaming decoders read back what encoding/json reads, for reports
// with functions, without (a summary) and with an empty list, and with
// strings that look like the member the encoder looks for.
func TestStreamAsEncodingJSON(t *testing.T) {
	point, why := "vfs_read+0x4", `no splice: "quoted", "functions":null "functions": null`
	exit := 3
	full := &CoverReport{Session: `s"functions":null`, Filter: "pid 42", FunctionCount: 2, RefusedBlocks: 1, TotalBlocks: 3,
		Functions: []CoverFunction{
			{Function: "vfs_read", Address: 0xffffffff81000000, Total: 2, Covered: 1, Refused: 1, Blocks: []CoverBlock{
				{Index: 0, Start: 1, End: 5, Covered: true, Point: &point, Lines: []string{"fs/read_write.c:1"}},
				{Index: 1, Start: 5, End: 9, Refused: &why, Lines: []string{}},
			}},
			{Function: "gone", Error: "not a function", Blocks: []CoverBlock{}},
		},
		Timeline: []CoverSample{{ElapsedNS: 1, LiveProbes: 2, Covered: 1}}, ExitStatus: &exit}
	for _, tc := range []struct {
		name string
		r    *CoverReport
	}{
		{"full", full},
		{"summary", &CoverReport{Session: "s", FunctionCount: 50000, TotalBlocks: 550000, Timeline: []CoverSample{}}},
		{"no functions", &CoverReport{Functions: []CoverFunction{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, _ := json.Marshal(tc.r)
			var got bytes.Buffer
			if err := tc.r.WriteJSON(&got, false); err != nil {
				t.Fatal(err)
			}
			if got.String() != string(want) {
				t.Errorf("WriteJSON:\n%s\njson.Marshal:\n%s", got.String(), want)
			}
			want, _ = json.MarshalIndent(tc.r, "", "  ")
			got.Reset()
			if err := tc.r.WriteJSON(&got, true); err != nil {
				t.Fatal(err)
			}
			if got.String() != string(want)+"\n" {
				t.Errorf("WriteJSON indented:\n%s\njson.MarshalIndent:\n%s", got.String(), want)
			}
			var back, wantBack CoverReport
			if err := back.ReadJSON(bytes.NewReader(got.Bytes())); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal(got.Bytes(), &wantBack)
			if !reflect.DeepEqual(back, wantBack) {
				t.Errorf("ReadJSON:\n%+v\njson.Unmarshal:\n%+v", back, wantBack)
			}

			s := &Session{ID: "1", Name: "n", Created: time.Unix(5, 0).UTC(), Probes: []Probe{}, Cover: tc.r}
			want, _ = json.Marshal(s)
			got.Reset()
			if err := s.WriteJSON(&got); err != nil {
				t.Fatal(err)
			}
			if strings.TrimSuffix(got.String(), "\n") != string(want) {
				t.Errorf("Session.WriteJSON:\n%s\njson.Marshal:\n%s", got.String(), want)
			}
			var sback, swant Session
			if err := sback.ReadJSON(bytes.NewReader(got.Bytes())); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal(got.Bytes(), &swant)
			if !reflect.DeepEqual(sback, swant) {
				t.Errorf("Session.ReadJSON:\n%+v\njson.Unmarshal:\n%+v", sback, swant)
			}
		})
	}
	// A session without coverage, and bad input.
	var s Session
	if err := s.ReadJSON(strings.NewReader(`{"id":"7","probes":[],"cover":null}`)); err != nil || s.ID != "7" || s.Cover != nil {
		t.Errorf("no cover: %+v, %v", s, err)
	}
	for _, bad := range []string{``, `[]`, `{"cover":[]}`, `{"cover":{"functions":{}}}`, `{"cover":{"functions":[1]}}`, `{"id":"1"`} {
		var s Session
		if err := s.ReadJSON(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// WriteJSON holds one function's JSON at a time: while it writes a
// report of 200,000 blocks (47 MB of JSON) the heap grows by a small part
// of that, where json.MarshalIndent holds all of it and more.
func TestWriteJSONStreams(t *testing.T) {
	r := &CoverReport{Session: "big", Functions: make([]CoverFunction, 20000)}
	for i := range r.Functions {
		f := &r.Functions[i]
		f.Function, f.Total = "some_kernel_function", 10
		for b := range 10 {
			at := "some_kernel_function+0x10"
			f.Blocks = append(f.Blocks, CoverBlock{Index: b, Start: Addr(b), End: Addr(b + 1), Point: &at, Lines: []string{}})
		}
	}
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	w := &peakWriter{}
	if err := r.WriteJSON(w, true); err != nil {
		t.Fatal(err)
	}
	grew := int64(w.peak) - int64(base.HeapAlloc)
	t.Logf("%d bytes of JSON written; the heap grew by at most %d bytes while they were", w.n, grew)
	if w.n < 40<<20 || grew > int64(w.n)/8 {
		t.Errorf("%d bytes of JSON: the heap grew by %d bytes while WriteJSON wrote them", w.n, grew)
	}
}

// peakWriter counts what is written and samples the heap at each write.
type peakWriter struct {
	n    int
	peak uint64
}

func (w *peakWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	w.peak = max(w.peak, m.HeapAlloc)
	return len(p), nil
}

// BenchmarkCoverReportWriteJSON: the indented JSON of a report the size
// of a process's libc coverage (3,706 functions, 71,211 blocks, each
// with two source lines).
func BenchmarkCoverReportWriteJSON(b *testing.B) {
	r := &CoverReport{Session: "libc", Functions: make([]CoverFunction, 3706)}
	for i := range r.Functions {
		f := &r.Functions[i]
		f.Function, f.Module, f.Address, f.Total = fmt.Sprintf("function_%d", i), "libc.so.6", Addr(0x7f0000000000+i*256), 19
		for k := range 19 {
			at := fmt.Sprintf("%s+%#x", f.Function, k*8)
			f.Blocks = append(f.Blocks, CoverBlock{Index: k, Start: f.Address + Addr(k*8), End: f.Address + Addr(k*8+8), Point: &at,
				Covered: k%3 == 0, Lines: []string{"./string/../sysdeps/x86_64/multiarch/file.c:120", "./string/../sysdeps/x86_64/multiarch/file.c:121"}})
		}
	}
	var n int
	for b.Loop() {
		w := &countWriter{}
		if err := r.WriteJSON(w, true); err != nil {
			b.Fatal(err)
		}
		n = w.n
	}
	b.SetBytes(int64(n))
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
