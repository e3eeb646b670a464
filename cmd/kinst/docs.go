package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
)

// The command reference (docs/commands.md) and the man pages (docs/man)
// are made from the command table, so that they say what --help says:
//
//go:generate go run . gendocs --markdown ../../docs/commands.md --man ../../docs/man

var gendocsCommand = &command{
	name:    "gendocs",
	summary: "write the command reference and man pages from the command table",
	help: `Writes the Markdown command reference (--markdown FILE) and one man page
per command (--man DIR: kinst.1, kinst-count.1, kinst-bench-arm.1, …), made
from the same table as --help. Defaults that depend on the environment
(KINST_ADDR, KINST_CACHE, …) are written as they are on a machine without
them. go generate ./cmd/kinst runs it; a test fails when docs/ drifts.`,
	hidden: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		md := fs.String("markdown", "", "write the command reference to this Markdown `FILE`")
		man := fs.String("man", "", "write the man pages into this `DIR`")
		return func(ctx context.Context, inv invocation) (int, error) {
			if *md == "" && *man == "" {
				return 2, usagef("nothing to write: --markdown FILE, --man DIR or both")
			}
			ref, pages := referenceDocs()
			if *md != "" {
				if err := os.WriteFile(*md, ref, 0o644); err != nil {
					return 1, err
				}
			}
			if *man != "" {
				if err := writeManDir(*man, pages); err != nil {
					return 1, err
				}
			}
			return 0, nil
		}
	},
}

// docEnv is the environment the reference is written under: the flags'
// defaults as a machine without these variables has them.
var docEnv = map[string]string{
	"KINST_ADDR": "", "KINST_TOKEN_FILE": "", "KINST_KERNEL": "", "KINST_VM_STATE": "",
	"KINST_CACHE": "~/.cache/kinst",
}

// documented is one command of the reference.
type documented struct {
	path string // "bench arm"
	c    *command
	fs   *pflag.FlagSet
}

// visibleCommands are the table's commands as --help lists them (groups
// without a run of their own left out), with their flags.
func visibleCommands() []documented {
	restore := map[string]*string{}
	for k, v := range docEnv {
		if old, ok := os.LookupEnv(k); ok {
			restore[k] = &old
		} else {
			restore[k] = nil
		}
		if v == "" {
			os.Unsetenv(k)
		} else {
			os.Setenv(k, v)
		}
	}
	defer func() {
		for k, v := range restore {
			if v == nil {
				os.Unsetenv(k)
			} else {
				os.Setenv(k, *v)
			}
		}
	}()
	var out []documented
	eachCommand(false, func(path string, c *command) {
		fs, _ := c.flagSet(path, &globals{}, io.Discard)
		out = append(out, documented{path, c, fs})
	})
	return out
}

// eachCommand visits, in table order, every command that runs (a group
// without a run of its own is descended, not visited) with its path
// ("bench arm"); hidden commands and their subcommands only with hidden.
func eachCommand(hidden bool, visit func(path string, c *command)) {
	var walk func(prefix string, cs []*command)
	walk = func(prefix string, cs []*command) {
		for _, c := range cs {
			if c.hidden && !hidden {
				continue
			}
			path := strings.TrimSpace(prefix + " " + c.name)
			if c.setup != nil {
				visit(path, c)
			}
			walk(path, c.sub)
		}
	}
	walk("", commands)
}

// referenceDocs returns the Markdown reference and the man pages by file
// name.
func referenceDocs() ([]byte, map[string][]byte) {
	cmds := visibleCommands()
	var md bytes.Buffer
	md.WriteString("# kinst command reference\n\n")
	md.WriteString("<!-- Generated from kinst's command table (cmd/kinst) by go generate ./cmd/kinst; do not edit. -->\n\n")
	md.WriteString("Every command as `kinst COMMAND --help` prints it. The same text is in\n")
	md.WriteString("the man pages (`man kinst-count` after `make install`; docs/man here).\n")
	md.WriteString("How the pieces work is in [ARCHITECTURE.md](ARCHITECTURE.md).\n\n")
	md.WriteString("| command | what it does |\n|---|---|\n")
	for _, d := range cmds {
		fmt.Fprintf(&md, "| [`%s`](#%s) | %s |\n", synopsis(d), dashed(d.path), mdCell(d.c.summary))
	}
	var usage bytes.Buffer
	writeUsage(&usage)
	fmt.Fprintf(&md, "\n## kinst\n\n```text\n%s```\n", usage.String())
	for _, d := range cmds {
		var help bytes.Buffer
		writeHelp(&help, d.path, d.c, d.fs)
		fmt.Fprintf(&md, "\n## kinst %s\n\n```text\n%s```\n", d.path, help.String())
	}
	pages := map[string][]byte{"kinst.1": manOverview(cmds)}
	for _, d := range cmds {
		pages[dashed(d.path)+".1"] = manPage(d)
	}
	return md.Bytes(), pages
}

