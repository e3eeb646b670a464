package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
	"github.com/kinst/kinst/output"
	"github.com/spf13/pflag"
)

// kinst runs a command line and returns its exit status, stdout and
// stderr.
func kinst(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	status := run(args, stdio{strings.NewReader(""), &out, &errb})
	return status, out.String(), errb.String()
}

// each visits every command of the table with its path and flags.
func each(f func(path string, c *command, fs *pflag.FlagSet)) {
	eachCommand(true, func(path string, c *command) {
		fs, _ := c.flagSet(path, &globals{}, io.Discard)
		f(path, c, fs)
	})
}

// Flags that mean the same thing are spelled the same on every command:
// one shorthand, one type, and the common ones where they belong.
func TestFlagSpelling(t *testing.T) {
	type spelling struct{ short, typ string }
	seen := map[string]map[spelling][]string{}
	// Names that mean different things on different commands.
	differ := map[string]string{
		"calls":   "bench hit --calls N (system calls per run) vs cfg --calls (the call graph)",
		"callees": "drilldown --callees N (callees timed per level) vs cover --callees FUNC (the call graph below FUNC, the issue's spelling)",
	}
	each(func(path string, c *command, fs *pflag.FlagSet) {
		fs.VisitAll(func(f *pflag.Flag) {
			if seen[f.Name] == nil {
				seen[f.Name] = map[spelling][]string{}
			}
			s := spelling{f.Shorthand, f.Value.Type()}
			seen[f.Name][s] = append(seen[f.Name][s], path)
		})
		has := func(name string) bool { return fs.Lookup(name) != nil }
		if c.report != has("output") {
			t.Errorf("kinst %s: report %v but -o/--output %v", path, c.report, has("output"))
		}
		if c.daemon != has("addr") {
			t.Errorf("kinst %s: talks to kerninstd %v but --addr %v", path, c.daemon, has("addr"))
		}
		if c.report && !has("json") && path != "offcpu" && path != "cover lcov" { // lcov is a format of its own
			t.Errorf("kinst %s prints a report without --json", path)
		}
	})
	want := map[string]spelling{
		"json": {"", "bool"}, "duration": {"d", "duration"}, "interval": {"i", "duration"}, "pid": {"p", "int"},
		"tid": {"t", "int"}, "comm": {"", "string"}, "name": {"", "string"}, "ttl": {"", "duration"},
		"output": {"o", "string"}, "svg": {"", "string"}, "addr": {"", "string"},
	}
	for name, spellings := range seen {
		if len(spellings) > 1 && differ[name] == "" {
			t.Errorf("--%s is spelled %d ways: %v", name, len(spellings), spellings)
		}
		if w, ok := want[name]; ok {
			for s, paths := range spellings {
				if s != w {
					t.Errorf("--%s on %v is -%s %s, want -%s %s", name, paths, s.short, s.typ, w.short, w.typ)
				}
			}
		}
	}
	// The commands that install instrumentation in a session name it
	// and bound its life the same way.
	for _, path := range []string{"count", "time", "waiters", "cover"} {
		c, _, _ := find(strings.Fields(path))
		fs, _ := c.flagSet(path, &globals{}, io.Discard)
		for _, name := range []string{"name", "ttl", "duration", "interval", "json", "svg", "output"} {
			if fs.Lookup(name) == nil && !(path == "cover" && name == "interval") {
				t.Errorf("kinst %s has no --%s", path, name)
			}
		}
	}
}

// --plot, the old spelling of --svg, still works, hidden, with a warning.
func TestDeprecatedPlot(t *testing.T) {
	c, _, _ := find([]string{"count"})
	fs, _ := c.flagSet("count", &globals{}, io.Discard)
	if err := fs.Parse([]string{"--plot", "x.svg", "lookuppn"}); err != nil {
		t.Fatal(err)
	}
	if v, _ := fs.GetString("svg"); v != "x.svg" {
		t.Errorf("--plot set --svg to %q", v)
	}
	if f := fs.Lookup("plot"); !f.Hidden || f.Deprecated == "" || strings.Contains(fs.FlagUsages(), "--plot") {
		t.Errorf("--plot is shown in the help: %+v", f)
	}
}

