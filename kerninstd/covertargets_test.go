package kerninstd_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kerninstd"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
)

// targetsDaemon serves a daemon over kerninstdtest's kernel whose
// path_openat and putname belong to a module, testmod (kallsyms's
// "[testmod]" column).
func targetsDaemon(t *testing.T) (*api.Client, *kerninstdtest.Kernel, []byte) {
	t.Helper()
	text, kallsyms := kerninstdtest.Text()
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(kallsyms), "\n") {
		if strings.HasSuffix(l, " path_openat") || strings.HasSuffix(l, " putname") {
			l = strings.Replace(l, " T ", " t ", 1) + "\t[testmod]"
		}
		lines = append(lines, l)
	}
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := kerninstdtest.NewKernel(kerninstdtest.TextAddr, text)
	d, err := kerninstd.New(kerninstd.Config{Device: k, Kallsyms: path, Release: "test",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(func() {
		srv.Close()
		d.Close()
	})
	return api.NewClient(strings.TrimPrefix(srv.URL, "http://")), k, text
}

func textNow(t *testing.T, k *kerninstdtest.Kernel, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := k.Read(kerninstdtest.TextAddr, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Coverage targets: callees to a depth (the test kernel's call graph:
// do_sys_openat2 calls do_filp_open and putname, do_filp_open calls
// path_openat; jmp __x86_return_thunk is a return, not a tail call), a
// module's functions, and all of them combined with names and globs,
// each function once.
func TestCoverTargets(t *testing.T) {
	c, _, _ := targetsDaemon(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  api.SessionRequest
		want []string
	}{
		{"callees", api.SessionRequest{CoverCallees: []string{"do_sys_openat2"}},
			[]string{"do_sys_openat2", "do_filp_open", "putname"}},
		{"callees depth 2", api.SessionRequest{CoverCallees: []string{"do_sys_openat2"}, CoverDepth: 2},
			[]string{"do_sys_openat2", "do_filp_open", "putname", "path_openat"}},
		{"callees of a leaf", api.SessionRequest{CoverCallees: []string{"putname"}, CoverDepth: 3},
			[]string{"putname"}},
		{"module", api.SessionRequest{CoverModules: []string{"testmod"}},
			[]string{"path_openat", "putname"}},
		{"combined", api.SessionRequest{Cover: []string{"filename_lookup", "path_*"}, CoverModules: []string{"testmod"},
			CoverCallees: []string{"lookuppn", "do_filp_open"}},
			[]string{"filename_lookup", "path_openat", "putname", "do_filp_open"}},
	} {
		s, err := c.CreateSession(ctx, tc.req)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var got []string
		blocks := 0
		rep, err := c.CoverReport(ctx, s.ID)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if s.Cover.FunctionCount != len(rep.Functions) || s.Cover.TotalBlocks == 0 {
			t.Errorf("%s: the session's summary says %d functions, %d blocks; its report has %d functions", tc.name, s.Cover.FunctionCount, s.Cover.TotalBlocks, len(rep.Functions))
		}
		for _, f := range rep.Functions {
			got = append(got, f.Function)
			blocks += f.Total
			if f.Error != "" || f.Total == 0 {
				t.Errorf("%s: %s: %d blocks, error %q", tc.name, f.Function, f.Total, f.Error)
			}
			if wantMod := map[bool]string{true: "testmod"}[f.Function == "putname" || f.Function == "path_openat"]; f.Module != wantMod {
				t.Errorf("%s: %s in module %q, want %q", tc.name, f.Function, f.Module, wantMod)
			}
		}
		if !reflect.DeepEqual(got, tc.want) || s.Cover.TotalBlocks != blocks {
			t.Errorf("%s: functions %v (%d blocks, total %d), want %v", tc.name, got, blocks, s.Cover.TotalBlocks, tc.want)
		}
		if _, err := c.RemoveSession(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// Bad targets are refused with a 400 (or 404 for an unknown function)
// that says why, and change nothing.
func TestCoverTargetRefusals(t *testing.T) {
	c, k, text := targetsDaemon(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req      api.SessionRequest
		status   int
		code     string
		mentions string
	}{
		{api.SessionRequest{CoverModules: []string{"ext4"}}, http.StatusBadRequest, api.CodeBadRequest, `module "ext4" is not loaded`},
		{api.SessionRequest{Cover: []string{"filename_lookup"}, CoverModules: []string{"ext4"}}, http.StatusBadRequest, api.CodeBadRequest, "not loaded"},
		{api.SessionRequest{CoverModules: []string{"test/mod"}}, http.StatusBadRequest, api.CodeBadRequest, "module name"},
		{api.SessionRequest{CoverCallees: []string{"do_sys_openat2"}, CoverDepth: -1}, http.StatusBadRequest, api.CodeBadRequest, "negative call depth"},
		{api.SessionRequest{Cover: []string{"putname"}, CoverDepth: 2}, http.StatusBadRequest, api.CodeBadRequest, "call depth needs"},
		{api.SessionRequest{CoverCallees: []string{"no_such_function"}}, http.StatusNotFound, api.CodeUnknownFunction, "no_such_function"},
		{api.SessionRequest{CoverCallees: []string{"do_sys_openat2+0x9"}}, http.StatusBadRequest, api.CodeBadRequest, "name a function"},
		{api.SessionRequest{CoverCallees: []string{"putname"}, Points: []string{"putname"}}, http.StatusBadRequest, api.CodeBadRequest, "coverage session"},
	} {
		_, err := c.CreateSession(ctx, tc.req)
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.Status != tc.status || ae.Code != tc.code || !strings.Contains(ae.Error(), tc.mentions) {
			t.Errorf("%+v: got %v (%+v), want %d %s mentioning %q", tc.req, err, ae, tc.status, tc.code, tc.mentions)
		}
	}
	in, err := c.Info(ctx)
	if err != nil || in.Splices != 0 || in.Sessions != 0 || !reflect.DeepEqual(textNow(t, k, len(text)), text) {
		t.Errorf("a refused request changed something: %+v, %v", in, err)
	}
}
