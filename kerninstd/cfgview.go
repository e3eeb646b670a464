package kerninstd

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/splice"
)

// FunctionCFG analyses one function of the live kernel. It changes
// nothing.
func (d *Daemon) FunctionCFG(name string) (api.CFG, error) {
	if p, err := splice.ParsePoint(name); err != nil || p.HasOffset || p.HasBlock {
		return api.CFG{}, badRequest(fmt.Errorf("cfg: want a function name, got %q", name))
	}
	d.refresh()
	f, _, err := d.plan.Func(name)
	if err != nil {
		return api.CFG{}, err
	}
	g := report.CFG(f)
	if g.Module != "" {
		if b, err := os.ReadFile(filepath.Join(sysModule, g.Module, "notes", ".note.gnu.build-id")); err == nil {
			g.ModuleBuildID, _ = buildID(b)
		}
	}
	return g, nil
}

// sysModule is where the kernel lists its loaded modules' sections and
// notes.
const sysModule = "/sys/module"
