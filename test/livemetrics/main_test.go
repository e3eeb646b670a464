// Package livemetrics tests kinst's metrics end to end against the real
// Debian kernel under QEMU (one VM for the package): wall time and
// concurrency against workloads of known shape, the pid predicate against
// a second process making the same calls, the Prometheus endpoint, session
// names and TTLs, and the SVG chart.
//
// Tolerances: the guest is emulated (TCG), so a sleeping task wakes late by
// up to tens of milliseconds, and the TSC rate is calibrated against
// CLOCK_MONOTONIC over a few hundred milliseconds (about 1 %). Lower
// bounds therefore allow 2 % under the known time and upper bounds 20 %
// over it.
package livemetrics

import (
	"os"
	"testing"

	"github.com/kinst/kinst/app/livetest"
)

var guest *livetest.VM

func TestMain(m *testing.M) {
	os.Exit(livetest.Main(m, "livemetrics", func(g *livetest.VM) { guest = g }))
}
