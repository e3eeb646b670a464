package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/typegraph"
	"github.com/kinst/kinst/core/typeid"
)

const coreShellHelp = `commands (one a line):
  whattype ADDR|SYM[+0xOFF]   what the address is, typed by the graph
  istype ADDR TYPE            set the object at ADDR to struct TYPE and
                              reprocess from it alone (incremental)
  p EXPR                      a C expression's value (kinst core p)
  struct T ADDR [-m M,…]      the struct T at ADDR (kinst core struct)
  list T.MEMBER HEAD [-s M,…] the structs on the list_head HEAD
  findleaks [-v]              slab objects no root reaches (kinst core
                              findleaks), -v: each one
  reach                       the untyped object of greatest reach
  typegraph                   the graph's report
  save FILE                   write the graph (load it with --graph-file)
  help, quit`

// CoreShell builds (or loads, with graphFile) the dump's type graph
// once and answers whattype, istype, reach and typegraph commands read
// from in, one a line, with the graph kept in memory: istype changes it
// for the commands after it. With asJSON each answer is one JSON value
// a line ({"error":…} for a command that failed). With graphFile the
// graph is written back after each istype.
func CoreShell(k *core.Kernel, holdOut []string, graphFile string, in io.Reader, asJSON bool, w io.Writer) error {
	if in == nil {
		return fmt.Errorf("shell: no input")
	}
	start := time.Now()
	var g *typegraph.Graph
	var err error
	how := "built"
	if graphFile != "" {
		g, how, err = graphFor(k, holdOut, graphFile)
		how += " " + graphFile
	} else {
		g, err = buildHeapGraph(k, holdOut)
	}
	if err != nil {
		return err
	}
	id, err := typeid.New(kernelView{k}, g.Heap())
	if err != nil {
		return err
	}
	if !asJSON {
		r := g.Report()
		fmt.Fprintf(w, "type graph %s in %.2fs: %d objects, %d typed; type help\n", how, time.Since(start).Seconds(), r.Objects, r.Typed)
	}
	// One JSON value a line, so that a program can read answer by answer.
	enc := json.NewEncoder(w)
	writeJSON := func(w io.Writer, v any) error { return enc.Encode(v) }
	fail := func(err error) {
		if asJSON {
			writeJSON(w, map[string]string{"error": err.Error()})
		} else {
			fmt.Fprintf(w, "error: %v\n", err)
		}
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for {
		if !asJSON {
			fmt.Fprint(w, "> ")
		}
		if !sc.Scan() {
			break
		}
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch cmd, args := f[0], f[1:]; {
		case cmd == "quit" || cmd == "exit":
			return nil
		case cmd == "help":
			fmt.Fprintln(w, coreShellHelp)
		case cmd == "whattype" && len(args) == 1:
			a, err := resolveAddr(k, args[0])
			if err != nil {
				fail(err)
				continue
			}
			r, err := id.WhatType(a)
			if err != nil {
				fail(err)
				continue
			}
			if r.Kind == typeid.KindSlab && r.Object != nil && r.Type == nil {
				typeByGraph(r, g, a)
			}
			if asJSON {
				writeJSON(w, r)
			} else {
				printWhatType(w, r)
			}
		case cmd == "istype" && len(args) == 2:
			res, err := isType(k, g, args[0], strings.TrimPrefix(args[1], "struct "))
			if err != nil {
				fail(err)
				continue
			}
			if graphFile != "" {
				if err := saveGraph(k, g, graphFile); err != nil {
					fail(err)
				}
			}
			if asJSON {
				writeJSON(w, res)
			} else {
				printIsType(w, res)
			}
		case cmd == "p" && len(args) > 0:
			expr := strings.Join(args, " ")
			n, err := printValue(k, "", expr)
			switch {
			case err != nil:
				fail(err)
			case asJSON:
				writeJSON(w, n)
			default:
				writePrint(w, expr, n)
			}
		case cmd == "struct" && len(args) >= 2:
			at, ms := cutFlag(args[1:], "-m")
			n, err := structValue(k, "", args[0], at, ms)
			switch {
			case err != nil:
				fail(err)
			case asJSON:
				writeJSON(w, n)
			default:
				writeStruct(w, n)
			}
		case cmd == "list" && len(args) >= 2:
			head, show := cutFlag(args[1:], "-s")
			out, err := listValue(k, "", args[0], head, show)
			if asJSON {
				if out == nil {
					out = []ListEntry{}
				}
				writeJSON(w, out)
			} else {
				writeList(w, out)
			}
			if err != nil {
				fail(err)
			}
		case cmd == "findleaks" && (len(args) == 0 || len(args) == 1 && (args[0] == "-v" || args[0] == "--verbose")):
			if r, err := findLeaks(k, "", g); err != nil {
				fail(err)
			} else {
				writeLeaks(r, len(args) == 1, asJSON, w)
			}
		case cmd == "reach" && len(args) == 0:
			r := g.Report().GreatestReach
			switch {
			case asJSON:
				writeJSON(w, map[string]any{"greatest_reach": r})
			case r == nil:
				fmt.Fprintln(w, "no untyped object points at another")
			default:
				fmt.Fprintf(w, "greatest reach: %s (%s), %d untyped objects reachable from it\n", r.Object, r.Cache, r.Reach)
			}
		case cmd == "typegraph" && len(args) == 0:
			if asJSON {
				writeJSON(w, g.Report())
			} else {
				printTypeGraph(g, nil, 0, time.Now(), false, w)
			}
		case cmd == "save" && len(args) == 1:
			if err := saveGraph(k, g, args[0]); err != nil {
				fail(err)
			} else if !asJSON {
				fmt.Fprintf(w, "saved to %s\n", args[0])
			}
		default:
			fail(fmt.Errorf("%q: not a command, or wrong arguments (help lists them)", sc.Text()))
		}
	}
	return sc.Err()
}

// cutFlag splits a shell command's words into the expression before
// flag and the comma-separated values after it.
func cutFlag(words []string, flag string) (string, []string) {
	for i, w := range words {
		if w == flag && i+1 < len(words) {
			return strings.Join(words[:i], " "), strings.Split(strings.Join(words[i+1:], ""), ",")
		}
	}
	return strings.Join(words, " "), nil
}
