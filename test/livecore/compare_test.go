package livecore

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kinst/kinst/core/dump"
)

// TestKdumpMatchesELF: every page QEMU's kdump-zlib dump holds (its
// flattened form, and the standard form `makedumpfile -R` rebuilds from
// it) equals the same page of an ELF core of the same paused guest (a
// paused guest gives every dump the same memory), the kdump covers the
// same memory, and the notes agree. It needs a live guest: this file
// sorts before core_test.go, whose TestCore ends by panicking the guest.
func TestKdumpMatchesELF(t *testing.T) {
	if _, err := guest.QMP("stop", nil); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{
		"elf":        dumpGuest(t, "compare.elf", "elf"),
		"kdump-zlib": dumpGuest(t, "compare.kdump-zlib", "kdump-zlib"),
	}
	if _, err := guest.QMP("cont", nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	defer os.Remove(paths["elf"])
	defer os.Remove(paths["kdump-zlib"])
	elf, err := dump.Open(paths["elf"])
	if err != nil {
		t.Fatal(err)
	}
	defer elf.Close()

	candidates := map[string]string{"kdump-flattened": paths["kdump-zlib"]}
	// The standard form, as `makedumpfile -R` rebuilds it from the stream
	// (make deps installs makedumpfile).
	mdf, err := exec.LookPath("makedumpfile")
	if err != nil {
		t.Fatalf("makedumpfile: %v (run make deps)", err)
	}
	std := filepath.Join(dir, "kdump-std")
	in, err := os.Open(paths["kdump-zlib"])
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(mdf, "-R", std)
	cmd.Stdin = in
	out, err := cmd.CombinedOutput()
	in.Close()
	if err != nil {
		t.Fatalf("makedumpfile -R: %v\n%s", err, out)
	}
	candidates["kdump"] = std
	for want, path := range candidates {
		t.Run(want, func(t *testing.T) {
			kd, err := dump.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer kd.Close()
			if kd.Format() != want {
				t.Errorf("format %q, want %q", kd.Format(), want)
			}
			compareDumps(t, elf, kd)
		})
	}
}

func compareDumps(t *testing.T, elf, kd dump.Dump) {
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
	// Every page of the ELF core: the kdump holds it with the same bytes.
	// QEMU's kdump covers guest RAM only; pages outside it (the BIOS ROM
	// mapping) are allowed to be absent.
	kb, eb := make([]byte, 4096), make([]byte, 4096)
	var pages, absent, zero int
	start := time.Now()
	for _, r := range elf.PhysRanges() {
		for a := r.Start &^ 4095; a < r.End; a += 4096 {
			if _, err := elf.ReadPhys(eb, a); err != nil {
				t.Fatalf("ELF page %#x: %v", a, err)
			}
			if _, err := kd.ReadPhys(kb, a); err != nil {
				if errors.Is(err, dump.ErrNotPresent) && a >= 0xfffc0000 {
					absent++
					continue
				}
				t.Fatalf("kdump page %#x: %v", a, err)
			}
			if !bytes.Equal(kb, eb) {
				t.Fatalf("page %#x differs between the kdump and the ELF core", a)
			}
			if bytes.Count(eb, []byte{0}) == len(eb) {
				zero++
			}
			pages++
		}
	}
	t.Logf("%d pages equal (%d of them zero), %d ROM pages absent from the kdump, compared in %.1fs",
		pages, zero, absent, time.Since(start).Seconds())
	if pages < 1000 || zero == pages {
		t.Fatalf("only %d pages compared (%d zero): the comparison proves nothing", pages, zero)
	}
	// And nothing the kdump claims lies outside the ELF core.
	for _, r := range kd.PhysRanges() {
		for _, a := range []uint64{r.Start, r.End - 1} {
			if _, err := elf.ReadPhys(eb[:1], a); err != nil {
				t.Errorf("the kdump covers %#x, the ELF core does not: %v", a, err)
			}
		}
	}
}
