package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// Source lines as points in a process, from the executable's DWARF:
// lines.c:6 (y += 7, run for the 500 odd x of 1000 calls) and work:+4
// (work is declared at line 2) both count 500, named by the line; a line
// without code is refused before anything is spliced.
func TestCountProcessSourceLines(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kinst count -p runs as root")
	}
	bin := filepath.Join(t.TempDir(), "lines")
	if out, err := exec.Command("gcc", "-O0", "-g", "-o", bin, "testdata/lines.c").CombinedOutput(); err != nil {
		t.Skipf("gcc: %v\n%s", err, out)
	}
	var out, errb bytes.Buffer
	env := Env{Out: &out, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}
	status, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"lines.c:6", "work:+4", "work"},
		Interval: 50 * time.Millisecond, Command: []string{bin}, JSON: true}, env)
	if err != nil || status != 0 {
		t.Fatalf("status %d, %v\n%s", status, err, errb.String())
	}
	var rep api.CountReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"lines.c:6": 500, "work:+4": 500, "work": 1000}
	if len(rep.Probes) != len(want) {
		t.Fatalf("probes %+v, want one per point\n%s", rep.Probes, errb.String())
	}
	for _, p := range rep.Probes {
		if n, ok := want[p.Point]; !ok || p.Count != n || p.Function != "work" {
			t.Errorf("%s: %d in %s, want %d in work\n%s", p.Point, p.Count, p.Function, n, errb.String())
		}
	}
	if rep.Probes[0].Offset != rep.Probes[1].Offset {
		t.Errorf("lines.c:6 at work+%#x, work:+4 at +%#x: want the same place", rep.Probes[0].Offset, rep.Probes[1].Offset)
	}
	errb.Reset()
	if _, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"lines.c:9"}, Command: []string{bin}}, env); err == nil || !strings.Contains(err.Error(), "starts no code") {
		t.Errorf("lines.c:9 (a blank line): %v, want a no-code refusal", err)
	}
}
