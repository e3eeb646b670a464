package live

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/web/webtest"
)

// startWeb runs kinst web on the host against the guest's kerninstd.
func startWeb(t *testing.T) string {
	return webtest.Start(t, filepath.Join(live.Bin, "kinst"), guest.KerninstdAddr(), guest.TokenFile())
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
	p := webtest.Open(t, url+"/fn/lookuppn")
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
	p.Screenshot(filepath.Join(livetest.ArtifactDir("web"), "counter.png"))
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
	same := func() bool {
		rep, err := client.CoverReport(ctx, ss[0].ID)
		return err == nil && rep.CoveredBlocks > 0 && webtest.SameColours(p.Colours(), webtest.CoverColours(rep, "filename_lookup"))
	}
	deadline = time.Now().Add(time.Minute)
	for !same() && time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	if !same() {
		t.Errorf("the page's colours %+v differ from the coverage report", p.Blocks())
	}
	p.Screenshot(filepath.Join(livetest.ArtifactDir("web"), "coverage.png"))
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

// TestWebScale measures the page on the kernel's largest function (of
// the 40 largest by bytes, the one with the most blocks) and with 1,000 live counters: how long the layout
// and drawing take, and whether an update a second arrives with none
// dropped. Figures are logged, not asserted (the page's own benchmark);
// the test fails only if the page cannot show them at all.
func TestWebScale(t *testing.T) {
	if webtest.FindChromium() == "" {
		t.Skip("chromium not installed (scripts/deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	syms, err := kernel.ParseKallsyms(strings.NewReader(gsh(t, ctx, "cat /proc/kallsyms")))
	if err != nil {
		t.Fatal(err)
	}
	// The 40 largest functions by bytes (to the next symbol), then the
	// one of them with the most blocks.
	type cand struct {
		name   string
		size   uint64
		blocks []api.CFGBlock
	}
	var cands []cand
	fns := syms.All()
	for i := 0; i+1 < len(fns); i++ {
		s, next := fns[i], fns[i+1]
		if s.Module == "" && next.Module == "" && !s.IsPrefix() {
			cands = append(cands, cand{name: s.Name, size: next.Addr - s.Addr})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return int(b.size) - int(a.size) })
	cands = cands[:40]
	nblocks := func(c cand) int {
		n := 0
		for _, b := range c.blocks {
			if !b.Padding {
				n++
			}
		}
		return n
	}
	for i := range cands {
		if cfg, err := client.CFG(ctx, cands[i].name); err == nil {
			cands[i].blocks = cfg.Blocks
		}
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return nblocks(b) - nblocks(a) })
	largest, size := cands[0].name, cands[0].size
	url := startWeb(t)
	p := webtest.Open(t, url+"/fn/"+largest)
	p.WaitFunction(largest)
	blocks := len(p.Blocks())
	t.Logf("largest function %s: %d bytes, %d blocks drawn in %s ms (layout and SVG, headless Chromium)",
		largest, size, blocks, webtest.Eval[string](p, `document.body.dataset.drawMs`))
	p.Screenshot(filepath.Join(livetest.ArtifactDir("web"), "largest.png"))

	// 1,000 counters: every block of the largest function that takes one,
	// then blocks of the next largest until there are 1,000.
	var points []string
	for _, c := range cands {
		for _, b := range c.blocks {
			if len(points) < 1000 && !b.Padding && slices.ContainsFunc(b.Instructions, func(i api.CFGInstruction) bool { return i.SpliceClass != "refused" }) {
				points = append(points, fmt.Sprintf("%s:%d", c.name, b.Index))
			}
		}
	}
	start := time.Now()
	sess, err := client.CreateSession(ctx, api.SessionRequest{Points: points, Name: "web-scale"})
	if err != nil {
		t.Fatalf("%d counters: %v", len(points), err)
	}
	t.Logf("%d counters armed in %s", len(sess.Probes), time.Since(start).Round(time.Millisecond))
	defer client.RemoveSession(context.Background(), sess.ID)
	p.Navigate(url + "/fn/" + largest)
	p.WaitFunction(largest)
	if !p.Until(`Number(document.body.dataset.events || 0) >= 2`, time.Minute) {
		t.Fatalf("no updates with %d counters live", len(points))
	}
	e0 := webtest.Eval[string](p, `document.body.dataset.events`)
	gsh(t, ctx, "kinst workload stat 3000 / >/dev/null; sleep 5")
	e1 := webtest.Eval[string](p, `document.body.dataset.events`)
	counted := webtest.Eval[int](p, `document.querySelectorAll('#graph .block[data-count]').length`)
	t.Logf("with %d counters live: updates %s -> %s over the workload, longest gap %s ms; %d blocks of %s show a count",
		len(points), e0, e1, webtest.Eval[string](p, `document.body.dataset.maxGapMs`), counted, largest)
	if counted == 0 {
		t.Errorf("no block of %s shows a count", largest)
	}
	p.Screenshot(filepath.Join(livetest.ArtifactDir("web"), "counters.png"))
	if _, err := client.RemoveSession(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
}

// TestWebSourceLines: with Debian's debug vmlinux, the page shows each
// instruction's source line above it where the line changes, and each
// such line is addr2line's at the instruction's link-time address (the
// KASLR slide from the guest's kallsyms and nm).
func TestWebSourceLines(t *testing.T) {
	if webtest.FindChromium() == "" {
		t.Skip("chromium not installed (scripts/deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	vmlinux := live.DebugVmlinux(t)
	slide := kaslrSlide(t, ctx, vmlinux)
	cfg, err := client.CFG(ctx, "vfs_statx")
	if err != nil {
		t.Fatal(err)
	}
	url := webtest.Start(t, filepath.Join(live.Bin, "kinst"), guest.KerninstdAddr(), guest.TokenFile(), "--vmlinux", vmlinux)
	p := webtest.Open(t, url+"/fn/vfs_statx")
	p.WaitFunction("vfs_statx")
	type row struct {
		Offset int    `json:"offset"`
		Src    string `json:"src"`
	}
	// Every instruction that has a source row right above it.
	rows := webtest.Eval[[]row](p, `[...document.querySelectorAll('#graph text.insn')].filter(t => t.previousElementSibling && t.previousElementSibling.classList.contains('src')).map(t => ({offset: Number(t.dataset.offset), src: t.previousElementSibling.textContent.replace(/^\/\/ /, '')}))`)
	if len(rows) == 0 {
		t.Fatal("no source line drawn")
	}
	addrs := make([]uint64, len(rows))
	for i, r := range rows {
		addrs[i] = uint64(cfg.Address) + uint64(r.Offset) - slide
	}
	want := debuginfotest.Addr2line(t, vmlinux, addrs)
	for i, r := range rows {
		// The page drops the build directory (debian/build/build_…/).
		if !strings.HasSuffix(want[i], "/"+r.Src) && want[i] != r.Src {
			t.Errorf("vfs_statx+%#x: the page says %s, addr2line %s", r.Offset, r.Src, want[i])
		}
	}
	t.Logf("%d source lines drawn in vfs_statx, each addr2line's", len(rows))
	p.Screenshot(filepath.Join(livetest.ArtifactDir("web"), "lines.png"))
}
