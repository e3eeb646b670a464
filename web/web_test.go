package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
	"github.com/kinst/kinst/procsession"
	"github.com/kinst/kinst/procsession/proctest"
	"github.com/kinst/kinst/web/webtest"
)

// vendored is one line of assets/vendor/MANIFEST.
type vendored struct{ pkg, version, integrity, file, name, sha256 string }

func readManifest(t *testing.T) []vendored {
	t.Helper()
	b, err := os.ReadFile("assets/vendor/MANIFEST")
	if err != nil {
		t.Fatal(err)
	}
	var out []vendored
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 6 {
			t.Fatalf("MANIFEST: %q: want 6 fields", line)
		}
		out = append(out, vendored{f[0], f[1], f[2], f[3], f[4], f[5]})
	}
	return out
}

// The vendored libraries are the bytes the manifest names, every file of
// assets/vendor is in it, and the page loads them. With KINST_WEB_VENDOR=1
// (needs npm and the registry) the build step, scripts/web-vendor.sh, is
// run into a scratch directory and must reproduce every byte.
func TestVendoredAssets(t *testing.T) {
	m := readManifest(t)
	names := map[string]bool{"MANIFEST": true}
	for _, v := range m {
		names[v.name] = true
		b, err := assets.ReadFile("assets/vendor/" + v.name)
		if err != nil {
			t.Errorf("%s (%s@%s): %v", v.name, v.pkg, v.version, err)
			continue
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != v.sha256 {
			t.Errorf("%s: sha256 %x, manifest says %s (run scripts/web-vendor.sh)", v.name, sum, v.sha256)
		}
	}
	ents, err := assets.ReadDir("assets/vendor")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !names[e.Name()] {
			t.Errorf("assets/vendor/%s is not in MANIFEST", e.Name())
		}
	}
	page, _ := assets.ReadFile("assets/index.html")
	for _, v := range m {
		if strings.HasSuffix(v.name, ".js") || strings.HasSuffix(v.name, ".css") {
			if !bytes.Contains(page, []byte("/assets/vendor/"+v.name)) {
				t.Errorf("index.html does not load %s", v.name)
			}
		}
	}
	for _, ref := range []string{`src="http`, `href="http`, `src="//`, `href="//`} {
		if bytes.Contains(page, []byte(ref)) {
			t.Errorf("index.html loads something from the network (%s…)", ref)
		}
	}
	if os.Getenv("KINST_WEB_VENDOR") != "1" {
		t.Log("KINST_WEB_VENDOR=1 also runs scripts/web-vendor.sh against the npm registry")
		return
	}
	dir := t.TempDir()
	out, err := exec.Command("../scripts/web-vendor.sh", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("web-vendor.sh: %v\n%s", err, out)
	}
	for _, v := range m {
		got, err := os.ReadFile(filepath.Join(dir, v.name))
		want, _ := assets.ReadFile("assets/vendor/" + v.name)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: the build step gives other bytes (%v)", v.name, err)
		}
	}
}

// serve starts the web view over an in-memory kerninstd.
func serve(t *testing.T, token string) (*kerninstdtest.Server, *httptest.Server) {
	t.Helper()
	k := kerninstdtest.New(t)
	s := &Server{Client: k.Client, Token: token, Interval: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := httptest.NewServer(s.Handler())
	t.Cleanup(h.Close)
	return k, h
}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if out != nil {
		json.NewDecoder(r.Body).Decode(out)
	}
	return r.StatusCode
}

