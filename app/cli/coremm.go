package cli

import (
	"fmt"
	"io"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/mm"
)

// VMReport is `kinst core DUMP vm PID --json`.
type VMReport struct {
	PID  int      `json:"pid"`
	Task string   `json:"task"`
	Comm string   `json:"comm"`
	MM   string   `json:"mm"` // "0x0": a kernel thread
	VMAs []mm.VMA `json:"vmas"`
	// Dropped counts tree slots that named no VMA of this mm (a torn
	// tree on a live kernel, or corruption).
	Dropped int `json:"dropped,omitempty"`
}

// CoreVM is `kinst core DUMP vm PID|TASK`: a task's address space, as
// crash's vm prints it: the mm_struct, then each VMA (struct, range,
// permissions as /proc/PID/maps, file offset and path).
func CoreVM(k *core.Kernel, which uint64, asJSON bool, w io.Writer) error {
	t, err := findTask(k, which)
	if err != nil {
		return err
	}
	fs, e, done, err := vfsReader(k)
	if err != nil {
		return err
	}
	defer done()
	r, err := mm.New(e, fs)
	if err != nil {
		return err
	}
	sp, err := r.Space(t.Addr)
	if sp == nil {
		return fmt.Errorf("vm of pid %d: %w", t.PID, err)
	}
	rep := VMReport{PID: t.PID, Task: t.Address, Comm: t.Comm, MM: fmt.Sprintf("%#x", sp.MM), VMAs: sp.VMAs, Dropped: sp.Dropped}
	if rep.VMAs == nil {
		rep.VMAs = []mm.VMA{}
	}
	if asJSON {
		if werr := writeJSON(w, rep); werr != nil {
			return werr
		}
		return err
	}
	fmt.Fprintf(w, "PID: %d  TASK: %s  COMMAND: %q\n", t.PID, t.Address, t.Comm)
	if sp.MM == 0 {
		fmt.Fprintln(w, "MM: 0x0 (a kernel thread: no address space)")
		return err
	}
	fmt.Fprintf(w, "MM: %s  VMAs: %d\n", rep.MM, len(rep.VMAs))
	tw := newTable(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "VMA\tSTART\tEND\tPERMS\tOFFSET\tFILE")
	for _, v := range rep.VMAs {
		fmt.Fprintf(tw, "%s\t%#x\t%#x\t%s\t%#x\t%s\n", v.VMA, v.Start, v.End, v.Perms, v.Offset, withError(v.File, v.Error))
	}
	tw.Flush()
	if sp.Dropped > 0 {
		fmt.Fprintf(w, "%d tree slots named no VMA of this mm (dropped)\n", sp.Dropped)
	}
	return err
}
