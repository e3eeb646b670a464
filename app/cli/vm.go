package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/kinst/kinst/app/vm"
	"github.com/kinst/kinst/output"
)

// VMUp boots the test VM and says how to reach it.
func VMUp(ctx context.Context, c vm.Config, w io.Writer) error {
	start := time.Now()
	in, err := vm.Up(ctx, c)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "VM up in %.1fs (%s, kernel %s)\n", time.Since(start).Seconds(), in.Accel(), in.KernelRelease())
	fmt.Fprintf(w, "  run in the guest:   kinst vm exec -- kinst count lookuppn\n")
	fmt.Fprintf(w, "  kerninstd from here: KINST_ADDR=%s KINST_TOKEN_FILE=%s kinst count lookuppn\n", in.KerninstdAddr(), in.TokenFile())
	_, err = fmt.Fprintf(w, "  serial log:         %s\n  QMP:                %s\n  stop it:            kinst vm down\n", in.SerialLog(), in.QMPSocket())
	return err
}

// VMStatus describes the running VM (`kinst vm status`).
func VMStatus(in *vm.Instance, asJSON bool, w io.Writer) error {
	return writeVMStatus(w, output.VMStatus{KernelRelease: in.KernelRelease(), Accel: in.Accel(), Kerninstd: in.KerninstdAddr(),
		Agent: in.AgentAddr(), SerialLog: in.SerialLog(), QMP: in.QMPSocket()}, asJSON)
}

func writeVMStatus(w io.Writer, st output.VMStatus, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(st)
	}
	for _, kv := range [][2]string{{"kernel_release", st.KernelRelease}, {"accel", st.Accel}, {"kerninstd", st.Kerninstd},
		{"agent", st.Agent}, {"serial_log", st.SerialLog}, {"qmp", st.QMP}} {
		if _, err := fmt.Fprintf(w, "%-15s %v\n", kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// VMDump writes a crash dump of the guest and says how to read it.
func VMDump(in *vm.Instance, path, format string, stderr io.Writer) error {
	start := time.Now()
	if err := in.Dump(path, format); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "vm dump: %s (%s) in %.1fs; read it with kinst core %s info\n", path, format, time.Since(start).Seconds(), path)
	return nil
}