// The API the page uses answers as kerninstd does, errors included.
func TestAPI(t *testing.T) {
	_, h := serve(t, "")
	var fns api.Functions
	if code := getJSON(t, h.URL+"/api/functions?q=lookup", &fns); code != 200 || len(fns.Functions) == 0 || fns.Functions[0].Name != "lookuppn" {
		t.Errorf("functions: %d %+v", code, fns)
	}
	var cfg api.CFG
	if code := getJSON(t, h.URL+"/api/cfg?func=lookuppn", &cfg); code != 200 || cfg.Function != "filename_lookup" || len(cfg.Blocks) == 0 {
		t.Errorf("cfg: %d %+v", code, cfg)
	}
	var e api.ErrorResponse
	if code := getJSON(t, h.URL+"/api/cfg?func=no_such_function", &e); code != http.StatusNotFound && code != http.StatusBadRequest || !strings.Contains(e.Error, "no_such_function") {
		t.Errorf("unknown function: %d %+v", code, e)
	}
	if code := getJSON(t, h.URL+"/api/cfg", &e); code != http.StatusBadRequest {
		t.Errorf("no function: %d %+v", code, e)
	}
	tok := pageToken(t, h.URL)
	for _, body := range []string{`{"points":["lookuppn"],"tied":true}`, `{"points":[`, `{"points":["filename_lookup+0x1"]}`, `{"points":["no_such_function"]}`} {
		if code := post(t, h.URL, body, map[string]string{"X-Kinst-Csrf": tok}); code/100 != 4 || code == http.StatusForbidden {
			t.Errorf("POST %s: %d, want a 4xx from its checks", body, code)
		}
	}
	var ss []api.Session
	if getJSON(t, h.URL+"/api/sessions", &ss); len(ss) != 0 {
		t.Errorf("a refused request left sessions: %+v", ss)
	}
	for _, path := range []string{"/", "/fn/lookuppn", "/assets/app.js", "/assets/vendor/dagre.min.js"} {
		if code := getJSON(t, h.URL+path, nil); code != 200 {
			t.Errorf("GET %s: %d", path, code)
		}
	}
}

// pageToken is the token the page at url carries for its changes.
func pageToken(t *testing.T, url string) string {
	t.Helper()
	r, err := http.Get(url + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	_, rest, ok := strings.Cut(string(b), `<meta name="kinst-csrf" content="`)
	tok, _, _ := strings.Cut(rest, `"`)
	if !ok || len(tok) != 32 {
		t.Fatalf("no token in the page: %q", tok)
	}
	return tok
}

// post sends body to /api/sessions with headers (Content-Type JSON unless
// given) and returns the status.
func post(t *testing.T, base, body string, headers map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/api/sessions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return r.StatusCode
}

// No other site can splice through the user's browser: a change without
// the page's token, from another origin or site, or not JSON (a form's
// "simple" request) is refused and changes nothing; a name other than
// this server's (DNS rebinding) is refused outright.
func TestSameOrigin(t *testing.T) {
	k := kerninstdtest.New(t)
	s := &Server{Client: k.Client, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := httptest.NewServer(s.Handler())
	defer h.Close()
	host := strings.TrimPrefix(h.URL, "http://")
	s.Hosts = []string{host}
	h.Config.Handler = s.Handler() // a new page token: read it again
	tok := pageToken(t, h.URL)
	good := `{"points":["lookuppn"]}`
	for _, tc := range []struct {
		what    string
		headers map[string]string
	}{
		{"no token", nil},
		{"a wrong token", map[string]string{"X-Kinst-Csrf": "0123456789abcdef0123456789abcdef"}},
		{"another origin", map[string]string{"X-Kinst-Csrf": tok, "Origin": "http://evil.example"}},
		{"another site", map[string]string{"X-Kinst-Csrf": tok, "Sec-Fetch-Site": "cross-site"}},
		{"a form", map[string]string{"X-Kinst-Csrf": tok, "Content-Type": "text/plain"}},
	} {
		if code := post(t, h.URL, good, tc.headers); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", tc.what, code)
		}
	}
	if ss, _ := k.Client.Sessions(context.Background()); len(ss) != 0 {
		t.Fatalf("a refused change made %+v", ss)
	}
	if code := post(t, h.URL, good, map[string]string{"X-Kinst-Csrf": tok, "Origin": h.URL, "Sec-Fetch-Site": "same-origin"}); code != http.StatusCreated {
		t.Errorf("the page's own request: %d", code)
	}
	req, _ := http.NewRequest("GET", h.URL+"/", nil)
	req.Host = "rebound.example:80"
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("a foreign Host: %v %v", r, err)
	}
}

