package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
	"github.com/kinst/kinst/splice"
	"github.com/spf13/pflag"
)

// command is one row of kinst's command table.
type command struct {
	name    string
	args    string // the positional arguments, for the synopsis
	summary string // one line, for kinst --help and completions
	help    string // what kinst NAME --help explains beyond the flags
	hidden  bool
	// daemon commands talk to kerninstd (--addr); report commands print
	// a report (-o/--output).
	daemon, report bool
	sub            []*command // a group's commands (bench, unwind, vm)
	// For completion: positional arguments are files, or these words.
	files bool
	words []string
	// setup defines the command's own flags and returns what runs once
	// they are parsed.
	setup func(fs *pflag.FlagSet) runFunc
}

type runFunc func(ctx context.Context, inv invocation) (int, error)

// globals are the flags the table adds to commands: --addr, -o.
type globals struct {
	addr, output string
	tokenFile    string // --token-file: kerninstd's TCP listener's token
	token        string // read from tokenFile after parsing
}

// invocation is a parsed command line.
type invocation struct {
	stdio
	g       *globals
	cmd     *command
	path    string
	fs      *pflag.FlagSet
	args    []string // positional, before --
	command []string // after --: the command to run, if any
}

// client is kerninstd's client at --addr.
func (inv invocation) client() *api.Client {
	return api.NewClient(inv.g.addr).WithToken(inv.g.token)
}

// report runs f with the report's environment (cli.NewEnv: to -o's file,
// else stdout) and puts -o's file in place if f succeeded; if it failed,
// a file already there is left as it was.
func (inv invocation) report(asJSON bool, f func(env cli.Env) (int, error)) (int, error) {
	env, finish, err := cli.NewEnv(cli.Streams{Stdin: inv.in, Stdout: inv.out, Stderr: inv.err, Output: inv.g.output, JSON: asJSON})
	if err != nil {
		return 1, err
	}
	status, err := f(env)
	if ferr := finish(err); err == nil && ferr != nil {
		return max(status, 1), ferr
	}
	return status, err
}

// reportErr is report for commands without an exit status of their own.
func (inv invocation) reportErr(asJSON bool, f func(env cli.Env) error) (int, error) {
	return inv.report(asJSON, func(env cli.Env) (int, error) { return 0, f(env) })
}

