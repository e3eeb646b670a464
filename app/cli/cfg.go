package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/report"
)

// CFGFormat selects how `kinst cfg` prints.
type CFGFormat int

const (
	CFGText CFGFormat = iota
	CFGJSON
	CFGDot
)

// ShowCFG prints a function's control-flow graph.
func ShowCFG(ctx context.Context, c *api.Client, function string, format CFGFormat, env Env) error {
	g, err := c.CFG(ctx, function)
	if err != nil {
		return err
	}
	return writeCFG(env.Out, g, format, "vmlinux")
}

// ShowCFGProcess prints the control-flow graph of a function of the user
// process pid (FUNC or LIB:FUNC), read through /proc/PID/mem: nothing is
// written into the process. Block indices are those FUNC:BLOCK points and
// kinst cover --user use.
func ShowCFGProcess(pid int, function string, format CFGFormat, env Env) error {
	tg, err := process.Attach(pid)
	if err != nil {
		return err
	}
	defer tg.Close()
	f, err := tg.Func(function)
	if err != nil {
		return err
	}
	return writeCFG(env.Out, report.CFG(f), format, "executable")
}

// writeCFG writes a control-flow graph in format; core names the text
// of a function of no module (vmlinux, or a process's executable).
func writeCFG(w io.Writer, g api.CFG, format CFGFormat, core string) error {
	switch format {
	case CFGJSON:
		return writeJSON(w, g)
	case CFGDot:
		return writeDot(w, g)
	}
	where := core
	if g.Module != "" {
		where = g.Module
	}
	fmt.Fprintf(w, "%s [%s] %#x, %d bytes, %d blocks\n", g.Function, where, uint64(g.Address), g.Size, len(g.Blocks))
	for _, b := range g.Blocks {
		var succ []string
		for _, e := range b.Succs {
			succ = append(succ, fmt.Sprintf("%d (%s)", e.To, e.Kind))
		}
		fmt.Fprintf(w, "\nblock %d", b.Index)
		if len(b.Preds) > 0 {
			fmt.Fprintf(w, "  ← %s", joinInts(b.Preds))
		}
		if len(succ) > 0 {
			fmt.Fprintf(w, "  → %s", strings.Join(succ, ", "))
		}
		if b.Exit != "" {
			fmt.Fprintf(w, "  exit: %s", b.Exit)
		}
		if b.Padding {
			fmt.Fprint(w, "  (padding: never executed)")
		}
		fmt.Fprintln(w)
		for _, in := range b.Instructions {
			live := strings.Join(in.LiveIn, ",")
			if live == "" {
				live = "-"
			}
			class := in.SpliceClass
			if in.Refused != "" {
				class = "refused: " + in.Refused
			}
			text := in.Text
			if in.Target != "" {
				text += " <" + in.Target + ">"
			}
			// +0xOFF, as FUNC+0xOFF is written (a bare +b read as decimal
			// named another instruction).
			fmt.Fprintf(w, "  %-8s %-27s %-44s %-12s live-in: %s\n", fmt.Sprintf("+%#x", in.Offset), spacedHex(in.Bytes), text, class, live)
		}
	}
	return nil
}

