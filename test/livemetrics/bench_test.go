package livemetrics

import (
	"context"
	"encoding/json"
	"sort"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
)

// BenchmarkTimeToFirstData runs `kinst time FUNC` in the guest with a
// 10 ms sampling interval and reports the median time from the request
// to the first sample (resolving the entry and exits, building, writing
// and splicing every patch, the first interval) and the median detach
// time (removing every splice). Guest times are emulated (TCG): compare
// them as ratios, not as hardware figures.
//
//	KINST_LIVE=1 go test -run XXX -bench FirstData -benchtime 10x ./test/livemetrics
func BenchmarkTimeToFirstData(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var first, detach []float64
	for i := 0; i < b.N; i++ {
		out, errs, code := guest.Exec(b, ctx, "kinst", "time", "--json", "--interval", "10ms", "--duration", "100ms", "do_sys_openat2", "vfs_read")
		if code != 0 {
			b.Fatalf("status %d: %s", code, errs)
		}
		var r output.TimeReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			b.Fatal(err)
		}
		first = append(first, float64(r.FirstDataNS))
		detach = append(detach, float64(r.DetachNS))
	}
	b.ReportMetric(median(first)/1e6, "ms_first_data")
	b.ReportMetric(median(detach)/1e6, "ms_detach")
}

func median(v []float64) float64 {
	sort.Float64s(v)
	return v[len(v)/2]
}
