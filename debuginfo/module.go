package debuginfo

import (
	"errors"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
)

// ModuleSearch says where FindModule looks for a kernel module's debug
// file.
type ModuleSearch struct {
	Root    string   // prepended to the default directories ("" for /); tests use a directory
	Release string   // the kernel release: the default directories are this release's
	Dirs    []string // searched first, each with its subdirectories (--module-debug)
	BuildID string   // the loaded module's build id; "" takes any file of its name
}

// dirs are the directories FindModule searches, in order: s.Dirs, then
// Debian's linux-image-RELEASE-dbg tree /usr/lib/debug/lib/modules/RELEASE,
// then the installed modules /lib/modules/RELEASE (Debian strips their
// DWARF; a module built out of tree keeps it).
func (s ModuleSearch) dirs() []string {
	ds := append([]string(nil), s.Dirs...)
	if s.Release != "" {
		ds = append(ds, s.Root+path.Join("/usr/lib/debug/lib/modules", s.Release), s.Root+path.Join("/lib/modules", s.Release))
	}
	return ds
}

// moduleFileNames are the file names a module called name may have: the
// kernel writes a module's name with underscores where its file may have
// dashes (snd-hda-intel.ko is snd_hda_intel), and a separate debug file
// may end in .debug.
func moduleFileNames(name string) []string {
	var out []string
	for _, n := range []string{name, strings.ReplaceAll(name, "_", "-")} {
		out = append(out, n+".ko", n+".ko.debug")
	}
	return out
}

// FindModule opens the debug file of the loaded kernel module name: the
// first file of that name (moduleFileNames) under s's directories that
// has DWARF and, when s.BuildID is known, that build id. Compressed modules (.ko.xz, .ko.zst) are not read. Nothing
// found gives a *NotFoundError naming the module.
func FindModule(name string, s ModuleSearch) (*File, error) {
	nf := &NotFoundError{Search: Search{Release: s.Release}, Module: name}
	want := map[string]bool{}
	for _, n := range moduleFileNames(name) {
		want[n] = true
	}
	for _, dir := range s.dirs() {
		var found []string
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == dir {
					return err
				}
				return nil // an unreadable subdirectory holds nothing we can read
			}
			if !d.IsDir() && want[d.Name()] {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				nf.Tried = append(nf.Tried, dir+": not there")
			} else {
				nf.Tried = append(nf.Tried, err.Error())
			}
			continue
		}
		if len(found) == 0 {
			nf.Tried = append(nf.Tried, dir+": no "+name+".ko")
		}
		for _, p := range found {
			if f := nf.open(p, s.BuildID); f != nil {
				return f, nil
			}
		}
	}
	return nil, nf
}

// moduleMessage is NotFoundError's message for a module.
func (e *NotFoundError) moduleMessage() string {
	return e.message("no debug file of module "+e.Module+" found", "--module-debug DIR")
}