func TestHelp(t *testing.T) {
	status, out, _ := kinst(t, "--help")
	if status != 0 {
		t.Errorf("--help: status %d", status)
	}
	each(func(path string, c *command, fs *pflag.FlagSet) {
		hidden := c.hidden || path == "vm agent"
		if strings.Contains(out, "kinst "+path+" ") || strings.Contains(out, "kinst "+path+"\n") {
			if hidden {
				t.Errorf("--help lists the hidden kinst %s", path)
			}
		} else if !hidden {
			t.Errorf("--help does not list kinst %s", path)
		}
		status, help, _ := kinst(t, append(strings.Fields(path), "--help")...)
		if status != 0 || !strings.HasPrefix(help, "Usage: kinst "+path) {
			t.Errorf("kinst %s --help: status %d\n%s", path, status, help)
		}
		fs.VisitAll(func(f *pflag.Flag) {
			if !f.Hidden && !strings.Contains(help, "--"+f.Name) {
				t.Errorf("kinst %s --help does not explain --%s", path, f.Name)
			}
		})
		_, viaHelp, _ := kinst(t, append([]string{"help"}, strings.Fields(path)...)...)
		if viaHelp != help {
			t.Errorf("kinst help %s differs from kinst %s --help", path, path)
		}
	})
	if status, out, _ := kinst(t, "bench"); status != 2 || out != "" {
		t.Errorf("kinst bench: status %d, stdout %q; want 2 and the usage on stderr", status, out)
	}
	if status, out, _ := kinst(t, "bench", "--help"); status != 0 || !strings.Contains(out, "kinst bench churn") {
		t.Errorf("kinst bench --help: status %d\n%s", status, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"bench", "nosuch"}, `unknown command "nosuch"`},
		{[]string{"count", "--bogus"}, "unknown flag: --bogus (see kinst count --help)"},
		{[]string{"count"}, "name at least one POINT"},
		{[]string{"cover"}, "--module MOD or --callees FUNC"},
		{[]string{"cover", "--depth", "2", "vfs_read"}, "--depth goes with --callees"},
		{[]string{"cover", "--callees", "vfs_read", "--depth", "0"}, "--depth 0: want 1 or more"},
		{[]string{"time", "--pid", "x", "f"}, "invalid argument"},
		{[]string{"time", "-p", "0", "libc:write", "--", "ls"}, "-p 0 starts CMD for --user"},
		{[]string{"cover", "-p", "0", "libc:*", "--", "ls"}, "kinst cover --user -p 0"},
		{[]string{"drilldown", "f"}, "drilldown FUNC -- CMD"},
		{[]string{"watch", "--json"}, "--json needs --iterations"},
		{[]string{"cfg", "--stats", "f"}, "--stats takes no FUNC"},
		{[]string{"cfg", "--json", "--dot", "f"}, "exclusive"},
		{[]string{"core", "dump", "nosuch"}, `unknown command "nosuch"`},
		{[]string{"unwind", "stack", "x"}, "not a process id"},
		{[]string{"completion", "tcsh"}, `no shell "tcsh"`},
		{[]string{"count", "-d", "-1s", "f"}, "--duration -1s: want a duration of zero or more"},
		{[]string{"cover", "--user", "-p", "0", "--ttl", "-5m", "libc:*", "--", "true"}, "--ttl -5m0s: want a duration of zero or more"},
		{[]string{"count", "--interval", "-1s", "f"}, "--interval -1s: want a duration"},
		{[]string{"lines", "-p", "0", "f"}, "-p 0 starts a command: give it after --"},
		{[]string{"lines", "-p", "-1", "f"}, "-p -1: want a process ID"},
		{[]string{"lines", "f", "--", "true"}, "-- CMD is for -p 0"},
		{[]string{"annotate", "-p", "1", "f", "--", "true"}, "-p 1 names a running process"},
		{[]string{"annotate", "-p", "0", "--vmlinux", "/v", "f", "--", "true"}, "--vmlinux and --module-debug are for the kernel"},
		{[]string{"annotate", "-p", "0", "--from", "r.json", "-d", "1s", "f", "--", "true"}, "no --duration"},
		{[]string{"annotate", "--session", "s", "--from", "r.json", "f"}, "--session reads a running kernel session"},
		{[]string{"annotate", "--session", "s", "-p", "1", "f"}, "--session reads a running kernel session"},
	} {
		status, _, errOut := kinst(t, tc.args...)
		if status != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("kinst %s: status %d, stderr %q; want 2 and %q", strings.Join(tc.args, " "), status, errOut, tc.want)
		}
	}
}

