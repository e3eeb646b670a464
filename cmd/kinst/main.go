// Command kinst instruments the running kernel through kerninstd, reads
// crash dumps, profiles where threads wait, and manages the test VM that
// embeds a stock Debian kernel.
//
// This package only parses the command line and wires packages together:
// every command is a row of the table in commands.go (its flags, help
// and what it runs), from which help, dispatch and shell completions are
// made; the commands' work is in app/cli.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
)

func main() {
	// KINST_CPUPROFILE: where a slow command's time goes (`go tool
	// pprof`). KINST_TRACE: an execution trace (`go tool trace`,
	// `-pprof=syscall` or `-pprof=sync` there), for the wall time a
	// command spends waiting, which a CPU profile does not show (ptrace
	// stops, /proc reads).
	stop := profile("KINST_CPUPROFILE", pprof.StartCPUProfile, pprof.StopCPUProfile)
	stopTrace := profile("KINST_TRACE", trace.Start, trace.Stop)
	cli.TuneGC()
	status := run(os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr})
	stopTrace()
	stop()
	os.Exit(status)
}

// profile writes a profile of the command, begun by start and ended by
// end, to the file the environment variable env names, when it is set.
func profile(env string, start func(io.Writer) error, end func()) (stop func()) {
	path := os.Getenv(env)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = start(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kinst: %s: %v\n", env, err)
		return func() {}
	}
	return func() {
		end()
		f.Close()
	}
}

// stdio are the streams kinst runs with.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// run runs the command line args and returns the exit status: the
// command's, 1 when it fails, 2 for a usage error.
func run(args []string, s stdio) int {
	if len(args) == 0 {
		writeUsage(s.err)
		return 2
	}
	switch args[0] {
	case "-h", "--help":
		writeUsage(s.out)
		return 0
	case "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	cmd, path, rest := find(args)
	if cmd == nil {
		fmt.Fprintf(s.err, "kinst: unknown command %q (see kinst --help)\n", strings.Join(args[:min(len(args), 2)], " "))
		return 2
	}
	if cmd.setup == nil { // a group: bench, unwind, vm
		if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help") {
			writeGroupUsage(s.out, path, cmd)
			return 0
		}
		writeGroupUsage(s.err, path, cmd)
		if len(rest) == 0 {
			return 2
		}
		fmt.Fprintf(s.err, "kinst %s: unknown command %q\n", path, rest[0])
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	g := &globals{}
	fs, runCmd := cmd.flagSet(path, g, s.err)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			writeHelp(s.out, path, cmd, fs)
			return 0
		}
		fmt.Fprintf(s.err, "kinst %s: %v (see kinst %s --help)\n", path, err, path)
		return 2
	}
	if err := negativeDuration(fs); err != nil {
		fmt.Fprintf(s.err, "kinst %s: %v (see kinst %s --help)\n", path, err, path)
		return 2
	}
	if g.tokenFile != "" {
		tok, err := api.ReadToken(g.tokenFile)
		if err != nil {
			fmt.Fprintf(s.err, "kinst %s: %v\n", path, err)
			return 2
		}
		g.token = tok
	}
	inv := invocation{stdio: s, g: g, cmd: cmd, path: path, fs: fs}
	inv.args, inv.command = splitCommand(fs)
	status, err := runCmd(ctx, inv)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(s.err, "kinst %s: %v (see kinst %s --help)\n", path, ue.error, path)
			return 2
		}
		fmt.Fprintf(s.err, "kinst: %v\n", err)
		if status == 0 {
			status = 1
		}
	}
	return status
}

// find descends the command table along args: the command, its path
// ("bench splice") and the arguments left for it.
func find(args []string) (*command, string, []string) {
	list := commands
	var found *command
	var path []string
	for len(args) > 0 {
		var next *command
		for _, c := range list {
			if c.name == args[0] {
				next = c
			}
		}
		if next == nil {
			break
		}
		found, path, args = next, append(path, next.name), args[1:]
		if next.sub == nil {
			break
		}
		list = next.sub
	}
	return found, strings.Join(path, " "), args
}

// splitCommand splits the positional arguments at "--": what comes
// before, and the command after (nil without "--").
func splitCommand(fs *pflag.FlagSet) (args, command []string) {
	pos := fs.Args()
	if n := fs.ArgsLenAtDash(); n >= 0 {
		return pos[:n], pos[n:]
	}
	return pos, nil
}

// usageError is a command line the command cannot run: exit status 2.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// negativeDuration refuses a negative value for any duration flag given
// (-d -1s would otherwise mean "until interrupted" for some commands and
// "at once" for others).
func negativeDuration(fs *pflag.FlagSet) (err error) {
	fs.Visit(func(f *pflag.Flag) {
		if f.Value.Type() != "duration" || err != nil {
			return
		}
		if d, e := fs.GetDuration(f.Name); e == nil && d < 0 {
			err = fmt.Errorf("--%s %s: want a duration of zero or more", f.Name, f.Value)
		}
	})
	return err
}
