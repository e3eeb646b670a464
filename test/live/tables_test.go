package live

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kernel"
)

// koSite is an instruction a module's table names, as FUNC+0xOFF.
type koSite struct {
	fn  string
	off uint64
}

// koTableSites reads the sites a table section of a module file names,
// from the file's relocations (not from live memory): entry k's first
// field is an R_X86_64_PC32 relocation at k*entry whose symbol + addend is
// the instruction. Sites are mapped to the function symbol containing
// them; those outside any function are dropped.
func koTableSites(t *testing.T, ko, section string, entry uint64) []koSite {
	t.Helper()
	f, err := elf.Open(ko)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	rela := f.Section(".rela" + section)
	if rela == nil {
		t.Fatalf("%s has no .rela%s", ko, section)
	}
	data, err := rela.Data()
	if err != nil {
		t.Fatal(err)
	}
	var sites []koSite
	for off := 0; off+24 <= len(data); off += 24 {
		where := binary.LittleEndian.Uint64(data[off:])
		info := binary.LittleEndian.Uint64(data[off+8:])
		addend := int64(binary.LittleEndian.Uint64(data[off+16:]))
		if where%entry != 0 || elf.R_X86_64(info&0xffffffff) != elf.R_X86_64_PC32 || info>>32 == 0 {
			continue // not an entry's first field
		}
		s := syms[info>>32-1]
		target := s.Value + uint64(addend)
		for _, fn := range syms {
			if elf.ST_TYPE(fn.Info) == elf.STT_FUNC && fn.Section == s.Section && target >= fn.Value && target < fn.Value+fn.Size {
				sites = append(sites, koSite{fn: fn.Name, off: target - fn.Value})
				break
			}
		}
	}
	return sites
}

// moduleFile finds NAME.ko in the booted kernel's module tree.
func moduleFile(t *testing.T, name string) string {
	t.Helper()
	cache := os.Getenv("KINST_CACHE")
	if cache == "" {
		cache = filepath.Join(repoRoot(), ".cache")
	}
	var found string
	filepath.WalkDir(guest.Kernel(cache).Modules, func(p string, d fs.DirEntry, err error) error {
		if err == nil && (d.Name() == name+".ko" || d.Name() == name+".ko.xz") {
			found = p
			return fs.SkipAll
		}
		return nil
	})
	if found == "" {
		if b, _ := os.ReadFile(filepath.Join(guest.Kernel(cache).Modules, "modules.builtin")); strings.Contains(string(b), "/"+name+".ko\n") {
			return "" // built in (6.12 builds virtio in)
		}
		t.Fatalf("%s.ko not found in the kernel's module tree", name)
	}
	if strings.HasSuffix(found, ".xz") { // Debian compresses modules from 6.12 on
		out, err := exec.Command("xz", "-dc", found).Output()
		if err != nil {
			t.Fatalf("xz -dc %s: %v", found, err)
		}
		found = filepath.Join(t.TempDir(), name+".ko")
		if err := os.WriteFile(found, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return found
}

// TestModuleTableSitesRefused splices at instructions that loaded modules'
// own exception, jump-label and static-call tables name (kept in struct
// module, not in the core kernel's sections). The oracle is the module
// file's relocations; each splice must be refused with the table's reason
// and leave the bytes as QEMU sees them unchanged.
func TestModuleTableSitesRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	named := map[string]int{}
	for _, line := range strings.Split(gsh(t, ctx, "grep -i ' t ' /proc/kallsyms"), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			named[f[2]]++
		}
	}
	for _, tc := range []struct {
		module, section string
		entry           uint64
		mention         string
	}{
		{"evdev", "__ex_table", 12, "exception-table"},
		{"virtio_net", "__jump_table", 16, "static-key"},
		{"virtio_ring", "__jump_table", 16, "static-key"},
		{"virtio_net", ".static_call_sites", 8, "static call"},
	} {
		ko := moduleFile(t, tc.module)
		if ko == "" {
			t.Logf("%s is built into this kernel: its tables are the core kernel's", tc.module)
			continue
		}
		sites := koTableSites(t, ko, tc.section, tc.entry)
		tried := 0
		for _, s := range sites {
			if tried == 4 {
				break
			}
			if named[s.fn] != 1 {
				continue // FUNC would name another function of that name
			}
			point := fmt.Sprintf("%s+%#x", s.fn, s.off)
			m, err := client.Read(ctx, point, 8)
			if err != nil {
				continue // an init function, freed after the module loaded
			}
			tried++
			before := qemuBytes(t, m.Address, 8)
			_, err = client.CreateSession(ctx, api.SessionRequest{Points: []string{point}})
			var ae *api.APIError
			if !errors.As(err, &ae) || ae.Code != "no_splice" || !strings.Contains(ae.Error(), tc.mention) {
				t.Errorf("%s %s site %s: %v, want a no_splice refusal mentioning %q", tc.module, tc.section, point, err, tc.mention)
			}
			if after := qemuBytes(t, m.Address, 8); !bytes.Equal(before, after) {
				t.Errorf("%s changed: %x → %x", point, before, after)
			}
		}
		if tried == 0 {
			t.Errorf("%s: none of the %d %s sites is in a live function", tc.module, len(sites), tc.section)
		}
	}
}