func spacedHex(h string) string {
	b, _ := hex.DecodeString(h)
	var s []string
	for _, c := range b {
		s = append(s, fmt.Sprintf("%02x", c))
	}
	return strings.Join(s, " ")
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// writeDot renders the graph for graphviz: one box per block with its
// disassembly, edges labelled by kind.
func writeDot(w io.Writer, g api.CFG) error {
	fmt.Fprintf(w, "digraph %q {\n  node [shape=box fontname=monospace fontsize=10];\n", g.Function)
	for _, b := range g.Blocks {
		var lines []string
		lines = append(lines, fmt.Sprintf("block %d", b.Index))
		for _, in := range b.Instructions {
			lines = append(lines, fmt.Sprintf("+%#x  %s", in.Offset, in.Text))
		}
		if b.Exit != "" {
			lines = append(lines, "["+b.Exit+"]")
		}
		style := ""
		if b.Padding {
			style = " style=dashed"
		}
		label := strings.ReplaceAll(strings.Join(lines, "\\l"), `"`, `\"`) + "\\l"
		fmt.Fprintf(w, "  b%d [label=\"%s\"%s];\n", b.Index, label, style)
	}
	for _, b := range g.Blocks {
		for _, e := range b.Succs {
			fmt.Fprintf(w, "  b%d -> b%d [label=%q];\n", b.Index, e.To, e.Kind)
		}
	}
	_, err := fmt.Fprintln(w, "}")
	return err
}

// ShowStats analyses the whole kernel and prints the census, with progress
// on stderr while it runs.
func ShowStats(ctx context.Context, c *api.Client, asJSON bool, env Env) error {
	w, stderr := env.Out, env.Err
	// On a terminal the progress redraws one line; into a file or a pipe
	// it is one line now and then (a tenth of the way each), not a run of
	// carriage returns.
	tty, shown := isTerminal(stderr), -1
	st, err := c.CFGStats(ctx, func(done, total int) {
		switch {
		case tty:
			fmt.Fprintf(stderr, "\rkinst: analysing %d/%d functions…", done, total)
		case total > 0 && done*10/total != shown:
			shown = done * 10 / total
			fmt.Fprintf(stderr, "kinst: analysing %d/%d functions…\n", done, total)
		}
	})
	if tty {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, st)
	}
	pct := func(n int) string {
		if st.Instructions == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(st.Instructions))
	}
	fmt.Fprintf(w, "modules             %d\nfunctions           %d\nbasic blocks        %d\ninstructions        %d\ninstruction bytes   %d\n",
		st.Modules, st.Functions, st.BasicBlocks, st.Instructions, st.InstructionBytes)
	fmt.Fprintf(w, "padding bytes       %d (never executed: springboard space)\nreturns             %d\ntail calls          %d\nunanalysable jumps  %d\njump tables         %d (resolved; a retpoline kernel is built with -fno-jump-tables)\n",
		st.PaddingBytes, st.Returns, st.TailCalls, st.UnanalysableJump, st.JumpTables)
	fmt.Fprintf(w, "truncated decodes   %d\nfreed init funcs    %d\nunreadable funcs    %d\n", st.Truncated, st.FreedInit, st.Unreadable)
	if n := st.NoSpliceSites; n != nil {
		fmt.Fprintf(w, "kernel-owned sites  %d exception-table, %d static-key, %d static-call, %d ftrace (core kernel and %d modules)\n",
			n.ExTable, n.JumpLabels, n.StaticCalls, n.Ftrace, n.Modules)
	}
	fmt.Fprintln(w, "splice classes (by length):")
	for _, c := range []string{"direct", "springboard", "trap", "refused"} {
		fmt.Fprintf(w, "  %-12s %9d  %s\n", c, st.SpliceClasses[c], pct(st.SpliceClasses[c]))
	}
	if short := st.SpliceClasses["springboard"] + st.SpliceClasses["trap"]; st.Coverable > 0 && short > 0 {
		fmt.Fprintf(w, "covering splices    %d of the %d spliceable 1-4-byte instructions (%.1f%%) can take one\n",
			st.Coverable, short, 100*float64(st.Coverable)/float64(short))
	}
	if sb := st.Springboard; sb != nil && sb.Short > 0 {
		share := func(n int) string { return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(sb.Short)) }
		fmt.Fprintf(w, "springboard space:\n  runs %d, %d bytes, %d disjoint 5-byte slots (padding after jmp/ret)\n", sb.Runs, sb.Bytes, sb.Slots)
		fmt.Fprintf(w, "  short instructions %d: %d (%s) have a slot within rel8 reach, %d (%s) get one all at once, %d (%s) have none in reach\n",
			sb.Short, sb.InReach, share(sb.InReach), sb.Assigned, share(sb.Assigned), sb.Trap, share(sb.Trap))
		fmt.Fprintf(w, "  %d (%s) can take a covering splice (a jmp rel32 over them and the next instructions of their block); %d (%s) have neither: trap splices\n",
			sb.Covering, share(sb.Covering), sb.TrapOnly, share(sb.TrapOnly))
	}
	fmt.Fprintf(w, "analysed in %.2f s\n", st.Seconds)
	return nil
}

// ShowCalls prints a function's callers and callees.
func ShowCalls(ctx context.Context, c *api.Client, function string, asJSON bool, env Env) error {
	w, stderr := env.Out, env.Err
	fmt.Fprintln(stderr, "kinst: reading the call graph (the first request analyses the whole kernel)…")
	g, err := c.Calls(ctx, function)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, g)
	}
	fmt.Fprintf(w, "%s %#x\n", g.Function, uint64(g.Address))
	for _, part := range []struct {
		title string
		refs  []api.CallRef
	}{{"callees", g.Callees}, {"callers", g.Callers}} {
		fmt.Fprintf(w, "%s (%d):\n", part.title, len(part.refs))
		for _, r := range part.refs {
			fmt.Fprintf(w, "  %-9s %-40s at %s\n", r.Kind, r.Function, r.At)
		}
	}
	return nil
}
