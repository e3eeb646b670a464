package main

import (
	"context"
	"io"
	"slices"
	"strings"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var completionCommand = &command{
	name:    "completion",
	args:    "bash|zsh|fish",
	summary: "shell completions for kinst's commands and flags",
	help: `Prints a completion script, generated from kinst's command table and each
command's flags. Load it:

  bash:  source <(kinst completion bash)     (or save it in
         /etc/bash_completion.d/kinst)
  zsh:   source <(kinst completion zsh)      (or save it as _kinst in a
         directory of $fpath)
  fish:  kinst completion fish | source      (or save it in
         ~/.config/fish/completions/kinst.fish)`,
	words: cli.Shells,
	setup: func(fs *pflag.FlagSet) runFunc {
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("name one shell: %s", strings.Join(cli.Shells, ", "))
			}
			if !slices.Contains(cli.Shells, inv.args[0]) {
				return 2, usagef("no shell %q (want %s)", inv.args[0], strings.Join(cli.Shells, ", "))
			}
			return 0, writeCompletion(inv.out, inv.args[0])
		}
	},
}

func writeCompletion(w io.Writer, shell string) error {
	return cli.WriteCompletion(w, shell, "kinst", completionTree())
}

// completionTree describes the command table to the completion scripts,
// with each command's flags as it parses them.
func completionTree() cli.CompletionCommand {
	var tree func(path string, cs []*command) []cli.CompletionCommand
	tree = func(path string, cs []*command) []cli.CompletionCommand {
		var out []cli.CompletionCommand
		for _, c := range cs {
			if c.hidden {
				continue
			}
			p := strings.TrimSpace(path + " " + c.name)
			cc := cli.CompletionCommand{Name: c.name, Summary: c.summary, Files: c.files, Words: c.words, Sub: tree(p, c.sub)}
			if c.setup != nil {
				fs, _ := c.flagSet(p, &globals{}, io.Discard)
				cc.Flags = fs
			}
			out = append(out, cc)
		}
		return out
	}
	root := pflag.NewFlagSet("kinst", pflag.ContinueOnError)
	root.BoolP("help", "h", false, "show the commands")
	root.Bool("version", false, "this build, the driver ABI, and kerninstd's")
	return cli.CompletionCommand{Name: "kinst", Flags: root, Sub: tree("", commands)}
}

var helpCommand = &command{
	name:    "help",
	args:    "[COMMAND…]",
	summary: "kinst's commands, or one command's flags and what it does",
	setup: func(fs *pflag.FlagSet) runFunc {
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) == 0 {
				writeUsage(inv.out)
				return 0, nil
			}
			c, path, rest := find(inv.args)
			if c == nil || len(rest) > 0 {
				return 2, usagef("no command %q", strings.Join(inv.args, " "))
			}
			if c.setup == nil {
				writeGroupUsage(inv.out, path, c)
				return 0, nil
			}
			fs, _ := c.flagSet(path, &globals{}, io.Discard)
			writeHelp(inv.out, path, c, fs)
			return 0, nil
		}
	},
}
