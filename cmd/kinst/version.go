package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var versionCommand = &command{
	name:    "version",
	summary: "this build, the driver ABI it speaks, and kerninstd's build, driver ABI and kernel",
	help: `The build comes from what the Go toolchain recorded in the binary (module
version, VCS revision and time). kerninstd is asked for its own build, the
ABI of the driver it has open, and the kernel release; a kerninstd that
does not answer within two seconds is reported, not an error.
kinst --version is kinst version.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var asJSON bool
		jsonFlag(fs, &asJSON, "the versions")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 0 {
				return 2, usagef("version takes no arguments")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Version(ctx, inv.client(), asJSON, env) })
		}
	},
}
