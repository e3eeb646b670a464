package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
)

// A whole-kernel coverage report has over half a million blocks: over
// 100 MB of JSON. Marshalled or decoded whole it is held twice over
// beside the report itself, and kerninstd and kinst were killed for it
// in a 1 GiB guest. These functions encode and decode it one function at
// a time, byte for byte as encoding/json does.

// functionsNull is how json.Marshal writes a CoverReport's nil
// Functions. Inside a string value its quotes would be escaped, so the
// only match is the member itself.
var (
	functionsNull       = []byte(`"functions":null`)
	functionsNullIndent = []byte(`"functions": null`)
)

// WriteJSON writes r as json.Marshal does (indent false) or as
// json.MarshalIndent(r, "", "  ") does, with a newline after it as a
// json.Encoder writes it (indent true); one function at a time.
func (r *CoverReport) WriteJSON(w io.Writer, indent bool) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	if err := r.writeJSON(bw, indent); err != nil {
		return err
	}
	if indent {
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

func (r *CoverReport) writeJSON(bw *bufio.Writer, indent bool) error {
	head := *r
	head.Functions = nil
	var b []byte
	var err error
	if indent {
		b, err = json.MarshalIndent(&head, "", "  ")
	} else {
		b, err = json.Marshal(&head)
	}
	if err != nil {
		return err
	}
	null := functionsNull
	if indent {
		null = functionsNullIndent
	}
	at := bytes.Index(b, null)
	if r.Functions == nil || at < 0 {
		_, err := bw.Write(b)
		return err
	}
	bw.Write(b[:at])
	switch {
	case len(r.Functions) == 0:
		bw.Write(null[:len(null)-len("null")])
		bw.WriteString("[]")
	case indent:
		bw.WriteString("\"functions\": [\n    ")
	default:
		bw.WriteString(`"functions":[`)
	}
	// Functions are encoded on every CPU (a process's libc coverage:
	// 3,706 functions, 26 MB of indented JSON) a batch at a time, and
	// written in order, each into a buffer used again once written.
	in := jsonIndent{on: indent, prefix: "    "}
	var bufs sync.Pool
	err = marshalBatches(len(r.Functions), func(i int) ([]byte, error) {
		var buf []byte
		if p, ok := bufs.Get().(*[]byte); ok {
			buf = (*p)[:0]
		}
		return appendFunction(buf, &r.Functions[i], in), nil
	}, func(i int, f []byte) {
		defer bufs.Put(&f)
		if i > 0 {
			if indent {
				bw.WriteString(",\n    ")
			} else {
				bw.WriteByte(',')
			}
		}
		bw.Write(f)
	})
	if err != nil {
		return err
	}
	if len(r.Functions) > 0 {
		if indent {
			bw.WriteString("\n  ")
		}
		bw.WriteByte(']')
	}
	_, err = bw.Write(b[at+len(null):])
	return err
}

// WriteJSON writes s as compact JSON, byte for byte as json.Marshal does,
// its coverage report (the last member) through CoverReport.WriteJSON.
func (s *Session) WriteJSON(w io.Writer) error {
	if s.Cover == nil {
		return json.NewEncoder(w).Encode(s)
	}
	head := *s
	head.Cover = nil
	b, err := json.Marshal(&head)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	// b ends in '}' and has members before it (id, name, created, probes).
	bw.Write(b[:len(b)-1])
	bw.WriteString(`,"cover":`)
	if err := s.Cover.writeJSON(bw, false); err != nil {
		return err
	}
	bw.WriteString("}\n")
	return bw.Flush()
}

// ReadJSON decodes a CoverReport from rd as json.Decoder.Decode does,
// one function at a time.
func (r *CoverReport) ReadJSON(rd io.Reader) error {
	dec := json.NewDecoder(rd)
	if err := delim(dec, '{'); err != nil {
		return err
	}
	return r.readObject(dec)
}

// ReadJSON decodes a Session from rd as json.Decoder.Decode does, its
// coverage report one function at a time.
func (s *Session) ReadJSON(rd io.Reader) error {
	dec := json.NewDecoder(rd)
	if err := delim(dec, '{'); err != nil {
		return err
	}
	var cover *CoverReport
	err := readMembers(dec, s, func(key string) (bool, error) {
		if key != "cover" {
			return false, nil
		}
		if open, err := openOrNull(dec, '{'); !open {
			return true, err
		}
		cover = &CoverReport{}
		return true, cover.readObject(dec)
	})
	s.Cover = cover
	return err
}

// readObject reads the members of a CoverReport whose '{' dec has read.
func (r *CoverReport) readObject(dec *json.Decoder) error {
	var fns []CoverFunction
	err := readMembers(dec, r, func(key string) (bool, error) {
		if key != "functions" {
			return false, nil
		}
		if open, err := openOrNull(dec, '['); !open {
			return true, err
		}
		fns = []CoverFunction{}
		for dec.More() {
			var f CoverFunction
			if err := dec.Decode(&f); err != nil {
				return true, err
			}
			fns = append(fns, f)
		}
		return true, delim(dec, ']')
	})
	r.Functions = fns
	return err
}

// readMembers reads an object's members up to its '}' (its '{' read):
// each member that own does not take (false) is decoded into v as
// json.Unmarshal would, all of them together.
func readMembers(dec *json.Decoder, v any, own func(key string) (bool, error)) error {
	rest := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := t.(string)
		if took, err := own(key); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		} else if took {
			continue
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		rest[key] = raw
	}
	if err := delim(dec, '}'); err != nil {
		return err
	}
	b, err := json.Marshal(rest)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// openOrNull reads null (false) or the opening delimiter d (true).
func openOrNull(dec *json.Decoder, d json.Delim) (bool, error) {
	t, err := dec.Token()
	if err != nil || t == nil {
		return false, err
	}
	if t != d {
		return false, fmt.Errorf("json: %v where %v or null was expected", t, d)
	}
	return true, nil
}

// delim reads the delimiter d.
func delim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return fmt.Errorf("json: %v where %v was expected", t, d)
	}
	return nil
}

// marshalBatches calls marshal(i) for every i in [0, n), a batch at a
// time on up to GOMAXPROCS goroutines (so that at most a batch of
// results is held), and write(i, result) on the calling goroutine in
// order of i. The first error stops it. (The package imports nothing of
// the module: this is internal/parallel's Map, cut down.)
func marshalBatches(n int, marshal func(i int) ([]byte, error), write func(i int, b []byte)) error {
	workers := runtime.GOMAXPROCS(0)
	batch := 16 * workers
	out := make([][]byte, min(n, batch))
	errs := make([]error, len(out))
	for lo := 0; lo < n; lo += batch {
		hi := min(n, lo+batch)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(workers, hi-lo) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := lo + int(next.Add(1)) - 1
					if i >= hi {
						return
					}
					out[i-lo], errs[i-lo] = marshal(i)
				}
			}()
		}
		wg.Wait()
		for i := lo; i < hi; i++ {
			if errs[i-lo] != nil {
				return errs[i-lo]
			}
			write(i, out[i-lo])
			out[i-lo] = nil
		}
	}
	return nil
}
