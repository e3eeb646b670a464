// Package buildinfo says which build of kinst is running, from what the
// Go toolchain records in every binary (debug.ReadBuildInfo).
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Build identifies a binary.
type Build struct {
	Module    string // the module's version: "(devel)" for a build from a work tree
	Revision  string // VCS revision, if the build recorded one
	Time      string // its commit time (RFC 3339)
	Modified  bool   // the work tree had changes
	GoVersion string
}

// Read returns the running binary's build.
func Read() Build {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Build{Module: "unknown"}
	}
	return fromInfo(bi)
}

func fromInfo(bi *debug.BuildInfo) Build {
	b := Build{Module: bi.Main.Version, GoVersion: bi.GoVersion}
	if b.Module == "" {
		b.Module = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the build in one line: "v1.2.3 (0123456789ab, 2024-10-01T12:00:00Z, modified) go1.26".
func (b Build) String() string {
	var vcs []string
	if b.Revision != "" {
		vcs = append(vcs, b.Revision[:min(12, len(b.Revision))])
	}
	if b.Time != "" {
		vcs = append(vcs, b.Time)
	}
	if b.Modified {
		vcs = append(vcs, "modified")
	}
	s := b.Module
	if len(vcs) > 0 {
		s += " (" + strings.Join(vcs, ", ") + ")"
	}
	if b.GoVersion != "" {
		s += fmt.Sprintf(" %s", b.GoVersion)
	}
	return s
}