// TestUnwindTablePCHex: --pc is hex, as its help says, with or without
// 0x (readelf and objdump print addresses without it); it was read as
// decimal without.
func TestUnwindTablePCHex(t *testing.T) {
	const lib = "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(lib); err != nil {
		t.Skip(err)
	}
	row := func(pc string) (string, string) { // the row, without the timed header
		_, out, errOut := kinst(t, "unwind", "table", lib, "--pc", pc)
		_, r, _ := strings.Cut(out, "\n")
		return r, errOut
	}
	want, errOut := row("0x29000")
	if !strings.Contains(want, "0x2") {
		t.Fatalf("--pc 0x29000: no row (%s)", errOut)
	}
	for _, pc := range []string{"29000", "0X29000"} {
		if got, errOut := row(pc); got != want {
			t.Errorf("--pc %s: %q (%s), want --pc 0x29000's %q", pc, got, errOut, want)
		}
	}
	if status, _, errOut := kinst(t, "unwind", "table", lib, "--pc", "zz"); status != 2 || !strings.Contains(errOut, "want a hex address") {
		t.Errorf("--pc zz: status %d, %q", status, errOut)
	}
}

func TestVersion(t *testing.T) {
	s := kerninstdtest.New(t)
	status, out, errOut := kinst(t, "--version", "--addr", s.Addr)
	if status != 0 {
		t.Fatalf("status %d: %s", status, errOut)
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "kinst ") || !strings.Contains(out, fmt.Sprintf("driver ABI %d\n", driver.ABIVersion)) ||
		!strings.Contains(out, "kerninstd at "+s.Addr+": ") || !strings.Contains(out, "kernel "+kerninstdtest.Release) {
		t.Errorf("kinst --version:\n%s", out)
	}
	status, out, _ = kinst(t, "version", "--json", "--addr", s.Addr)
	var v output.Version
	if err := json.Unmarshal([]byte(out), &v); status != 0 || err != nil {
		t.Fatalf("version --json: %d, %v\n%s", status, err, out)
	}
	if v.GoVersion == "" || v.Module == "" || v.DriverABI != driver.ABIVersion || v.Daemon == nil ||
		v.Daemon.KernelRelease != kerninstdtest.Release || v.Daemon.DriverABI != 5 || v.DaemonAddr != s.Addr {
		t.Errorf("version --json = %+v", v)
	}
	// A kerninstd that does not answer is reported, not an error.
	s.HTTP.Close()
	status, out, _ = kinst(t, "version", "--addr", s.Addr)
	if status != 0 || !strings.Contains(out, "kerninstd: not answering") {
		t.Errorf("without kerninstd: status %d\n%s", status, out)
	}
}

