package elfsym

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzSymbols: any file either fails to open or read with an error that
// names it, or gives a table whose symbols are sorted and found again by
// address and by name. The seeds in testdata/fuzz are small real files:
// an object and a static executable from gcc.
func FuzzSymbols(f *testing.F) {
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "file")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		tab, err := Open(p)
		if err != nil {
			if !strings.HasPrefix(err.Error(), p+": ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		syms := tab.Symbols()
		for i, s := range syms {
			if i > 0 && s.Addr < syms[i-1].Addr {
				t.Fatalf("symbol %d %q at %#x before %q at %#x", i, s.Name, s.Addr, syms[i-1].Name, syms[i-1].Addr)
			}
			if s.Kind != Func && s.Kind != Object {
				t.Fatalf("symbol %q of kind %v", s.Name, s.Kind)
			}
			if got, off, ok := tab.Lookup(s.Addr); ok && (got.Addr != s.Addr || off != 0) {
				t.Fatalf("Lookup(%#x) = %q at %#x+%#x", s.Addr, got.Name, got.Addr, off)
			}
			a, ok := tab.Addr(s.Name)
			if !ok {
				t.Fatalf("Addr(%q) not found", s.Name)
			}
			named := false
			for _, o := range syms {
				named = named || o.Name == s.Name && o.Addr == a
			}
			if !named {
				t.Fatalf("Addr(%q) = %#x, no such symbol there", s.Name, a)
			}
		}
		if id := tab.BuildID(); len(id)%2 != 0 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("build id %q is not hex bytes", id)
		}
	})
}
