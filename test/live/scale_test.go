package live

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// kernelText returns [_stext, _etext) of the guest's kernel image.
func kernelText(t *testing.T, ctx context.Context) (lo, hi uint64) {
	t.Helper()
	out := gsh(t, ctx, "grep -E ' (_stext|_etext)$' /proc/kallsyms")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			t.Fatalf("kallsyms line %q: %v", line, err)
		}
		switch f[2] {
		case "_stext":
			lo = v
		case "_etext":
			hi = v
		}
	}
	if lo == 0 || hi <= lo {
		t.Fatalf("kernel text bounds from kallsyms: %#x…%#x (%q)", lo, hi, out)
	}
	return lo, hi
}

// saveText reads [lo, hi) through QEMU (not the driver) into a file and
// returns its bytes.
func saveText(t *testing.T, lo, hi uint64, name string) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := guest.SaveVirt(lo, int(hi-lo), path); err != nil {
		t.Fatalf("QEMU memsave of the kernel text: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != int(hi-lo) {
		t.Fatalf("QEMU saved %d bytes of text, want %d", len(b), hi-lo)
	}
	return b
}

// textDiff describes where two copies of the text differ (at most a few
// places), or "".
func textDiff(lo uint64, a, b []byte) string {
	var places []string
	for i := 0; i < len(a) && len(places) < 8; i++ {
		if a[i] == b[i] {
			continue
		}
		j := i
		for j < len(a) && j-i < 16 && a[j] != b[j] {
			j++
		}
		places = append(places, fmt.Sprintf("%#x: %x → %x", lo+uint64(i), a[i:j], b[i:j]))
		i = j
	}
	return strings.Join(places, "; ")
}

// Arming tens of thousands of coverage probes at once hung the guest (the
// first 13,495 blocks in address order hung it 3 times in 4, 30,000 every
// time). The mechanism, read from a dump of the hung guest: the blocks
// reached hw_breakpoint_exceptions_notify, a die notifier registered
// before kinst's at the same priority, so notify_die calls it for every
// int3 before kinst's redirect. While its splice was being written (an
// int3 for the length of a batch), any other probe's int3 called it and
// hit its int3, which called it again, until the NMI nesting count
// overflowed; the BUG that raised recursed through report_bug into a
// probe in is_valid_bugaddr until the stack overflowed, and the double
// fault then looped on its own stack. The planner now refuses every
// function on the die chain (read from the kernel), so the same bench
// completes, with a workload running, and leaves the text as it was,
// read through QEMU.
func TestArmAtScale(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	noOops(t, ctx, "boot")

	// The rule: each die notifier the kernel registers is refused, and
	// hw_breakpoint's (not on the kprobe blacklist) for being one.
	for _, fn := range []string{"hw_breakpoint_exceptions_notify", "arch_uprobe_exception_notify", "kprobe_exceptions_notify"} {
		_, stderr, status := gexec(t, ctx, "kinst", "count", fn, "--duration", "1s")
		if status == 0 || !strings.Contains(stderr, "no-splice") {
			t.Errorf("kinst count %s: status %d, %q; want a no-splice refusal", fn, status, stderr)
		}
		if fn == "hw_breakpoint_exceptions_notify" && !strings.Contains(stderr, "die notifier") {
			t.Errorf("kinst count %s: %q; want the die-notifier reason", fn, stderr)
		}
	}

	lo, hi := kernelText(t, ctx)
	before := saveText(t, lo, hi, "before")
	const blocks = 30000
	out := gsh(t, ctx, fmt.Sprintf("kinst workload syscalls 40s >/dev/null 2>&1 & kinst bench arm -n %d --json; wait", blocks))
	var rep api.ArmReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Runs) != 1 {
		t.Fatalf("kinst bench arm --json: %v\n%s", err, out)
	}
	r := rep.Runs[0]
	t.Logf("%d blocks of %d functions: %d armed, %d refused; planned in %v, armed in %v (%d syncs), removed in %v (%d syncs), %d KiB of patches",
		r.Blocks, r.Functions, r.Armed, r.Refused, time.Duration(r.PlanNS), time.Duration(r.ArmNS), r.ArmSyncs,
		time.Duration(r.RemoveNS), r.RemoveSyncs, r.PatchBytes>>10)
	if r.Armed+r.Refused != blocks || r.Armed < blocks*9/10 {
		t.Errorf("armed %d, refused %d of %d blocks (%v)", r.Armed, r.Refused, blocks, r.Refusals)
	}
	noOops(t, ctx, "kinst bench arm")
	if ls := strings.TrimSpace(gsh(t, ctx, "kinst ls")); strings.Contains(ls, "cover") {
		t.Errorf("sessions left after the bench:\n%s", ls)
	}
	after := saveText(t, lo, hi, "after")
	t.Logf("kernel text [%#x, %#x) through QEMU: sha256 %x before, %x after", lo, hi, sha256.Sum256(before), sha256.Sum256(after))
	if !bytes.Equal(before, after) {
		t.Errorf("kernel text differs after the bench: %s", textDiff(lo, before, after))
	}
}
