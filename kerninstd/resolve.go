package kerninstd

import (
	"github.com/kinst/kinst/splice"
)

// resolve maps a point to one instruction of the live kernel and plans
// its splice (splice.Planner.Resolve). It changes nothing.
func (d *Daemon) resolve(spec string) (*splice.Site, error) { return d.plan.Resolve(spec) }
