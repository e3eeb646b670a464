// Package folded owns the folded-stack format of Brendan Gregg's
// stackcollapse scripts: one line per distinct stack, frames from the root
// to the leaf joined by ';', a space, and a count ("comm;f1;f2 42"). It is
// what flamegraph.pl, speedscope and inferno read, and what kinst's own
// flame graph renderer consumes.
package folded

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Stack is one call path, root first, with its weight (samples or
// nanoseconds, whichever the producer counts).
type Stack struct {
	Frames []string
	Value  int64
}

// Profile aggregates stacks by their frames. The zero value is not usable;
// call New.
type Profile struct {
	index  map[string]int
	stacks []Stack
}

// New returns an empty profile.
func New() *Profile { return &Profile{index: make(map[string]int)} }

// Add adds value to the stack with these frames (root first). The frames
// are copied only the first time a stack is seen.
func (p *Profile) Add(frames []string, value int64) {
	key := strings.Join(frames, "\x00")
	if i, ok := p.index[key]; ok {
		p.stacks[i].Value += value
		return
	}
	p.index[key] = len(p.stacks)
	p.stacks = append(p.stacks, Stack{Frames: slices.Clone(frames), Value: value})
}

// Len is the number of distinct stacks.
func (p *Profile) Len() int { return len(p.stacks) }

// Total is the sum of every stack's value.
func (p *Profile) Total() int64 {
	var t int64
	for _, s := range p.stacks {
		t += s.Value
	}
	return t
}

// Stacks returns the stacks sorted by their folded text, the order
// flamegraph.pl expects and one that makes output deterministic.
func (p *Profile) Stacks() []Stack {
	out := slices.Clone(p.stacks)
	slices.SortFunc(out, func(a, b Stack) int { return slices.Compare(a.Frames, b.Frames) })
	return out
}

// Top returns the n heaviest stacks (all when n <= 0), heaviest first.
func (p *Profile) Top(n int) []Stack {
	out := p.Stacks()
	slices.SortStableFunc(out, func(a, b Stack) int {
		switch {
		case a.Value > b.Value:
			return -1
		case a.Value < b.Value:
			return 1
		}
		return 0
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Write writes stacks as folded lines. Characters that would break the
// format (';' and newlines inside a frame) are replaced by '_'; a frame
// may contain spaces, since readers split at the last space.
func Write(w io.Writer, stacks []Stack) error {
	bw := bufio.NewWriter(w)
	for _, s := range stacks {
		for i, f := range s.Frames {
			if i > 0 {
				bw.WriteByte(';')
			}
			bw.WriteString(clean(f))
		}
		bw.WriteByte(' ')
		bw.WriteString(strconv.FormatInt(s.Value, 10))
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

func clean(f string) string {
	if f == "" {
		return "[unknown]"
	}
	if !strings.ContainsAny(f, ";\n\r") {
		return f
	}
	return strings.Map(func(r rune) rune {
		if r == ';' || r == '\n' || r == '\r' {
			return '_'
		}
		return r
	}, f)
}

// ErrSyntax is matched by every SyntaxError.
var ErrSyntax = errors.New("folded: syntax error")

// SyntaxError is a line that is not "frames count".
type SyntaxError struct {
	Line int
	Text string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("folded line %d: want \"frame;frame;… COUNT\", got %q", e.Line, e.Text)
}

func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }

// Parse reads folded lines into a profile, summing repeated stacks.
// Blank lines are skipped.
func Parse(r io.Reader) (*Profile, error) {
	p := New()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), " \t\r")
		if line == "" {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp <= 0 {
			return nil, &SyntaxError{Line: n, Text: line}
		}
		v, err := strconv.ParseInt(line[sp+1:], 10, 64)
		if err != nil || v < 0 {
			return nil, &SyntaxError{Line: n, Text: line}
		}
		p.Add(strings.Split(line[:sp], ";"), v)
	}
	return p, sc.Err()
}
