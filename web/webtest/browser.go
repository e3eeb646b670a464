// Package webtest drives kinst's web view in headless Chromium, as a
// user would (real mouse events on the drawn graph), and reads back what
// the page shows: for the web package's tests over an in-memory kerninstd
// and the live tests against the test VM.
package webtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kinst/kinst/api"
)

// FindChromium returns Debian's chromium (or another Chrome) on PATH, or
// "".
func FindChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Block is a drawn block as the page shows it.
type Block struct {
	Index   int    `json:"index"`
	Count   string `json:"count"`   // data-count: "" when not counted
	Covered string `json:"covered"` // data-covered: covered, uncovered, refused or ""
	Insns   int    `json:"insns"`   // instructions drawn
}

// Page is one browser tab on the web view.
type Page struct {
	t   testing.TB
	ctx context.Context
}

// Browser starts a headless Chromium (the test skips without one) with a
// window of width×height and returns its context, on which chromedp runs
// actions; the browser stops with the test.
func Browser(t testing.TB, width, height int) context.Context {
	t.Helper()
	chrome := FindChromium()
	if chrome == "" {
		t.Skip("chromium not installed (scripts/deps.sh installs it): cannot test in a browser")
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chrome),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
		chromedp.WindowSize(width, height),
	)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	// Start the browser on the context without a deadline (a deadline
	// there would stop the browser); every step on it has one.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", chrome, err)
	}
	return ctx
}

// Open starts a browser (Browser) and loads url.
func Open(t testing.TB, url string) *Page {
	t.Helper()
	p := &Page{t: t, ctx: Browser(t, 1400, 1000)}
	p.Do("load "+url, chromedp.Navigate(url))
	return p
}

// Do runs actions with a deadline, failing the test on error.
func (p *Page) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// Eval evaluates js in the page.
func Eval[T any](p *Page, js string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		p.t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// WaitFunction waits until the page shows function name's graph.
func (p *Page) WaitFunction(name string) {
	p.t.Helper()
	p.Do("wait for "+name+"'s graph", chromedp.WaitVisible(fmt.Sprintf(`body[data-ready=%q] #graph .block`, name)))
}

// Blocks reads every drawn block.
func (p *Page) Blocks() []Block {
	p.t.Helper()
	return Eval[[]Block](p, `[...document.querySelectorAll('#graph .block')].map(g => ({
		index: Number(g.dataset.block), count: g.dataset.count || '', covered: g.dataset.covered || '',
		insns: g.querySelectorAll('text.insn').length }))`)
}

// ClickBlock clicks block i's header line (a mouse click at its place on
// the screen, scrolled into view).
func (p *Page) ClickBlock(i int) {
	p.t.Helper()
	p.Do(fmt.Sprintf("click block %d", i), chromedp.Click(fmt.Sprintf(`#graph .block[data-block="%d"] text.hdr`, i)))
}

// Click clicks the element sel selects.
func (p *Page) Click(sel string) {
	p.t.Helper()
	p.Do("click "+sel, chromedp.Click(sel))
}

// Until polls cond (JavaScript returning a boolean) every 200 ms until it
// holds or timeout passes; false if it never did.
func (p *Page) Until(cond string, timeout time.Duration) bool {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if Eval[bool](p, cond) {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// Status is the page's status line.
func (p *Page) Status() string {
	p.t.Helper()
	return Eval[string](p, `document.getElementById('status').textContent`)
}

// Screenshot writes a PNG of the page's viewport to path.
func (p *Page) Screenshot(path string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 60*time.Second)
	defer cancel()
	b, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Errorf("screenshot: %v", err)
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Errorf("screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Errorf("screenshot: %v", err)
		return
	}
	p.t.Logf("screenshot: %s", path)
}

// Navigate loads url in the tab.
func (p *Page) Navigate(url string) {
	p.t.Helper()
	p.Do("load "+url, chromedp.Navigate(url))
}

// Start runs `kinst web` (the binary at kinst) on a free loopback port
// against kerninstd at addr, with its token file and args, and returns
// the URL it prints first; it stops with the test.
func Start(t testing.TB, kinst, addr, tokenFile string, args ...string) string {
	t.Helper()
	cmd := exec.Command(kinst, append([]string{"web", "--listen", "127.0.0.1:0", "--addr", addr, "--token-file", tokenFile}, args...)...)
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
	return strings.TrimSuffix(strings.TrimSpace(line), "/")
}

// Colours reads every drawn block's coverage colour (data-covered).
func (p *Page) Colours() map[int]string {
	p.t.Helper()
	m := map[int]string{}
	for _, b := range p.Blocks() {
		m[b.Index] = b.Covered
	}
	return m
}

// CoverColours is the colour the page must draw for each block of
// function fn in rep: covered, refused (no probe) or uncovered.
func CoverColours(rep *api.CoverReport, fn string) map[int]string {
	m := map[int]string{}
	for _, f := range rep.Functions {
		if f.Function != fn {
			continue
		}
		for _, b := range f.Blocks {
			switch {
			case b.Covered:
				m[b.Index] = "covered"
			case b.Refused != nil:
				m[b.Index] = "refused"
			default:
				m[b.Index] = "uncovered"
			}
		}
	}
	return m
}

// SameColours reports whether every drawn block shows want's colour
// (blocks not drawn, such as padding, are not compared).
func SameColours(drawn, want map[int]string) bool {
	for i, c := range want {
		if d, ok := drawn[i]; ok && d != c {
			return false
		}
	}
	return len(want) > 0
}
