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
	sh := &coreShell{k: k, g: g, id: id, graphFile: graphFile, asJSON: asJSON, w: w, enc: json.NewEncoder(w)}
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
		if f[0] == "quit" || f[0] == "exit" {
			return nil
		}
		if !sh.exec(f[0], f[1:]) {
			sh.fail(fmt.Errorf("%q: not a command, or wrong arguments (help lists them)", sc.Text()))
		}
	}
	return sc.Err()
}

// coreShell is `kinst core … shell`'s state: the dump, its type graph
// and how answers are written.
type coreShell struct {
	k         *core.Kernel
	g         *typegraph.Graph
	id        *typeid.Identifier
	graphFile string // where the graph is saved, "" for nowhere
	asJSON    bool
	w         io.Writer
	enc       *json.Encoder
}

// fail writes err as the command's answer.
func (s *coreShell) fail(err error) {
	if s.asJSON {
		s.enc.Encode(map[string]string{"error": err.Error()})
	} else {
		fmt.Fprintf(s.w, "error: %v\n", err)
	}
}

// answer writes v as JSON, or calls text.
func (s *coreShell) answer(v any, text func()) {
	if s.asJSON {
		s.enc.Encode(v)
	} else {
		text()
	}
}

// exec runs one command; false: it is not one, or its arguments are
// wrong.
func (s *coreShell) exec(cmd string, args []string) bool {
	w := s.w
	switch {
	case cmd == "help":
		fmt.Fprintln(w, coreShellHelp)
	case cmd == "whattype" && len(args) == 1:
		s.whattype(args[0])
	case cmd == "istype" && len(args) == 2:
		s.istype(args[0], strings.TrimPrefix(args[1], "struct "))
	case cmd == "p" && len(args) > 0:
		expr := strings.Join(args, " ")
		if n, err := printValue(s.k, "", expr); err != nil {
			s.fail(err)
		} else {
			s.answer(n, func() { writePrint(w, expr, n) })
		}
	case cmd == "struct" && len(args) >= 2:
		at, ms := cutFlag(args[1:], "-m")
		if n, err := structValue(s.k, "", args[0], at, ms); err != nil {
			s.fail(err)
		} else {
			s.answer(n, func() { writeStruct(w, n) })
		}
	case cmd == "list" && len(args) >= 2:
		head, show := cutFlag(args[1:], "-s")
		out, err := listValue(s.k, "", args[0], head, show)
		if out == nil && s.asJSON {
			out = []ListEntry{}
		}
		s.answer(out, func() { writeList(w, out) })
		if err != nil {
			s.fail(err)
		}
	case cmd == "findleaks" && (len(args) == 0 || len(args) == 1 && (args[0] == "-v" || args[0] == "--verbose")):
		if r, err := findLeaks(s.k, "", s.g); err != nil {
			s.fail(err)
		} else {
			writeLeaks(r, len(args) == 1, s.asJSON, w)
		}
	case cmd == "reach" && len(args) == 0:
		r := s.g.Report().GreatestReach
		s.answer(map[string]any{"greatest_reach": r}, func() {
			if r == nil {
				fmt.Fprintln(w, "no untyped object points at another")
			} else {
				fmt.Fprintf(w, "greatest reach: %s (%s), %d untyped objects reachable from it\n", r.Object, r.Cache, r.Reach)
			}
		})
	case cmd == "typegraph" && len(args) == 0:
		s.answer(s.g.Report(), func() { printTypeGraph(s.g, nil, 0, time.Now(), false, w) })
	case cmd == "save" && len(args) == 1:
		if err := saveGraph(s.k, s.g, args[0]); err != nil {
			s.fail(err)
		} else if !s.asJSON {
			fmt.Fprintf(w, "saved to %s\n", args[0])
		}
	default:
		return false
	}
	return true
}

// whattype answers `whattype ADDR|SYM`.
func (s *coreShell) whattype(arg string) {
	a, err := resolveAddr(s.k, arg)
	if err != nil {
		s.fail(err)
		return
	}
	r, err := s.id.WhatType(a)
	if err != nil {
		s.fail(err)
		return
	}
	if r.Kind == typeid.KindSlab && r.Object != nil && r.Type == nil {
		typeByGraph(r, s.g, a)
	}
	s.answer(r, func() { printWhatType(s.w, r) })
}

// istype answers `istype ADDR TYPE`, saving the graph it taught.
func (s *coreShell) istype(addr, typ string) {
	res, err := isType(s.k, s.g, addr, typ)
	if err != nil {
		s.fail(err)
		return
	}
	if s.graphFile != "" {
		if err := saveGraph(s.k, s.g, s.graphFile); err != nil {
			s.fail(err)
		}
	}
	s.answer(res, func() { printIsType(s.w, res) })
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
