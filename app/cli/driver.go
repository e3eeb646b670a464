package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/kinst/kinst/output"
)

// DriverStatus writes `kinst driver status`.
func DriverStatus(st output.DriverStatus, asJSON bool, w io.Writer) error {
	if asJSON {
		return json.NewEncoder(w).Encode(st)
	}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	sb := "unknown"
	if st.SecureBoot != nil {
		sb = map[bool]string{true: "on", false: "off"}[*st.SecureBoot]
	}
	lock := st.Lockdown
	if lock == "" {
		lock = "unavailable"
	}
	daemon := yes(st.Kerninstd) + " (" + st.Socket + ")"
	if st.KerninstdPID > 0 {
		daemon += fmt.Sprintf(", pid %d", st.KerninstdPID)
	}
	rows := [][2]string{{"kernel", st.KernelRelease}, {"build id", st.BuildID}, {"module loaded", yes(st.ModuleLoaded)},
		{"/dev/kerninst", yes(st.Device)}, {"kerninstd", daemon}, {"lockdown", lock}, {"secure boot", sb}, {"config", st.Config}}
	for _, r := range rows {
		if _, err := fmt.Fprintf(w, "%-14s %s\n", r[0], r[1]); err != nil {
			return err
		}
	}
	var names []string
	for _, o := range st.Recommended {
		names = append(names, o.Name)
	}
	if len(names) > 0 {
		fmt.Fprintf(w, "%-14s %s (some commands need them)\n", "recommended", strings.Join(names, " "))
	}
	if len(st.Problems) == 0 {
		_, err := fmt.Fprintln(w, "problems       none")
		return err
	}
	fmt.Fprintln(w, "problems:")
	for _, p := range st.Problems {
		if _, err := fmt.Fprintf(w, "  - %s\n", p); err != nil {
			return err
		}
	}
	return nil
}
