package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3 go1.26.0"},
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2024-10-01T12:00:00Z"},
			{Key: "vcs.modified", Value: "true"}}}, "(devel) (0123456789ab, 2024-10-01T12:00:00Z, modified) go1.26.0"},
		{debug.BuildInfo{}, "(devel)"},
	} {
		if got := fromInfo(&tc.bi).String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.bi, got, tc.want)
		}
	}
	if b := Read(); b.GoVersion == "" {
		t.Errorf("Read() = %+v: no Go version", b)
	}
}
