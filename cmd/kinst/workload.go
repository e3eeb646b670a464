package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/kinst/kinst/app/workload"
	"github.com/spf13/pflag"
)

// workloadCmd is a hidden helper for tests and the demo: kernel activity of
// a known shape.
func workloadCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("workload: want stat N PATH | files DIR ROUNDS | syscalls DURATION | creat DIR N | spin DURATION")
	}
	fs := pflag.NewFlagSet("workload", pflag.ContinueOnError)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	a := fs.Args()
	switch {
	case args[0] == "stat" && len(a) == 2:
		n, err := strconv.Atoi(a[0])
		if err != nil {
			return err
		}
		return workload.Stat(a[1], n)
	case args[0] == "files" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return err
		}
		return workload.Files(a[0], n)
	case args[0] == "syscalls" && len(a) == 1:
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		// Ctrl-C ends the load early but still reports it.
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
		defer stop()
		n := workload.Syscalls(ctx, "/")
		fmt.Fprintf(os.Stderr, "workload: %d stat calls\n", n)
		return nil
	case args[0] == "creat" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return err
		}
		return workload.Creat(a[0], n)
	case args[0] == "spin" && len(a) == 1:
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "workload: %d getppid calls\n", workload.Spin(d))
		return nil
	}
	return fmt.Errorf("workload: want stat N PATH | files DIR ROUNDS | syscalls DURATION | creat DIR N | spin DURATION")
}