// TestFtraceSitesFromRecords compares the functions whose instructions
// kerninstd refuses as ftrace sites, read from ftrace's records, with
// tracefs's available_filter_functions (ftrace's own listing of the same
// records) on a random sample of functions of the core kernel and of
// modules, traced and not; then splices at a recorded site of a module
// function and expects a refusal with no byte changed.
func TestFtraceSitesFromRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	traced := map[string]int{} // "name" or "name [module]" → times listed
	// Records of weak functions that another definition overrode are
	// listed as __ftrace_invalid_address___OFF: the dead body has no symbol
	// of its own, so it lies OFF bytes into the function before it. They
	// are still records, and still refused.
	invalid := map[uint64]bool{}
	sc := bufio.NewScanner(strings.NewReader(gsh(t, ctx, "cat /sys/kernel/tracing/available_filter_functions")))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		traced[line]++
		if off, ok := strings.CutPrefix(line, "__ftrace_invalid_address___"); ok {
			if v, err := strconv.ParseUint(off, 10, 64); err == nil {
				invalid[v] = true
			}
		}
	}
	if len(traced) < 1000 {
		t.Fatalf("available_filter_functions lists %d functions; is tracefs mounted?", len(traced))
	}
	// Text symbols, by name, with how often each name occurs: only
	// unambiguous names are sampled (a name shared by several static
	// functions resolves to one of them). Aliases at one address are one
	// function, listed by tracefs under any one of its names.
	named := map[string]int{}
	aliases := map[string][]string{} // address → "name [module]" keys
	var names []string
	sc = bufio.NewScanner(strings.NewReader(gsh(t, ctx, "grep -i ' t ' /proc/kallsyms")))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		key := f[2]
		if len(f) > 3 {
			key += " " + f[3]
		}
		named[f[2]]++
		if len(aliases[f[0]]) == 0 {
			names = append(names, f[0])
		}
		aliases[f[0]] = append(aliases[f[0]], key)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(3, uint64(time.Now().UnixNano())))
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	// Quotas by (in a module, traced).
	want := map[[2]bool]int{{false, true}: 25, {false, false}: 15, {true, true}: 10, {true, false}: 5}
	checked := map[[2]bool]int{}
	for _, addr := range names {
		key := aliases[addr][0]
		name, mod, _ := strings.Cut(key, " ")
		listed := 0
		for _, k := range aliases[addr] {
			listed += traced[k]
		}
		class := [2]bool{mod != "", listed == 1}
		if named[name] != 1 || listed > 1 || checked[class] >= want[class] {
			continue
		}
		c, err := client.CFG(ctx, name)
		if err != nil {
			continue // freed init text, or nothing decodable
		}
		var ftraceAt []uint64
		other := ""
		for _, b := range c.Blocks {
			for _, in := range b.Instructions {
				switch {
				case strings.Contains(in.Refused, "ftrace") && in.Offset != 0 && invalid[in.Offset]:
					// A dead weak body's record (see above).
				case strings.Contains(in.Refused, "ftrace"):
					ftraceAt = append(ftraceAt, in.Offset)
					if !strings.Contains(in.Refused, "ftrace's records") {
						t.Errorf("%s+%#x: %q: the reason should come from ftrace's records", key, in.Offset, in.Refused)
					}
				case in.Refused != "" && other == "":
					other = in.Refused
				}
			}
		}
		if other != "" && len(ftraceAt) == 0 && class[1] {
			continue // the whole function is refused for another reason (entry text, the int3 path)
		}
		checked[class]++
		// On IBT kernels (6.12) the site follows the endbr64 (or its
		// sealed form), which is refused for its own reason.
		want := uint64(0)
		if len(c.Blocks) > 0 && len(c.Blocks[0].Instructions) > 0 && strings.Contains(c.Blocks[0].Instructions[0].Refused, "endbr64") {
			want = 4
		}
		switch {
		case class[1] && (len(ftraceAt) != 1 || ftraceAt[0] != want):
			t.Errorf("%s is in available_filter_functions; ftrace sites refused at offsets %v, want exactly one at %#x", key, ftraceAt, want)
		case !class[1] && len(ftraceAt) != 0:
			t.Errorf("%s is not in available_filter_functions, yet refused as an ftrace site at %v", key, ftraceAt)
		}
	}
	t.Logf("sampled (module, traced): %v", checked)
	if checked[[2]bool{false, true}] < 20 || checked[[2]bool{false, false}] < 5 || checked[[2]bool{true, true}] < 5 {
		t.Errorf("too few functions sampled: %v", checked)
	}

	// A recorded site of a module function is refused and stays as it was.
	r, err := client.Read(ctx, "virtnet_poll", 9)
	if err != nil {
		t.Fatal(err)
	}
	site := "virtnet_poll+0x0"
	if code, _ := hex.DecodeString(r.Bytes); landingPad(code) {
		site = "virtnet_poll+0x4"
	}
	before := qemuBytes(t, r.Address, 9)
	_, err = client.CreateSession(ctx, api.SessionRequest{Points: []string{site}})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != "no_splice" || !strings.Contains(ae.Error(), "ftrace's records") {
		t.Errorf("splice at %s: %v, want a no_splice refusal from ftrace's records", site, err)
	}
	if after := qemuBytes(t, r.Address, 9); !bytes.Equal(before, after) {
		t.Errorf("%s changed: %x → %x", site, before, after)
	}
}

