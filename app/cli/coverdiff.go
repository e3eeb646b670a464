package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

// CoverDiff compares two saved kinst cover --json reports (kinst cover
// diff A B): the blocks covered in one and not the other, per function.
func CoverDiff(pathA, pathB string, asJSON bool, env Env) error {
	a, err := readCoverReport(pathA)
	if err != nil {
		return err
	}
	b, err := readCoverReport(pathB)
	if err != nil {
		return err
	}
	d, err := DiffCover(a, b)
	if err != nil {
		return fmt.Errorf("%s and %s: %w", pathA, pathB, err)
	}
	d.A.File, d.B.File = pathA, pathB
	if asJSON {
		return writeJSON(env.Out, d)
	}
	return writeCoverDiff(env.Out, d)
}

// blockKey identifies a block across runs: its index and its offset in
// the function (addresses move with KASLR).
type blockKey struct {
	index  int
	offset uint64
}

// DiffCover compares two coverage reports. Functions are matched by
// name, blocks by index and offset; reports that share no function are
// an error.
func DiffCover(a, b api.CoverReport) (output.CoverDiff, error) {
	d := output.CoverDiff{A: diffRun(a), B: diffRun(b), Functions: []output.CoverDiffFunction{}}
	inB := map[string]*api.CoverFunction{}
	for i := range b.Functions {
		inB[b.Functions[i].Function] = &b.Functions[i]
	}
	seenA := map[string]bool{}
	shared := 0
	for i := range a.Functions {
		fa := &a.Functions[i]
		seenA[fa.Function] = true
		fb := inB[fa.Function]
		if fb == nil {
			if df := oneSided(fa, "a"); len(df.OnlyA) > 0 {
				d.OnlyA += len(df.OnlyA)
				d.Functions = append(d.Functions, df)
			}
			continue
		}
		shared++
		df := output.CoverDiffFunction{Function: fa.Function, OnlyA: []output.CoverDiffBlock{}, OnlyB: []output.CoverDiffBlock{}}
		blocksB := map[blockKey]*api.CoverBlock{}
		for j := range fb.Blocks {
			bb := &fb.Blocks[j]
			blocksB[blockKey{bb.Index, uint64(bb.Start) - uint64(fb.Address)}] = bb
		}
		matched := map[blockKey]bool{}
		for j := range fa.Blocks {
			ba := &fa.Blocks[j]
			k := blockKey{ba.Index, uint64(ba.Start) - uint64(fa.Address)}
			bb := blocksB[k]
			if bb == nil {
				df.Unmatched++
				continue
			}
			matched[k] = true
			switch {
			case ba.Covered && bb.Covered:
				d.Both++
			case ba.Covered:
				df.OnlyA = append(df.OnlyA, diffBlock(ba, k, bb.Refused))
			case bb.Covered:
				df.OnlyB = append(df.OnlyB, diffBlock(bb, k, ba.Refused))
			default:
				d.Neither++
			}
		}
		for k := range blocksB {
			if !matched[k] {
				df.Unmatched++
			}
		}
		d.OnlyA += len(df.OnlyA)
		d.OnlyB += len(df.OnlyB)
		d.Unmatched += df.Unmatched
		if len(df.OnlyA)+len(df.OnlyB)+df.Unmatched > 0 {
			d.Functions = append(d.Functions, df)
		}
	}
	for i := range b.Functions {
		fb := &b.Functions[i]
		if !seenA[fb.Function] {
			if df := oneSided(fb, "b"); len(df.OnlyB) > 0 {
				d.OnlyB += len(df.OnlyB)
				d.Functions = append(d.Functions, df)
			}
		}
	}
	if shared == 0 && len(a.Functions)+len(b.Functions) > 0 {
		return d, fmt.Errorf("the reports share no function (%d and %d functions): nothing to compare", len(a.Functions), len(b.Functions))
	}
	return d, nil
}

func diffRun(r api.CoverReport) output.CoverDiffRun {
	return output.CoverDiffRun{Session: r.Session, Functions: len(r.Functions), TotalBlocks: r.TotalBlocks, CoveredBlocks: r.CoveredBlocks}
}

func diffBlock(b *api.CoverBlock, k blockKey, otherRefused *string) output.CoverDiffBlock {
	lines := b.Lines
	if lines == nil {
		lines = []string{}
	}
	return output.CoverDiffBlock{Index: k.index, Offset: k.offset, Refused: otherRefused, Lines: lines}
}

// oneSided is a function only one run has: its covered blocks.
func oneSided(f *api.CoverFunction, in string) output.CoverDiffFunction {
	df := output.CoverDiffFunction{Function: f.Function, In: in, OnlyA: []output.CoverDiffBlock{}, OnlyB: []output.CoverDiffBlock{}}
	for j := range f.Blocks {
		b := &f.Blocks[j]
		if !b.Covered {
			continue
		}
		db := diffBlock(b, blockKey{b.Index, uint64(b.Start) - uint64(f.Address)}, nil)
		if in == "a" {
			df.OnlyA = append(df.OnlyA, db)
		} else {
			df.OnlyB = append(df.OnlyB, db)
		}
	}
	return df
}

// writeCoverDiff prints a diff: the two runs, totals, a row per function
// with differences, then each function's blocks.
func writeCoverDiff(w io.Writer, d output.CoverDiff) error {
	for _, r := range []struct {
		tag string
		run output.CoverDiffRun
	}{{"A", d.A}, {"B", d.B}} {
		fmt.Fprintf(w, "%s: %s (session %s): %d of %d blocks covered in %d functions\n", r.tag, r.run.File, r.run.Session,
			r.run.CoveredBlocks, r.run.TotalBlocks, r.run.Functions)
	}
	fmt.Fprintf(w, "covered in A only: %d blocks; in B only: %d; in both: %d; in neither: %d", d.OnlyA, d.OnlyB, d.Both, d.Neither)
	if d.Unmatched > 0 {
		fmt.Fprintf(w, "; %d blocks not compared (the function differs between the runs)", d.Unmatched)
	}
	fmt.Fprintln(w)
	if len(d.Functions) == 0 {
		fmt.Fprintln(w, "no difference")
		return nil
	}
	fmt.Fprintln(w)
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "function\tA only\tB only\tnot compared\t")
	for _, f := range d.Functions {
		name := f.Function
		if f.In != "" {
			name += " (" + map[string]string{"a": "A", "b": "B"}[f.In] + " only)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", name, len(f.OnlyA), len(f.OnlyB), f.Unmatched)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range d.Functions {
		if len(f.OnlyA)+len(f.OnlyB) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", f.Function)
		var tab bytes.Buffer
		tw := newTable(&tab, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  covered in\tblock\tstart\tline\tnote")
		for _, side := range []struct {
			tag, other string
			bs         []output.CoverDiffBlock
		}{{"A", "B", f.OnlyA}, {"B", "A", f.OnlyB}} {
			for _, b := range side.bs {
				line, note := "", ""
				if len(b.Lines) > 0 {
					line = b.Lines[0]
				}
				if b.Refused != nil {
					note = side.other + " refused it: " + *b.Refused
				}
				fmt.Fprintf(tw, "  %s only\t%d\t+%#x\t%s\t%s\n", side.tag, b.Index, b.Offset, line, note)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		// No padding after the last cell of a row without a note.
		for _, l := range strings.Split(strings.TrimSuffix(tab.String(), "\n"), "\n") {
			if _, err := fmt.Fprintln(w, strings.TrimRight(l, " ")); err != nil {
				return err
			}
		}
	}
	return nil
}
