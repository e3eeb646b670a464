package live

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/web/webtest"
)

// startWeb runs kinst web on the host against the guest's kerninstd and
// returns the URL it prints first.
func startWeb(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(live.Bin, "kinst"), "web", "--listen", "127.0.0.1:0",
		"--addr", guest.KerninstdAddr(), "--token-file", guest.TokenFile())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "http://127.0.0.1:") {
		t.Fatalf("kinst web's first line %q (%v); stderr: %s", line, err, stderr.String())
	}
	return strings.TrimSpace(line)
}

// TestWeb works the web view in headless Chromium against the real
// kernel: the drawn blocks of filename_lookup (opened by its classic name)
// are kinst cfg's; a counter added by a click counts a stat workload and
// shows what kerninstd reports; detaching on the page puts every byte of
// the function back (read through QEMU); a coverage session started by
// the button colours the blocks as its report says, and ending it
// restores the bytes too.
func TestWeb(t *testing.T) {
	if webtest.FindChromium() == "" {
		t.Skip("chromium not installed (scripts/deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg, err := client.CFG(ctx, "filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	orig := live.QEMUBytes(t, uint64(cfg.Address), int(cfg.Size))
	url := startWeb(t)
	p := webtest.Open(t, strings.TrimSuffix(url, "/")+"/fn/lookuppn")
	p.WaitFunction("filename_lookup")

	var want, got []int
	for _, b := range cfg.Blocks {
		if !b.Padding {
			want = append(want, b.Index)
		}
	}
	for _, b := range p.Blocks() {
		got = append(got, b.Index)
		if n := len(cfg.Blocks[b.Index].Instructions); b.Insns != n {
			t.Errorf("block %d: %d instructions drawn, kinst cfg has %d", b.Index, b.Insns, n)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("drawn blocks %v, kinst cfg --json's (without padding) %v", got, want)
	}

	// A counter at the entry block, by a click; every stat(2) runs it.
	p.ClickBlock(0)
	var sess api.Session
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && sess.ID == "" {
		ss, err := client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			if s.Name == "web-filename_lookup-b0" {
				sess = s
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sess.ID == "" || len(sess.Probes) != 1 {
		t.Fatalf("no session web-filename_lookup-b0 after the click (status %q): %+v", p.Status(), sess)
	}
	gsh(t, ctx, "kinst workload stat 2000 /")
	var count uint64
	for time.Now().Before(deadline.Add(time.Minute)) {
		ss, _ := client.Sessions(ctx)
		for _, s := range ss {
			if s.ID == sess.ID {
				count = s.Probes[0].Count
			}
		}
		if p.Until(fmt.Sprintf(`document.querySelector('#graph .block[data-block="0"]').dataset.count === "%d"`, count), 3*time.Second) {
			break
		}
	}
	if count < 2000 {
		t.Errorf("the counter counted %d calls of 2000 stats", count)
	}
	if c := webtest.Eval[string](p, `document.querySelector('#graph .block[data-block="0"]').dataset.count`); c != strconv.FormatUint(count, 10) {
		t.Errorf("the page shows %q, kerninstd %d", c, count)
	}
	p.Click(fmt.Sprintf(`#sessions li[data-session=%q] button`, sess.ID))
	if !p.Until(`!document.querySelector('#graph .block[data-count]')`, time.Minute) {
		t.Errorf("the count stayed drawn after detach on the page")
	}
	if ss, _ := client.Sessions(ctx); len(ss) != 0 {
		t.Fatalf("detach on the page left %+v", ss)
	}
	if now := live.QEMUBytes(t, uint64(cfg.Address), int(cfg.Size)); !bytes.Equal(now, orig) {
		t.Errorf("filename_lookup's bytes differ after detach on the page")
	}

	// Coverage from the button.
	p.Click("#cover")
	if !p.Until(`!!document.querySelector('#graph .block[data-covered]')`, time.Minute) {
		t.Fatalf("no coverage drawn (status %q)", p.Status())
	}
	ss, err := client.Sessions(ctx)
	if err != nil || len(ss) != 1 || ss[0].Cover == nil {
		t.Fatalf("sessions after Cover: %+v %v", ss, err)
	}
	gsh(t, ctx, "kinst workload stat 200 /; kinst workload stat 20 /nonexistent 2>/dev/null || true")
	var rep *api.CoverReport
	same := func() bool {
		if rep, err = client.CoverReport(ctx, ss[0].ID); err != nil || rep.CoveredBlocks == 0 {
			return false
		}
		drawn := map[int]string{}
		for _, b := range p.Blocks() {
			drawn[b.Index] = b.Covered
		}
		for _, b := range rep.Functions[0].Blocks {
			want := "uncovered"
			if b.Covered {
				want = "covered"
			} else if b.Refused != nil {
				want = "refused"
			}
			if d, ok := drawn[b.Index]; ok && d != want {
				return false
			}
		}
		return true
	}
	deadline = time.Now().Add(time.Minute)
	for !same() && time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	if !same() {
		t.Errorf("the page's colours %+v differ from the coverage report", p.Blocks())
	}
	p.Click("#cover")
	if !p.Until(`!document.querySelector('#graph .block[data-covered]')`, time.Minute) {
		t.Errorf("coverage colours stayed after ending the session on the page")
	}
	if ss, _ := client.Sessions(ctx); len(ss) != 0 {
		t.Fatalf("ending coverage on the page left %+v", ss)
	}
	if now := live.QEMUBytes(t, uint64(cfg.Address), int(cfg.Size)); !bytes.Equal(now, orig) {
		t.Errorf("filename_lookup's bytes differ after the coverage session")
	}
}