func synopsis(d documented) string { return strings.TrimSpace("kinst " + d.path + " " + d.c.args) }

func mdCell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// dashed is "kinst PATH" with dashes for spaces, kinst-bench-arm for
// "bench arm": both the command's man page name and the GitHub anchor of
// its "## kinst PATH" heading.
func dashed(path string) string { return "kinst-" + strings.ReplaceAll(path, " ", "-") }

// roff escapes text for a man page: backslashes, hyphens (so that
// options stay searchable and uncut), characters past ASCII (as \[uXXXX],
// which every troff reads without preconv), and a line that would start
// with a request character.
func roff(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		if i > 0 {
			b.WriteByte('\n')
		}
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			b.WriteString(`\&`)
		}
		for _, r := range l {
			switch {
			case r == '\\':
				b.WriteString(`\e`)
			case r == '-':
				b.WriteString(`\-`)
			case r > 127:
				fmt.Fprintf(&b, `\[u%04X]`, r)
			default:
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// manText writes help text: paragraphs filled, indented lines as they
// are (they are lists and examples).
func manText(w *bytes.Buffer, text string) {
	for _, para := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if strings.HasPrefix(para, " ") || strings.Contains(para, "\n ") {
			fmt.Fprintf(w, ".PP\n.nf\n%s\n.fi\n", roff(para))
			continue
		}
		fmt.Fprintf(w, ".PP\n%s\n", roff(para))
	}
}

func manHeader(w *bytes.Buffer, name, summary string) {
	fmt.Fprintf(w, ".\\\" Generated from kinst's command table by go generate ./cmd/kinst; do not edit.\n")
	fmt.Fprintf(w, ".TH %s 1 \"\" \"kinst\" \"kinst manual\"\n.SH NAME\n%s \\- %s\n", strings.ToUpper(roff(name)), roff(name), roff(summary))
}

// manOverview is kinst(1): kinst --help, and the commands' pages.
func manOverview(cmds []documented) []byte {
	var w bytes.Buffer
	manHeader(&w, "kinst", "dynamic instrumentation of the running kernel (KernInst for x86-64 Linux)")
	w.WriteString(".SH SYNOPSIS\n.B kinst\n\\fICOMMAND\\fR [\\fIFLAGS\\fR] [\\fIARGS\\fR]\n.SH COMMANDS\n")
	for _, d := range cmds {
		fmt.Fprintf(&w, ".TP\n.B %s\n%s (\\fB%s\\fR(1))\n", roff(synopsis(d)), roff(d.c.summary), roff(dashed(d.path)))
	}
	var usage bytes.Buffer
	writeUsage(&usage)
	u := usage.String()
	if i := strings.Index(u, "\n\nPOINT is"); i >= 0 {
		u = u[i+2:]
	}
	w.WriteString(".SH DESCRIPTION\n")
	manText(&w, u)
	return w.Bytes()
}

// manPage is one command's page.
func manPage(d documented) []byte {
	var w bytes.Buffer
	manHeader(&w, dashed(d.path), d.c.summary)
	fmt.Fprintf(&w, ".SH SYNOPSIS\n.B kinst %s\n", roff(d.path))
	if d.c.args != "" {
		fmt.Fprintf(&w, "[\\fIFLAGS\\fR] %s\n", roff(d.c.args))
	} else {
		w.WriteString("[\\fIFLAGS\\fR]\n")
	}
	if d.c.help != "" {
		w.WriteString(".SH DESCRIPTION\n")
		manText(&w, d.c.help)
	}
	if d.fs.HasAvailableFlags() {
		w.WriteString(".SH OPTIONS\n")
		d.fs.VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			name, usage := pflag.UnquoteUsage(f)
			opt := `\fB\-\-` + roff(f.Name) + `\fR`
			if f.Shorthand != "" {
				opt = `\fB\-` + roff(f.Shorthand) + `\fR, ` + opt
			}
			if name != "" && f.Value.Type() != "bool" {
				opt += ` \fI` + roff(name) + `\fR`
			}
			if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" && def != "[]" {
				if f.Value.Type() == "string" {
					def = fmt.Sprintf("%q", def)
				}
				usage += " (default " + def + ")"
			}
			fmt.Fprintf(&w, ".TP\n%s\n%s\n", opt, roff(usage))
		})
	}
	w.WriteString(".SH SEE ALSO\n.BR kinst (1)\n")
	return w.Bytes()
}

// writeManDir writes the pages into dir and removes pages of commands
// that are gone.
func writeManDir(dir string, pages map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "kinst*.1"))
	for _, p := range old {
		if _, ok := pages[filepath.Base(p)]; !ok {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for name, b := range pages {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