// The report goes to stdout or -o's file; -- CMD's stdout stays on the
// terminal, except that it goes to stderr when JSON is on stdout.
func TestOutputRouting(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	s := kerninstdtest.New(t)
	cmd := []string{"--", "sh", "-c", "echo from-cmd; echo cmd-err >&2; exit 3"}
	count := func(args ...string) (int, string, string) {
		return kinst(t, append(append([]string{"count", "lookuppn", "--addr", s.Addr}, args...), cmd...)...)
	}
	decode := func(what, s string) output.CountReport {
		var r output.CountReport
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			t.Fatalf("%s is not the JSON report alone: %v\n%s", what, err, s)
		}
		return r
	}

	status, out, errOut := count("--json")
	if r := decode("stdout", out); status != 3 || r.ExitStatus == nil || *r.ExitStatus != 3 || len(r.Probes) != 1 {
		t.Errorf("--json: status %d, report %+v", status, r)
	}
	if !strings.Contains(errOut, "from-cmd") || !strings.Contains(errOut, "cmd-err") {
		t.Errorf("--json: CMD's output not on stderr: %q", errOut)
	}

	file := filepath.Join(t.TempDir(), "report.json")
	status, out, _ = count("--json", "-o", file)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	decode(file, string(b))
	if status != 3 || out != "from-cmd\n" {
		t.Errorf("--json -o FILE: status %d, stdout %q; want CMD's output alone", status, out)
	}

	file = filepath.Join(t.TempDir(), "report.txt")
	_, out, _ = count("--output", file)
	b, _ = os.ReadFile(file)
	if out != "from-cmd\n" || !strings.Contains(string(b), "counts over") || strings.Contains(string(b), "from-cmd") {
		t.Errorf("-o FILE: stdout %q, file %q", out, b)
	}

	// Text on stdout: CMD's output and the report share it, as before.
	_, out, _ = count()
	if !strings.Contains(out, "from-cmd") || !strings.Contains(out, "counts over") {
		t.Errorf("text report: stdout %q", out)
	}

	// A bad -o fails before anything is spliced.
	status, _, errOut = count("-o", filepath.Join(t.TempDir(), "no", "such", "dir"))
	if list, _ := s.Client.Sessions(context.Background()); status != 1 || len(list) != 0 || !strings.Contains(errOut, "no such file") {
		t.Errorf("bad -o: status %d, sessions %v, stderr %q", status, list, errOut)
	}
}

// kinst count names its session and bounds its life like kinst time.
func TestCountSession(t *testing.T) {
	s := kerninstdtest.New(t)
	found := make(chan api.Session, 1)
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if list, _ := s.Client.Sessions(context.Background()); len(list) == 1 {
				found <- list[0]
				return
			}
		}
		close(found)
	}()
	status, _, errOut := kinst(t, "count", "lookuppn", "--name", "fs", "--ttl", "1h", "--addr", s.Addr, "--", "sh", "-c", "sleep 1")
	if status != 0 {
		t.Fatalf("status %d: %s", status, errOut)
	}
	sess, ok := <-found
	if !ok || sess.Name != "fs" || sess.Expires == nil || sess.Expires.Sub(sess.Created) != time.Hour || !sess.Tied {
		t.Errorf("session %+v; want fs, tied, expiring after 1h", sess)
	}
}

// The completion scripts offer every command and every flag of the table,
// from the shells themselves where they are installed.
func TestCompletion(t *testing.T) {
	type want struct {
		path  string
		flags []string
		subs  []string
	}
	var wants []want
	top := want{path: ""}
	for _, c := range commands {
		if !c.hidden {
			top.subs = append(top.subs, c.name)
		}
	}
	wants = append(wants, top)
	each(func(path string, c *command, fs *pflag.FlagSet) {
		if c.hidden || strings.HasPrefix(path, "vm agent") {
			return
		}
		w := want{path: path}
		fs.VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				w.flags = append(w.flags, "--"+f.Name)
			}
		})
		wants = append(wants, w)
	})
	for _, c := range commands {
		if c.sub != nil {
			w := want{path: c.name}
			for _, s := range c.sub {
				if !s.hidden {
					w.subs = append(w.subs, s.name)
				}
			}
			wants = append(wants, w)
		}
	}
	for _, shell := range cli.Shells {
		t.Run(shell, func(t *testing.T) {
			status, script, errOut := kinst(t, "completion", shell)
			if status != 0 {
				t.Fatalf("status %d: %s", status, errOut)
			}
			if _, err := exec.LookPath(shell); err != nil {
				t.Skipf("no %s to run the script with", shell)
			}
			file := filepath.Join(t.TempDir(), "kinst."+shell)
			if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, w := range wants {
				line := strings.TrimSpace("kinst " + w.path)
				if len(w.flags) > 0 {
					got := complete(t, shell, file, line+" --")
					if !sameSet(got, w.flags) {
						t.Errorf("%s: %q --<tab> offers %v, want %v", shell, line, got, w.flags)
					}
				}
				if len(w.subs) > 0 {
					got := complete(t, shell, file, line+" ")
					if !sameSet(got, w.subs) {
						t.Errorf("%s: %q <tab> offers %v, want %v", shell, line, got, w.subs)
					}
				}
			}
			if got := complete(t, shell, file, "kinst vm up --accel "); !sameSet(got, []string{"auto", "tcg", "tcg-single", "kvm"}) {
				t.Errorf("%s: --accel offers %v", shell, got)
			}
			if got := complete(t, shell, file, "kinst count --d"); !sameSet(got, []string{"--duration"}) {
				t.Errorf("%s: --d offers %v", shell, got)
			}
		})
	}
}

