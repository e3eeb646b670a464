package livebpf

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/web/webtest"
)

// TestWeb: the same page over kerninstd on BPF (no driver). Coverage and
// virtual timers are greyed out with the reason; a counter at the entry
// block, added by a click, counts a stat workload through BPF and is
// removed from the page with nothing left attached.
func TestWeb(t *testing.T) {
	if webtest.FindChromium() == "" {
		t.Skip("chromium not installed (scripts/deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url := webtest.Start(t, filepath.Join(live.Bin, "kinst"), live.KerninstdAddr(), live.TokenFile())
	p := webtest.Open(t, url+"/fn/lookuppn")
	p.WaitFunction("filename_lookup")
	if !p.Until(`document.getElementById('cover').disabled && document.getElementById('time-virtual').disabled && document.getElementById('cover-go').disabled`, 30*time.Second) {
		t.Errorf("coverage and virtual timers are not greyed out on BPF")
	}
	if title := webtest.Eval[string](p, `document.getElementById('cover').title`); !strings.Contains(title, "driver") {
		t.Errorf("the greyed-out Cover says %q, not why", title)
	}
	p.ClickBlock(0)
	var id string
	deadline := time.Now().Add(time.Minute)
	for id == "" && time.Now().Before(deadline) {
		ss, err := client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ss) == 1 && len(ss[0].Probes) == 1 {
			id = ss[0].ID
			if m := ss[0].Probes[0].Mechanism; m == "splice" {
				t.Errorf("mechanism %q without the driver", m)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if id == "" {
		t.Fatalf("no counter after the click (status %q)", p.Status())
	}
	gsh(t, ctx, "kinst workload stat 500 /")
	if !p.Until(`Number(document.querySelector('#graph .block[data-block="0"]').dataset.count || 0) >= 500`, time.Minute) {
		t.Errorf("the entry block shows %q after 500 stats", webtest.Eval[string](p, `document.querySelector('#graph .block[data-block="0"]').dataset.count || ''`))
	}
	p.Screenshot(filepath.Join(livetest.ArtifactDir("web"), "bpf.png"))
	p.Click(`#sessions li[data-session="` + id + `"] button`)
	if !p.Until(`document.querySelectorAll('#sessions li[data-session]').length === 0`, time.Minute) {
		t.Fatalf("the counter stayed after detach on the page")
	}
	nothingAttached(t, ctx)
}
