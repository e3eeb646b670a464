package livecore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/kinst/kinst/core/dump"
)

// TestKdumpMatchesELF checks the kdump readers against an ELF core of
// the same paused guest (a paused guest gives every dump the same
// memory): QEMU's kdump-zlib stream (flattened), the standard file
// `makedumpfile -R` rebuilds from it, and dumps makedumpfile filters out
// of the ELF core with -d 31 (zero, cache, user and free pages left out):
// a standard LZO file and a flattened zlib stream. Every page a kdump
// holds must equal the ELF core's; the unfiltered ones must hold every
// page; the notes must agree; and `kinst core ps` must list the same
// tasks from the filtered LZO dump as from the ELF core.
//
// It needs a live guest: this file sorts before core_test.go, whose
// TestCore ends by panicking the guest.
func TestKdumpMatchesELF(t *testing.T) {
	mdf, err := exec.LookPath("makedumpfile")
	if err != nil {
		t.Fatalf("makedumpfile: %v (run make deps)", err)
	}
	if _, err := guest.QMP("stop", nil); err != nil {
		t.Fatal(err)
	}
	// The guest stays paused until the end: an idle TCG guest still
	// costs host CPU the comparisons can use.
	defer func() {
		if _, err := guest.QMP("cont", nil); err != nil {
			t.Errorf("cont: %v", err)
		}
	}()
	elfPath := dumpGuest(t, "compare.elf", "elf")
	qemuKdump := dumpGuest(t, "compare.kdump-zlib", "kdump-zlib")
	defer os.Remove(elfPath)
	defer os.Remove(qemuKdump)
	dir := t.TempDir()
	run := func(stdin, stdout string, args ...string) {
		t.Helper()
		cmd := exec.Command(mdf, args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if stdin != "" {
			f, err := os.Open(stdin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd.Stdin = f
		}
		if stdout != "" {
			f, err := os.Create(stdout)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd.Stdout = f
		}
		start := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("makedumpfile %v: %v\n%s", args, err, errb.String())
		}
		t.Logf("makedumpfile %v: %.1fs", args, time.Since(start).Seconds())
	}
	rebuilt := filepath.Join(dir, "rebuilt")
	run(qemuKdump, "", "-R", rebuilt)
	if err := phdrsAfterHeader(elfPath); err != nil {
		t.Fatal(err)
	}
	lzo, flatZlib := filepath.Join(dir, "lzo-d31"), filepath.Join(dir, "zlib-d31.flat")
	run("", "", "-l", "-d", "31", elfPath, lzo)
	run("", flatZlib, "-F", "-c", "-d", "31", elfPath)

	elf, err := dump.Open(elfPath)
	if err != nil {
		t.Fatal(err)
	}
	defer elf.Close()
	present := map[string][]dump.Range{}
	for _, c := range []struct {
		name, path, format string
		filtered           bool
	}{
		{"qemu-flattened", qemuKdump, "kdump-flattened", false},
		{"makedumpfile-R", rebuilt, "kdump", false},
		{"makedumpfile-lzo-d31", lzo, "kdump", true},
		{"makedumpfile-flattened-zlib-d31", flatZlib, "kdump-flattened", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			kd, err := dump.Open(c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer kd.Close()
			if kd.Format() != c.format {
				t.Errorf("format %q, want %q", kd.Format(), c.format)
			}
			compareDumps(t, elf, kd, c.filtered)
			present[c.name] = kd.PhysRanges()
		})
	}
	if a, b := present["makedumpfile-lzo-d31"], present["makedumpfile-flattened-zlib-d31"]; !reflect.DeepEqual(a, b) {
		t.Errorf("the two -d 31 dumps hold different pages: %d vs %d ranges", len(a), len(b))
	}
	t.Run("ps", func(t *testing.T) {
		tasks := func(path string) map[string]bool {
			var ps psJSON
			if err := json.Unmarshal(kinst(t, "core", path, "ps", "--json"), &ps); err != nil {
				t.Fatal(err)
			}
			m := map[string]bool{}
			for _, task := range ps.Tasks {
				m[fmt.Sprintf("%d %s", task.PID, task.Comm)] = true
			}
			return m
		}
		want, got := tasks(elfPath), tasks(lzo)
		if len(want) < 20 || !reflect.DeepEqual(got, want) {
			t.Errorf("ps from the filtered LZO kdump: %d tasks, from the ELF core %d", len(got), len(want))
		}
	})
}

// phdrsAfterHeader moves an ELF core's program headers to just after
// the ELF header and drops its section headers, in place: makedumpfile
// 1.7 reads program headers there, while QEMU 7.2 puts section headers
// there and the program headers after them. Only the first page changes;
// the file stays a valid core for every reader.
func phdrsAfterHeader(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	h := make([]byte, 4096)
	if _, err := f.ReadAt(h, 0); err != nil {
		return err
	}
	le := binary.LittleEndian
	phoff, phnum := le.Uint64(h[32:]), int(le.Uint16(h[56:]))
	if phoff+uint64(56*phnum) > 4096 {
		return fmt.Errorf("%s: program headers at %#x beyond the first page", path, phoff)
	}
	ph := bytes.Clone(h[phoff : phoff+uint64(56*phnum)])
	for i := 0; i < phnum; i++ {
		if off := le.Uint64(ph[56*i+8:]); off != 0 && off < uint64(64+len(ph)) {
			return fmt.Errorf("%s: segment %d at %#x leaves no room for the program headers", path, i, off)
		}
	}
	copy(h[64:], ph)
	le.PutUint64(h[32:], 64) // e_phoff
	le.PutUint64(h[40:], 0)  // e_shoff
	le.PutUint16(h[52:], 64) // e_ehsize
	le.PutUint16(h[58:], 0)  // e_shentsize
	le.PutUint16(h[60:], 0)  // e_shnum
	le.PutUint16(h[62:], 0)  // e_shstrndx
	_, err = f.WriteAt(h[:64+len(ph)], 0)
	return err
}

// guestRAM is the test VM's memory (main_test.go boots it with 1024 MiB).
const guestRAM = 1024 << 20

// compareDumps checks every page of the ELF core against the kdump: the
// same bytes, or (filtered dumps only) not present.
func compareDumps(t *testing.T, elf, kd dump.Dump, filtered bool) {
	if kd.VMCoreInfo() == "" || kd.VMCoreInfo() != elf.VMCoreInfo() {
		t.Errorf("VMCOREINFO differs or is empty (%d vs %d bytes)", len(kd.VMCoreInfo()), len(elf.VMCoreInfo()))
	}
	kc, ec := kd.CPUs(), elf.CPUs()
	if len(kc) != len(ec) || len(kc) == 0 {
		t.Fatalf("%d CPUs in the kdump, %d in the ELF core", len(kc), len(ec))
	}
	for i := range kc {
		if kc[i].Regs != ec[i].Regs {
			t.Errorf("CPU %d registers differ:\n kdump %+v\n elf   %+v", i, kc[i].Regs, ec[i].Regs)
		}
	}
	kb, eb := make([]byte, 4096), make([]byte, 4096)
	var pages, absent, nonzero int
	start := time.Now()
	for _, r := range elf.PhysRanges() {
		for a := r.Start &^ 4095; a < r.End; a += 4096 {
			if _, err := elf.ReadPhys(eb, a); err != nil {
				t.Fatalf("ELF page %#x: %v", a, err)
			}
			if _, err := kd.ReadPhys(kb, a); err != nil {
				// A filtered dump must say that its dumper left a page of
				// guest RAM out (1st bitmap, not 2nd); pages past RAM
				// (the BIOS ROM QEMU also dumps) have no struct page and
				// are in neither bitmap.
				var npe *dump.NotPresentError
				if filtered && errors.As(err, &npe) && (npe.Excluded || a >= guestRAM) {
					absent++
					continue
				}
				t.Fatalf("kdump page %#x: %v", a, err)
			}
			if !bytes.Equal(kb, eb) {
				t.Fatalf("page %#x differs between the kdump and the ELF core", a)
			}
			if bytes.Count(eb, []byte{0}) != len(eb) {
				nonzero++
			}
			pages++
		}
	}
	t.Logf("%d pages equal (%d not zero), %d left out by the dumper, compared in %.1fs",
		pages, nonzero, absent, time.Since(start).Seconds())
	if pages < 1000 || nonzero < 1000 || filtered && absent == 0 {
		t.Fatalf("%d pages compared, %d not zero, %d left out: the comparison proves too little", pages, nonzero, absent)
	}
	// Nothing the kdump claims lies outside the ELF core.
	for _, r := range kd.PhysRanges() {
		for _, a := range []uint64{r.Start, r.End - 1} {
			if _, err := elf.ReadPhys(eb[:1], a); err != nil {
				t.Errorf("the kdump covers %#x, the ELF core does not: %v", a, err)
			}
		}
	}
}
