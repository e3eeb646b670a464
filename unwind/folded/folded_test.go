package folded

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	p := New()
	p.Add([]string{"app", "main", "read"}, 3)
	p.Add([]string{"app", "main"}, 1)
	p.Add([]string{"app", "main", "read"}, 2)
	p.Add([]string{"app", "a;b", "x y"}, 7)
	var buf bytes.Buffer
	if err := Write(&buf, p.Stacks()); err != nil {
		t.Fatal(err)
	}
	want := "app;a_b;x y 7\napp;main 1\napp;main;read 5\n"
	if buf.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", buf.String(), want)
	}
	q, err := Parse(strings.NewReader(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	if q.Len() != 3 || q.Total() != 13 {
		t.Fatalf("parsed %d stacks total %d", q.Len(), q.Total())
	}
	if top := q.Top(1); top[0].Value != 7 || top[0].Frames[2] != "x y" {
		t.Fatalf("top %+v", top)
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{"nocount", "a;b x", "a;b -3", " 5"} {
		_, err := Parse(strings.NewReader(in))
		if !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: err %v, want ErrSyntax", in, err)
		}
	}
}
