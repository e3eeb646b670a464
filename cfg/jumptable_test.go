package cfg

import (
	"debug/elf"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
)

// elfImage reads a linked executable's loaded sections by address.
type elfImage struct{ f *elf.File }

func (e elfImage) Read(addr uint64, b []byte) error {
	for _, s := range e.f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Type == elf.SHT_PROGBITS && addr >= s.Addr && addr+uint64(len(b)) <= s.Addr+s.Size {
			_, err := s.ReadAt(b, int64(addr-s.Addr))
			return err
		}
	}
	return errors.New("unmapped")
}

func TestJumpTables(t *testing.T) {
	for _, tool := range []string{"as", "ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	obj, exe := filepath.Join(dir, "jt.o"), filepath.Join(dir, "jt")
	if out, err := exec.Command("as", "--64", "-o", obj, "testdata/jumptable.s").CombinedOutput(); err != nil {
		t.Fatalf("as: %v\n%s", err, out)
	}
	if out, err := exec.Command("ld", "-Ttext=0x401000", "-e", "f", "-o", exe, obj).CombinedOutput(); err != nil {
		t.Fatalf("ld: %v\n%s", err, out)
	}
	ef, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	addr := map[string]uint64{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF {
			addr[s.Name] = s.Value
		}
	}
	text := make([]byte, addr["g"]-addr["f"])
	img := elfImage{ef}
	if err := img.Read(addr["f"], text); err != nil {
		t.Fatal(err)
	}
	fn, err := Decode("f", "", addr["f"], text)
	if err != nil {
		t.Fatal(err)
	}
	names := func(a uint64) (string, bool) {
		for n, v := range addr {
			if v == a {
				return n, true
			}
		}
		return "", false
	}
	blocks := fn.BlocksOpt(BlockOptions{Names: names, Tables: img})
	var tables []*JumpTable
	unresolved := 0
	for _, b := range blocks {
		if b.JumpTable != nil {
			tables = append(tables, b.JumpTable)
			if len(b.Succs) != len(b.JumpTable.Targets) || b.Succs[0].Kind != Table {
				t.Errorf("table block %d: succs %v", b.Index, b.Succs)
			}
		}
		if b.Exit == IndirectJump {
			unresolved++
		}
	}
	if len(tables) != 2 {
		t.Fatalf("%d tables resolved, want 2", len(tables))
	}
	if tables[0].Table != addr["abs_table"] || len(tables[0].Targets) != 4 {
		t.Errorf("absolute table: %+v", tables[0])
	}
	if tables[1].Table != addr["rel_table"] || len(tables[1].Targets) != 2 {
		t.Errorf("relative table: %+v", tables[1])
	}
	if unresolved != 1 {
		t.Errorf("%d unresolved indirect jumps, want 1 (jmp *%%rcx)", unresolved)
	}
	// Every table target is a block start with the table block as a
	// predecessor.
	for _, jt := range tables {
		for _, tg := range jt.Targets {
			i, err := fn.Index(tg)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, b := range blocks {
				found = found || b.First == i
			}
			if !found {
				t.Errorf("target %#x is not a block leader", tg)
			}
		}
	}
	// Without a reader nothing resolves.
	for _, b := range fn.Blocks(names) {
		if b.JumpTable != nil {
			t.Error("table resolved without a reader")
		}
	}
}
