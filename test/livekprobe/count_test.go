package livekprobe

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
)

// TestCountAgreesWithKprobe: kinst's count of filename_lookup (through
// the classic name lookuppn) over a stat workload against a tracefs kprobe
// on the same function over a slightly wider window; the text is as it
// was afterwards (QEMU's view).
func TestCountAgreesWithKprobe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := client.Resolve(ctx, "lookuppn")
	if err != nil || r.Function != "filename_lookup" {
		t.Fatalf("resolve lookuppn: %+v, %v", r, err)
	}
	orig := live.QEMUBytes(t, uint64(r.Address), r.Length)
	if hex.EncodeToString(orig) != r.Bytes {
		t.Fatalf("kerninstd reads %s at %#x, QEMU reads %x", r.Bytes, uint64(r.Address), orig)
	}
	out := gsh(t, ctx, fmt.Sprintf(`T=/sys/kernel/tracing
echo 'p:kinst/oracle filename_lookup' >> $T/kprobe_events
echo 1 > $T/events/kinst/oracle/enable
before=$(awk '$1=="oracle"{print $2}' $T/kprobe_profile)
kinst count lookuppn --json -- kinst workload stat %d / > /tmp/count.json
after=$(awk '$1=="oracle"{print $2}' $T/kprobe_profile)
echo 0 > $T/events/kinst/oracle/enable
echo '-:kinst/oracle' >> $T/kprobe_events
echo "$before $after"
cat /tmp/count.json`, statCalls))
	first, rest, _ := strings.Cut(out, "\n")
	var before, after uint64
	if _, err := fmt.Sscan(first, &before, &after); err != nil {
		t.Fatalf("kprobe_profile readings %q: %v", first, err)
	}
	var rep output.CountReport
	if err := json.Unmarshal([]byte(rest), &rep); err != nil {
		t.Fatalf("count --json: %v\n%s", err, rest)
	}
	if len(rep.Probes) != 1 || rep.ExitStatus == nil || *rep.ExitStatus != 0 {
		t.Fatalf("count report: %+v", rep)
	}
	got, oracle := rep.Probes[0].Count, after-before
	t.Logf("kinst count: %d; kprobe on filename_lookup over a slightly wider window: %d; workload: %d stat calls", got, oracle, statCalls)
	if got < statCalls || got > statCalls+slack {
		t.Errorf("kinst counted %d calls, want %d..%d", got, statCalls, statCalls+slack)
	}
	if oracle < got || oracle > got+slack {
		t.Errorf("kprobe counted %d calls, kinst %d: want kprobe in [kinst, kinst+%d] (its window is wider)", oracle, got, slack)
	}
	if now := live.QEMUBytes(t, uint64(r.Address), r.Length); !bytes.Equal(now, orig) {
		t.Errorf("after count: bytes at %#x are %x, want the original %x", uint64(r.Address), now, orig)
	}
}
