package bisect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kinst/kinst/app/vm"
)

// VMTrial tries points in a test VM booted for the try alone, so nothing
// one try did (a leaked splice, a wedged CPU) reaches the next.
type VMTrial struct {
	// Config is the VM to boot; StateDir is made for each try.
	Config vm.Config
	// Arm is the guest command that arms the points while Workload runs,
	// with the points appended as arguments; default: kinst count, its
	// probes in for Duration.
	Arm []string
	// Workload is a guest shell command run while the probes are in
	// (default: kinst workload syscalls for Duration).
	Workload string
	// Duration is how long the probes stay in (default 20 s).
	Duration time.Duration
	// Timeout is how long a try may take after boot before the guest is
	// called hung, if it no longer answers (default Duration + 3 min:
	// arming thousands of probes in an emulated guest takes minutes).
	Timeout time.Duration
	// DumpDir, when set, keeps a dump of each failed guest there
	// (kinst core reads it).
	DumpDir string
}

// oopsLine matches what the kernel logs when it is in trouble.
var oopsLine = regexp.MustCompile(`(?m)^.*(Oops|BUG:|general protection|Kernel panic|WARNING: CPU|RIP: |double fault|stack guard page).*$`)

// Try is a TryFunc: it boots a guest, arms points while the workload
// runs, and says how the guest fared.
func (v *VMTrial) Try(ctx context.Context, points []string) (Result, error) {
	c := v.Config
	dur := v.Duration
	if dur <= 0 {
		dur = 20 * time.Second
	}
	timeout := v.Timeout
	if timeout <= 0 {
		timeout = dur + 3*time.Minute
	}
	dir, err := os.MkdirTemp("", "kinst-bisect-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	c.StateDir, c.Progress = dir, nil
	in, err := vm.Up(ctx, c)
	if err != nil {
		return Result{}, fmt.Errorf("boot: %w", err)
	}
	defer in.Down(context.Background())

	arm := v.Arm
	if len(arm) == 0 {
		arm = []string{"kinst", "count", "--duration", dur.String()}
	}
	work := v.Workload
	if work == "" {
		work = "kinst workload syscalls " + dur.String()
	}
	// The points go as arguments after the script: no quoting.
	script := fmt.Sprintf(`(%s) >/dev/null 2>&1 & "$@" >/dev/null; wait`, work)
	argv := append([]string{"sh", "-c", script, "sh"}, arm...)
	argv = append(argv, points...)
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, execErr := in.Exec(tctx, argv, io.Discard, io.Discard)
	if ctx.Err() != nil {
		return Result{}, ctx.Err()
	}
	if execErr != nil {
		// A panicking guest takes a moment to make QEMU exit.
		for end := time.Now().Add(5 * time.Second); in.Running() && time.Now().Before(end); {
			time.Sleep(200 * time.Millisecond)
		}
	}
	res := Result{Outcome: Pass}
	switch {
	case !in.Running():
		res = Result{Crash, "QEMU exited: " + lastOops(in.SerialLog())}
	case execErr != nil && !in.Answers(ctx):
		res = Result{Hang, "the guest stopped answering; vCPUs at " + vcpuPCs(in)}
	case execErr != nil && errors.Is(tctx.Err(), context.DeadlineExceeded):
		res = Result{Hang, fmt.Sprintf("the guest answers, but the probes were not gone after %v", timeout)}
	case execErr != nil:
		return Result{}, fmt.Errorf("guest command: %w", execErr)
	}
	if !res.Outcome.Failed() {
		if line := lastOops(in.SerialLog()); line != "" {
			res = Result{Oops, line}
		}
	}
	if res.Outcome.Failed() && v.DumpDir != "" && in.Running() {
		path := filepath.Join(v.DumpDir, fmt.Sprintf("bisect-%s-%d-points-%s.elf", res.Outcome, len(points), time.Now().Format("150405")))
		if err := in.Dump(path, "elf"); err == nil {
			res.Detail += " (dump: " + path + ")"
		}
	}
	return res, nil
}

// lastOops is the first line of the serial log that says the kernel is in
// trouble, or "".
func lastOops(serial string) string {
	b, err := os.ReadFile(serial)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(oopsLine.FindString(string(b)))
}

// vcpuPCs is every vCPU's rip as QEMU's monitor shows it.
func vcpuPCs(in *vm.Instance) string {
	out, err := in.HMP("info registers -a")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	var pcs []string
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "RIP="); ok {
			pcs = append(pcs, "0x"+strings.TrimLeft(v, "0"))
		}
	}
	return strings.Join(pcs, " ")
}