// The page and its assets stay small: under 1 MB in all.
func TestAssetsSize(t *testing.T) {
	var total int64
	fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			info, _ := d.Info()
			total += info.Size()
		}
		return err
	})
	t.Logf("page and assets: %d bytes", total)
	if total >= 1<<20 {
		t.Errorf("page and assets: %d bytes, want under 1 MB", total)
	}
}

// Beyond loopback the page needs the token: the URL's ?token= sets a
// cookie; without either, every path is refused.
func TestToken(t *testing.T) {
	_, h := serve(t, "s3cret")
	for _, path := range []string{"/", "/api/sessions", "/assets/app.js", "/?token=wrong"} {
		if code := getJSON(t, h.URL+path, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d", path, code)
		}
	}
	r, err := http.Get(h.URL + "/?token=s3cret")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 200 || len(r.Cookies()) != 1 {
		t.Fatalf("with ?token=: %d, cookies %v", r.StatusCode, r.Cookies())
	}
	req, _ := http.NewRequest("GET", h.URL+"/api/sessions", nil)
	req.AddCookie(r.Cookies()[0])
	if r2, err := http.DefaultClient.Do(req); err != nil || r2.StatusCode != 200 {
		t.Errorf("with the cookie: %v %v", r2, err)
	}
	req, _ = http.NewRequest("GET", h.URL+"/api/sessions", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	if r2, err := http.DefaultClient.Do(req); err != nil || r2.StatusCode != 200 {
		t.Errorf("with the bearer token: %v %v", r2, err)
	}
}

// The page in a browser, over the in-memory kernel: the drawn blocks are
// the function's (kinst cfg's), a click on a block makes a counting
// session whose count is drawn as the kernel counts, the sessions list's
// detach removes it and every byte is back; a coverage session colours
// the blocks as its report says.
func TestPage(t *testing.T) {
	if webtest.FindChromium() == "" {
		t.Skip("chromium not installed")
	}
	k, h := serve(t, "")
	ctx := context.Background()
	cfg, err := k.Client.CFG(ctx, "filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := kerninstdtest.Text()
	textNow := func() []byte {
		b := make([]byte, len(orig))
		if err := k.Kernel.Read(kerninstdtest.TextAddr, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	p := webtest.Open(t, h.URL+"/fn/lookuppn")
	p.WaitFunction("filename_lookup")

	var want, got []int
	for _, b := range cfg.Blocks {
		if !b.Padding {
			want = append(want, b.Index)
		}
	}
	blocks := p.Blocks()
	for _, b := range blocks {
		got = append(got, b.Index)
		if n := len(cfg.Blocks[b.Index].Instructions); b.Insns != n {
			t.Errorf("block %d: %d instructions drawn, kinst cfg has %d", b.Index, b.Insns, n)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("drawn blocks %v, kinst cfg's (without padding) %v", got, want)
	}

	// A counter by a click.
	bi := -1
	for _, b := range cfg.Blocks {
		if !b.Padding && b.Index > 0 && slices.ContainsFunc(b.Instructions, func(i api.CFGInstruction) bool { return i.SpliceClass != "refused" }) {
			bi = b.Index
			break
		}
	}
	p.ClickBlock(bi)
	name := fmt.Sprintf("web-filename_lookup-b%d", bi)
	var sess api.Session
	if !p.Until(fmt.Sprintf(`[...document.querySelectorAll('#sessions li')].some(li => li.textContent.includes(%q))`, name), 20*time.Second) {
		t.Fatalf("no session %s listed after the click (status %q)", name, p.Status())
	}
	ss, err := k.Client.Sessions(ctx)
	if err != nil || len(ss) != 1 || ss[0].Name != name || len(ss[0].Probes) != 1 {
		t.Fatalf("sessions after the click: %+v %v", ss, err)
	}
	sess = ss[0]
	if err := k.Kernel.Count(uint64(sess.Probes[0].Address), 41); err != nil {
		t.Fatal(err)
	}
	if !p.Until(fmt.Sprintf(`document.querySelector('#graph .block[data-block="%d"]').dataset.count === "41"`, bi), 20*time.Second) {
		t.Errorf("block %d does not show the 41 hits: %+v", bi, p.Blocks())
	}
	// kinst ls's count is the page's.
	if ss, _ := k.Client.Sessions(ctx); len(ss) != 1 || ss[0].Probes[0].Count != 41 {
		t.Errorf("kerninstd's count: %+v", ss)
	}
	p.Click(fmt.Sprintf(`#sessions li[data-session=%q] button`, sess.ID))
	if !p.Until(`!document.querySelector('#graph .block[data-count]')`, 20*time.Second) {
		t.Errorf("the count stayed drawn after detach")
	}
	if ss, _ := k.Client.Sessions(ctx); len(ss) != 0 {
		t.Errorf("detach on the page left %+v", ss)
	}
	if !bytes.Equal(textNow(), orig) {
		t.Errorf("text not restored after detach on the page")
	}

	// Coverage: the button arms a session; blocks hit turn covered, the
	// rest stay uncovered or refused, as the session's report says.
	p.Click("#cover")
	if !p.Until(`!!document.querySelector('#graph .block[data-covered]')`, 20*time.Second) {
		t.Fatalf("no coverage drawn (status %q)", p.Status())
	}
	ss, err = k.Client.Sessions(ctx)
	if err != nil || len(ss) != 1 || ss[0].Cover == nil {
		t.Fatalf("sessions after Cover: %+v %v", ss, err)
	}
	rep, err := k.Client.CoverReport(ctx, ss[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	hit := 0
	for _, b := range rep.Functions[0].Blocks {
		if b.Point != nil && hit < 2 {
			_, off, _ := strings.Cut(*b.Point, "+")
			var o uint64
			fmt.Sscanf(off, "0x%x", &o)
			if err := k.Kernel.Count(uint64(cfg.Address)+o, 1); err != nil {
				t.Fatal(err)
			}
			hit++
		}
	}
	// The daemon sweeps every cover.Poll of its clock.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		k.Clock.Advance(time.Second)
		if rep, err = k.Client.CoverReport(ctx, ss[0].ID); err == nil && rep.CoveredBlocks > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rep.CoveredBlocks == 0 {
		t.Fatalf("no block covered after %d hits", hit)
	}
	wantColours := webtest.CoverColours(rep, "filename_lookup")
	deadline = time.Now().Add(20 * time.Second)
	for !webtest.SameColours(p.Colours(), wantColours) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if !webtest.SameColours(p.Colours(), wantColours) {
		t.Errorf("colours %v, the report's %v", p.Colours(), wantColours)
	}
	p.Click("#cover") // on: ends the session
	if !p.Until(`!document.querySelector('#graph .block[data-covered]')`, 20*time.Second) {
		t.Errorf("coverage colours stayed after ending the session")
	}
	if ss, _ := k.Client.Sessions(ctx); len(ss) != 0 {
		t.Errorf("ending coverage on the page left %+v", ss)
	}
	if !bytes.Equal(textNow(), orig) {
		t.Errorf("text not restored after the coverage session")
	}

	// The sidebar's form: coverage of a glob, drawn on the function's page.
	webtest.Eval[bool](p, `document.getElementById('cover-kind').value = 'glob', document.getElementById('cover-what').value = 'filename_*', true`)
	p.Click("#cover-form button")
	if !p.Until(`!!document.querySelector('#graph .block[data-covered]')`, 20*time.Second) {
		t.Fatalf("the glob's coverage is not drawn (status %q)", p.Status())
	}
	ss, err = k.Client.Sessions(ctx)
	if err != nil || len(ss) != 1 || ss[0].Name != "web-cover-glob-filename_*" || ss[0].Cover == nil || ss[0].Cover.FunctionCount == 0 {
		t.Fatalf("sessions after the form: %+v %v", ss, err)
	}
	p.Click(fmt.Sprintf(`#sessions li[data-session=%q] button`, ss[0].ID))
	if !p.Until(`document.querySelectorAll('#sessions li[data-session]').length === 0`, 20*time.Second) {
		t.Errorf("the glob's session stayed listed after detach")
	}
	if !bytes.Equal(textNow(), orig) {
		t.Errorf("text not restored after the glob's coverage session")
	}
}

// The same page over a user process (kinst web -p): a function of the
// executable opened at /fn/NAME, a click's counter counts exactly the
// program's calls, detaching on the page puts the bytes back; a
// library's function opens at /fn/LIB:NAME.
func TestPageProcess(t *testing.T) {
	if webtest.FindChromium() == "" {
		t.Skip("chromium not installed")
	}
	prog := proctest.Start(t)
	host, err := procsession.Open(prog.Cmd.Process.Pid, procsession.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	s := &Server{Client: host, Interval: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := httptest.NewServer(s.Handler())
	t.Cleanup(h.Close) // after the browser's (cleanups run last first): its event stream ends first
	ctx := context.Background()
	cfg, err := host.CFG(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	mem := func() []byte {
		f, err := os.Open(fmt.Sprintf("/proc/%d/mem", prog.Cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, cfg.Size)
		f.ReadAt(b, int64(cfg.Address))
		return b
	}
	orig := mem()
	p := webtest.Open(t, h.URL+"/fn/work")
	p.WaitFunction("work")
	if !p.Until(`document.getElementById('kernel').textContent.includes('process')`, 10*time.Second) {
		t.Errorf("the page does not say it shows a process")
	}
	p.ClickBlock(0)
	if !p.Until(`document.querySelectorAll('#sessions li[data-session]').length === 1`, 20*time.Second) {
		t.Fatalf("no session after the click (status %q)", p.Status())
	}
	prog.Round(t)
	want := fmt.Sprint(proctest.CallsPerRound)
	if !p.Until(`document.querySelector('#graph .block[data-block="0"]').dataset.count === "`+want+`"`, 20*time.Second) {
		t.Errorf("block 0 shows %q, the program made %s calls", webtest.Eval[string](p, `document.querySelector('#graph .block[data-block="0"]').dataset.count || ''`), want)
	}
	p.Click(`#sessions li[data-session] button`)
	if !p.Until(`document.querySelectorAll('#sessions li[data-session]').length === 0`, 20*time.Second) {
		t.Fatalf("the session stayed after detach")
	}
	if !bytes.Equal(mem(), orig) {
		t.Errorf("work's bytes differ after detach on the page")
	}
	var lib string
	fns, _ := host.Functions(ctx, "malloc", 50)
	for _, f := range fns.Functions {
		if strings.HasSuffix(f.Name, ":malloc") {
			lib = f.Name
		}
	}
	p.Navigate(h.URL + "/fn/" + lib)
	p.WaitFunction(lib)

	// A jump table: its block says so, an edge to each case.
	dcfg, err := host.CFG(ctx, "dispatch")
	if err != nil {
		t.Fatal(err)
	}
	cases := 0
	for _, b := range dcfg.Blocks {
		for _, e := range b.Succs {
			if e.Kind == "table" {
				cases++
			}
		}
	}
	if cases == 0 {
		t.Fatalf("gcc made no jump table of dispatch's switch")
	}
	p.Navigate(h.URL + "/fn/dispatch")
	p.WaitFunction("dispatch")
	if n := webtest.Eval[int](p, `document.querySelectorAll('#graph path.edge.table').length`); n != cases {
		t.Errorf("%d table edges drawn, the CFG has %d", n, cases)
	}
	if !webtest.Eval[bool](p, `[...document.querySelectorAll('#graph text.hdr')].some(t => t.textContent.includes('jump table'))`) {
		t.Errorf("no block says it ends in a jump table")
	}
}
