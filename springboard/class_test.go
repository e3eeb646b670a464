package springboard

import (
	"errors"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want Class
	}{{1, Trap}, {2, Springboard}, {3, Springboard}, {4, Springboard}, {5, Direct}, {7, Direct}, {15, Direct}} {
		if got := Classify(tc.n); got != tc.want {
			t.Errorf("Classify(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestTooShortError(t *testing.T) {
	err := error(&TooShortError{Addr: 0x10, Len: 1, Where: "f+0x1", Text: "push %rbx"})
	if !errors.Is(err, ErrTooShort) {
		t.Fatal("errors.Is(TooShortError, ErrTooShort) = false")
	}
	for _, want := range []string{"f+0x1", "push %rbx", "1 byte", "trap"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}