// TestModuleSymbolsFromELF places evdev.ko's ELF symbols at the section
// addresses the guest loaded it at (/sys/module/evdev/sections) and
// compares them with the guest's kallsyms for the module (the oracle).
func TestModuleSymbolsFromELF(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bases := map[string]uint64{}
	for _, line := range strings.Split(gsh(t, ctx, "cd /sys/module/evdev/sections && for f in .* *; do [ -f \"$f\" ] && echo \"$f $(cat \"$f\")\"; done"), "\n") {
		name, addr, ok := strings.Cut(line, " ")
		if v, err := strconv.ParseUint(strings.TrimPrefix(addr, "0x"), 16, 64); ok && err == nil && !strings.HasPrefix(name, ".init") {
			bases[name] = v // init sections are freed after loading, as kallsyms knows
		}
	}
	if bases[".text"] == 0 {
		t.Fatalf("no .text in /sys/module/evdev/sections: %v", bases)
	}
	syms, err := kernel.SymbolsFromELF(moduleFile(t, "evdev"), kernel.ELFOptions{Module: "evdev", SectionBase: func(s string) (uint64, bool) {
		b, ok := bases[s]
		return b, ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, line := range strings.Split(gsh(t, ctx, "grep -i ' t .*\\[evdev\\]' /proc/kallsyms"), "\n") {
		if f := strings.Fields(line); len(f) == 4 {
			want = append(want, f[0]+" "+f[2])
		}
	}
	var got []string
	for _, s := range syms.All() {
		got = append(got, fmt.Sprintf("%016x %s", s.Addr, s.Name))
	}
	sort.Strings(got)
	sort.Strings(want)
	if len(want) < 10 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("evdev.ko's symbols placed at its sections:\n%s\nkallsyms:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	t.Logf("%d evdev functions: ELF symbols placed at the module's sections equal kallsyms", len(got))
}

// landingPad reports whether code starts with endbr64 or the osp-nop3 an
// IBT kernel seals it into (6.12; 6.1 is built without IBT).
func landingPad(code []byte) bool {
	return bytes.HasPrefix(code, []byte{0xf3, 0x0f, 0x1e, 0xfa}) || bytes.HasPrefix(code, []byte{0x66, 0x0f, 0x1f, 0x00})
}

// Every function on the kernel's own kprobe blacklist (NOKPROBE_SYMBOL,
// read by the guest from debugfs) is refused by the running kerninstd.
// The daemon read the blacklist only when started without --kallsyms,
// and it is started with its default, /proc/kallsyms: in production the
// blacklist went unread, and notify_die, for one, took a probe.
func TestKprobeBlacklistRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var names []string
	for _, l := range strings.Split(gsh(t, ctx, "cat /sys/kernel/debug/kprobes/blacklist"), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			names = append(names, f[1])
		}
	}
	if len(names) < 100 {
		t.Fatalf("the guest's kprobe blacklist lists %d functions", len(names))
	}
	refused := 0
	for _, name := range names {
		r, err := client.Resolve(ctx, name)
		if err == nil {
			t.Errorf("%s is on the kprobe blacklist but resolves to %s+%#x (%s)", name, r.Function, r.Offset, r.SpliceClass)
			continue
		}
		refused++
	}
	t.Logf("%d functions of the kprobe blacklist, %d refused", len(names), refused)
	if _, stderr, status := gexec(t, ctx, "kinst", "count", "notify_die", "--duration", "1s"); status == 0 || !strings.Contains(stderr, "blacklist") {
		t.Errorf("kinst count notify_die: status %d, %q; want the kprobe blacklist's refusal", status, stderr)
	}
}