// flagSet builds the command's flags, with the ones the table adds.
func (c *command) flagSet(path string, g *globals, stderr io.Writer) (*pflag.FlagSet, runFunc) {
	fs := pflag.NewFlagSet("kinst "+path, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(stderr)
	fs.Usage = func() {} // run prints the help, or a hint after an error
	var run runFunc
	if c.setup != nil {
		run = c.setup(fs)
	}
	if c.report {
		fs.StringVarP(&g.output, "output", "o", "", "write the report to `FILE` instead of stdout (-- CMD's output stays on the terminal)")
	}
	if c.daemon {
		fs.StringVar(&g.addr, "addr", envOr("KINST_ADDR", api.DefaultSocket), "kerninstd's `address`: a unix socket path or host:port (env KINST_ADDR)")
		fs.StringVar(&g.tokenFile, "token-file", os.Getenv("KINST_TOKEN_FILE"), "send this `file`'s token to kerninstd's TCP listener (one started with --token-file; env KINST_TOKEN_FILE)")
	}
	return fs, run
}

// The flags several commands take, spelled and explained the same way
// everywhere.

func jsonFlag(fs *pflag.FlagSet, p *bool, what string) {
	fs.BoolVar(p, "json", false, "print "+what+" as JSON (shapes in docs/json.md; types in packages api and output)")
}

// jsonCmdFlag is --json for commands that run -- CMD.
func jsonCmdFlag(fs *pflag.FlagSet, p *bool, what string) {
	fs.BoolVar(p, "json", false, "print "+what+" as JSON at the end; on stdout, -- CMD's stdout goes to stderr so that it cannot corrupt the JSON")
}

func durationFlag(fs *pflag.FlagSet, p *time.Duration, what string) {
	fs.DurationVarP(p, "duration", "d", 0, what)
}

func intervalFlag(fs *pflag.FlagSet, p *time.Duration, what string) {
	fs.DurationVarP(p, "interval", "i", time.Second, what)
}

func pidFlag(fs *pflag.FlagSet, p *int, what string) { fs.IntVarP(p, "pid", "p", 0, what) }

// checkKernelPID refuses -p 0 on a command's kernel form (not user),
// where -p PID filters by process: -p 0 -- CMD is its --user form's (a
// process's functions), which the user most likely meant; the kernel's
// would be the idle task's calls.
func checkKernelPID(fs *pflag.FlagSet, cmd string, pid int, user bool) error {
	if !user && fs.Changed("pid") && pid == 0 {
		return usagef("-p 0 starts CMD for --user (a process's functions: kinst %s --user -p 0 FUNC -- CMD); for the kernel, -p PID keeps only that process's calls", cmd)
	}
	return nil
}

// checkProcessFlags checks the flags of a command's -p form: a running
// process (-p PID), or -p 0 with -- CMD to start, and none of the
// kernel's debug-file flags.
func checkProcessFlags(fs *pflag.FlagSet, pid int, command []string) error {
	switch {
	case pid < 0:
		return usagef("-p %d: want a process ID, or 0 with -- CMD", pid)
	case pid == 0 && len(command) == 0:
		return usagef("-p 0 starts a command: give it after --")
	case pid > 0 && len(command) > 0:
		return usagef("-p %d names a running process: no -- CMD (-p 0 -- CMD starts one)", pid)
	case fs.Changed("vmlinux") || fs.Changed("module-debug"):
		return usagef("--vmlinux and --module-debug are for the kernel; a process's lines come from its own DWARF or debug files")
	}
	return nil
}
func tidFlag(fs *pflag.FlagSet, p *int, what string) { fs.IntVarP(p, "tid", "t", 0, what) }

// sessionFlags are --name and --ttl of the commands that install
// instrumentation in a session.
func sessionFlags(fs *pflag.FlagSet, name *string, ttl *time.Duration) {
	fs.StringVar(name, "name", "", "session `name` (see kinst ls, kinst detach; default: its ID)")
	fs.DurationVar(ttl, "ttl", 0, "remove the instrumentation after this long even if kinst is gone")
}

// svgFlag is --svg FILE; --plot, its old spelling, still works.
func svgFlag(fs *pflag.FlagSet, p *string, what string) {
	fs.StringVar(p, "svg", "", "write "+what+" to this SVG `FILE`")
	fs.StringVar(p, "plot", "", "old spelling of --svg")
	fs.MarkDeprecated("plot", "use --svg")
}

// valuesOf annotates a flag with the values it takes, for completion.
func valuesOf(fs *pflag.FlagSet, name string, values ...string) {
	fs.SetAnnotation(name, cli.CompleteValues, values)
}

// commands is kinst's command table, in the order kinst --help lists it.
var commands []*command

func init() {
	commands = []*command{
		countCommand, coverCommand, timeCommand, waitersCommand, drilldownCommand, watchCommand, lsCommand, detachCommand, webCommand,
		rdCommand, cfgCommand, linesCommand, annotateCommand, benchCommand, offcpuCommand, unwindCommand, coreCommand, vmCommand, driverCommand,
		versionCommand, completionCommand, workloadCommand, helpCommand, gendocsCommand,
	}
}

const pointHelp = `POINT is FUNC (the function's entry: the first instruction after its
ftrace site that a splice can take), FUNC+0xOFF (an instruction boundary),
FUNC:BLOCK (a basic block as kinst cfg numbers them), or a classic name
from the KernInst paper: `

func classicList() string {
	var s []string
	for _, n := range splice.ClassicNames() {
		s = append(s, fmt.Sprintf("%s→%s", n, splice.Classic[n].Linux))
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// writeUsage is kinst --help: every command with its synopsis.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, "kinst — dynamic instrumentation of the running kernel (KernInst for x86-64 Linux)\n\nUsage:\n")
	var list func(prefix string, cs []*command)
	list = func(prefix string, cs []*command) {
		for _, c := range cs {
			if c.hidden {
				continue
			}
			if c.sub != nil && c.setup == nil {
				list(prefix+c.name+" ", c.sub)
				continue
			}
			fmt.Fprintf(w, "  %s\n      %s\n", strings.TrimSpace("kinst "+prefix+c.name+" "+c.args), c.summary)
			if c.sub != nil { // a command with commands of its own (cover report)
				list(prefix+c.name+" ", c.sub)
			}
		}
	}
	list("", commands)
	fmt.Fprintf(w, "\n%s%s.\n", pointHelp, classicList())
	fmt.Fprint(w, `
Reports go to stdout, or to a file with -o FILE (put in place only when
the command succeeds: a failure leaves an existing FILE as it was);
progress and diagnostics go to stderr. A report that runs -- CMD reports for CMD's lifetime and
exits with its status; with --json on stdout, CMD's stdout goes to stderr.

  kinst COMMAND --help   a command's flags and what it does
  kinst --version        this build, the driver ABI, and kerninstd's
  kinst completion bash|zsh|fish
                         shell completions (source <(kinst completion bash))
  --addr ADDR            kerninstd's unix socket or host:port, for the
                         commands that talk to it (env KINST_ADDR;
                         default /run/kerninstd.sock)
  --token-file FILE      the token kerninstd's TCP listener requires
                         (env KINST_TOKEN_FILE; kinst vm up prints it)
`)
}

// writeGroupUsage lists a group's commands (kinst bench, kinst vm).
func writeGroupUsage(w io.Writer, path string, c *command) {
	fmt.Fprintf(w, "Usage:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range c.sub {
		if !s.hidden {
			fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimSpace("kinst "+path+" "+s.name+" "+s.args), s.summary)
		}
	}
	tw.Flush()
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	fmt.Fprintf(w, "\nkinst %s COMMAND --help shows a command's flags.\n", path)
}

// writeHelp is kinst NAME --help.
func writeHelp(w io.Writer, path string, c *command, fs *pflag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", strings.TrimSpace("kinst "+path+" "+c.args), c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	if fs.HasAvailableFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", fs.FlagUsages())
	}
}
