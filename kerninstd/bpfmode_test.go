package kerninstd

import (
	"errors"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/internal/cpuquirk"
)

// TestRefuseWithoutDriver: a request that needs splices is refused with
// why kerninstd does not splice, and the error matches ErrNoDriver and the
// reason.
func TestRefuseWithoutDriver(t *testing.T) {
	cover := api.SessionRequest{Cover: []string{"vfs_read"}}
	for _, c := range []struct {
		why     error
		say     string
		matches error
	}{
		{why: driver.ErrNotLoaded, say: "load it with kinst driver load"},
		{why: nil, say: "load it with kinst driver load"},
		{why: cpuquirk.ErrStaleCmpxchg16bFlags, say: "coverage needs splices, which kerninstd does not make here: this CPU computes the flags of cmpxchg16b", matches: cpuquirk.ErrStaleCmpxchg16bFlags},
	} {
		d := &Daemon{noSplice: c.why}
		err := d.refuseWithoutDriver(cover)
		if err == nil || !strings.Contains(err.Error(), c.say) || !errors.Is(err, ErrNoDriver) {
			t.Errorf("why %v: %v; want ErrNoDriver saying %q", c.why, err, c.say)
		}
		if c.matches != nil && !errors.Is(err, c.matches) {
			t.Errorf("why %v: %v does not match it", c.why, err)
		}
		if err := d.refuseWithoutDriver(api.SessionRequest{Points: []string{"vfs_read"}}); err != nil {
			t.Errorf("why %v: a count refused: %v", c.why, err)
		}
	}
}
