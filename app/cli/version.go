package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/internal/buildinfo"
	"github.com/kinst/kinst/output"
)

// Version prints this build, the driver ABI it speaks, and, when
// kerninstd answers (within two seconds), kerninstd's build, the loaded
// driver's ABI and the kernel release. A kerninstd that does not answer
// is reported, not an error.
func Version(ctx context.Context, c *api.Client, asJSON bool, env Env) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	return writeVersion(env.Out, versionReport(buildinfo.Read(), driver.ABIVersion, c.Addr(), info, err), asJSON)
}

func versionReport(b buildinfo.Build, abi uint32, addr string, info api.Info, err error) output.Version {
	v := output.Version{Module: b.Module, Revision: b.Revision, Time: b.Time, Modified: b.Modified, GoVersion: b.GoVersion,
		DriverABI: abi, DaemonAddr: addr}
	if err != nil {
		v.DaemonError = err.Error()
	} else {
		v.Daemon = &output.DaemonVersion{Version: info.Version, DriverABI: info.ABIVersion, KernelRelease: info.KernelRelease,
			CounterFaults: info.DirtyFreeCounters + info.StaleCounterWrites}
	}
	return v
}

func writeVersion(w io.Writer, v output.Version, asJSON bool) error {
	if asJSON {
		return writeJSON(w, v)
	}
	b := buildinfo.Build{Module: v.Module, Revision: v.Revision, Time: v.Time, Modified: v.Modified, GoVersion: v.GoVersion}
	fmt.Fprintf(w, "kinst %s\ndriver ABI %d\n", b, v.DriverABI)
	if v.Daemon == nil {
		_, err := fmt.Fprintf(w, "kerninstd: not answering: %s\n", v.DaemonError)
		return err
	}
	d := v.Daemon
	version := d.Version
	if version == "" {
		version = "(build not reported)"
	}
	abi := ""
	if d.DriverABI != v.DriverABI {
		abi = fmt.Sprintf(" (this kinst speaks %d: update one of them)", v.DriverABI)
	}
	_, err := fmt.Fprintf(w, "kerninstd at %s: %s\n  driver ABI %d%s, kernel %s\n", v.DaemonAddr, version, d.DriverABI, abi, d.KernelRelease)
	if err == nil && d.CounterFaults > 0 {
		_, err = fmt.Fprintf(w, "  counter heap: %d slot(s) written while free: a patch outlived its request (a kerninstd bug; its log names the slots)\n", d.CounterFaults)
	}
	return err
}