// complete asks shell for the completions of line (the last word is
// being completed), with the script at file loaded.
func complete(t *testing.T, shell, file, line string) []string {
	t.Helper()
	var script string
	words := strings.Split(line, " ")
	switch shell {
	case "bash":
		var q []string
		for _, w := range words {
			q = append(q, shQuote(w))
		}
		script = fmt.Sprintf(`source %s; COMP_WORDS=(%s); COMP_CWORD=%d; _kinst; printf '%%s\n' "${COMPREPLY[@]}"`,
			shQuote(file), strings.Join(q, " "), len(words)-1)
	case "zsh":
		var q []string
		for _, w := range words {
			q = append(q, shQuote(w))
		}
		// Outside a completion widget: stand-ins for the completion
		// system's functions print what they are given.
		script = fmt.Sprintf(`compdef() { }
_describe() { local e; for e in ${(P)2}; do print -r -- ${e%%%%:*}; done }
compadd() { [[ $1 == -- ]] && shift; print -rl -- "$@" }
_files() { }
_command_names() { }
source %s
words=(%s); CURRENT=%d; _kinst`, shQuote(file), strings.Join(q, " "), len(words))
	case "fish":
		script = fmt.Sprintf(`source %s; complete -C %s`, shQuote(file), shQuote(line))
	}
	out, err := exec.Command(shell, "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", shell, err, out)
	}
	cur := words[len(words)-1]
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		l, _, _ = strings.Cut(l, "\t") // fish: value<TAB>description
		if l != "" && strings.HasPrefix(l, cur) {
			got = append(got, l)
		}
	}
	return got
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sameSet compares the long flags or words offered with want, ignoring
// order, duplicates and short flags.
func sameSet(got, want []string) bool {
	set := func(v []string) string {
		m := map[string]bool{}
		for _, s := range v {
			if !strings.HasPrefix(s, "-") || strings.HasPrefix(s, "--") {
				m[s] = true
			}
		}
		var out []string
		for s := range m {
			out = append(out, s)
		}
		sort.Strings(out)
		return strings.Join(out, " ")
	}
	return set(got) == set(want)
}

// kinst cover's targets through the command line: a function alone (the
// --depth default goes nowhere without --callees), and callees to a
// depth, each with the report's functions.
func TestCoverTargetsCommandLine(t *testing.T) {
	s := kerninstdtest.New(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lookuppn"}, "filename_lookup"},
		{[]string{"--callees", "do_sys_openat2", "--depth", "2"}, "do_sys_openat2 do_filp_open putname path_openat"},
		{[]string{"putname", "--callees", "do_filp_open"}, "putname do_filp_open path_openat"},
	} {
		args := append(append([]string{"cover"}, tc.args...), "--json", "--addr", s.Addr, "--", "sh", "-c", "true")
		status, out, errOut := kinst(t, args...)
		var rep api.CoverReport
		if err := json.Unmarshal([]byte(out), &rep); status != 0 || err != nil {
			t.Errorf("kinst %s: status %d, %v\n%s", strings.Join(args, " "), status, err, errOut)
			continue
		}
		var got []string
		for _, f := range rep.Functions {
			got = append(got, f.Function)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("kinst %s: functions %v, want %s", strings.Join(args, " "), got, tc.want)
		}
	}
}
