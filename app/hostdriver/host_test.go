package hostdriver

import (
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func optNames(t *testing.T, c Config) (req, rec []string) {
	t.Helper()
	r, m := Missing(c)
	for _, o := range r {
		req = append(req, o.Name)
	}
	for _, o := range m {
		rec = append(rec, o.Name)
	}
	return req, rec
}

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		file     string
		req, rec []string
		sigForce bool
	}{
		{file: "config-full"},
		{file: "config-minimal-rt",
			req:      []string{"CONFIG_MODULE_UNLOAD", "CONFIG_KALLSYMS_ALL", "CONFIG_TASKS_RCU"},
			rec:      []string{"CONFIG_DEBUG_INFO_BTF", "CONFIG_UNWINDER_ORC", "CONFIG_KPROBES", "CONFIG_BPF_SYSCALL"},
			sigForce: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c, err := ParseConfig(f)
			if err != nil {
				t.Fatal(err)
			}
			req, rec := optNames(t, c)
			if !reflect.DeepEqual(req, tc.req) || !reflect.DeepEqual(rec, tc.rec) {
				t.Errorf("missing = %v, recommended = %v; want %v, %v", req, rec, tc.req, tc.rec)
			}
			if c.ModuleSigForced() != tc.sigForce {
				t.Errorf("ModuleSigForced = %v", c.ModuleSigForced())
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, in := range []string{"", "# nothing\n", "CONFIG_X86_64\n"} {
		if _, err := ParseConfig(strings.NewReader(in)); err == nil {
			t.Errorf("ParseConfig(%q) accepted it", in)
		}
	}
}

// fakeRoot makes a tree with the files Status reads.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, body := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if p == "/proc/config.gz" {
			f, err := os.Create(full)
			if err != nil {
				t.Fatal(err)
			}
			z := gzip.NewWriter(f)
			z.Write([]byte(body))
			z.Close()
			f.Close()
			continue
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestStatus(t *testing.T) {
	full, _ := os.ReadFile("testdata/config-full")
	rt, _ := os.ReadFile("testdata/config-minimal-rt")
	secureOn := "\x06\x00\x00\x00\x01"
	for _, tc := range []struct {
		name       string
		files      map[string]string
		loaded     bool
		lockdown   string
		secureBoot *bool
		config     string
		problems   []string // substrings, one per problem, in order
	}{
		{name: "ready", files: map[string]string{
			"/boot/config-6.1.0-test":                string(full),
			"/lib/modules/6.1.0-test/build/Makefile": "",
			"/proc/modules":                          "ext4 1 0 - Live 0x0\n",
		}, config: "/boot/config-6.1.0-test"},
		{name: "loaded", files: map[string]string{
			"/proc/config.gz": string(full),
			"/proc/modules":   "kerninst 40960 1 - Live 0xffffffffc0000000 (OE)\n",
			"/dev/kerninst":   "",
		}, loaded: true, config: "/proc/config.gz"},
		{name: "locked down, no headers, options missing", files: map[string]string{
			"/boot/config-6.1.0-test":       string(rt),
			"/sys/kernel/security/lockdown": "none [integrity] confidentiality\n",
			"/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e0a9e5b3b76c": secureOn,
		}, lockdown: "integrity", secureBoot: new(bool), config: "/boot/config-6.1.0-test",
			problems: []string{"CONFIG_MODULE_UNLOAD", "CONFIG_KALLSYMS_ALL", "CONFIG_TASKS_RCU", "CONFIG_MODULE_SIG_FORCE",
				"lockdown (integrity), from Secure Boot", "apt-get install linux-headers-6.1.0-test"}},
		{name: "no config", files: map[string]string{"/lib/modules/6.1.0-test/build/Makefile": ""},
			problems: []string{"no kernel configuration found"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, tc.files)
			h := &Host{Root: root, Release: "6.1.0-test", Socket: filepath.Join(root, "none.sock")}
			st := h.Status(context.Background())
			if tc.secureBoot != nil {
				*tc.secureBoot = true
			}
			if st.ModuleLoaded != tc.loaded || st.Device != tc.loaded || st.Lockdown != tc.lockdown ||
				!reflect.DeepEqual(st.SecureBoot, tc.secureBoot) || st.Config != root+tc.config && !(tc.config == "" && st.Config == "") {
				t.Errorf("status = %+v", st)
			}
			if st.Kerninstd || st.KerninstdPID != 0 {
				t.Errorf("a kerninstd answers in a fake tree: %+v", st)
			}
			if len(st.Problems) != len(tc.problems) {
				t.Fatalf("problems = %q, want %d of them", st.Problems, len(tc.problems))
			}
			for i, p := range tc.problems {
				if !strings.Contains(st.Problems[i], p) {
					t.Errorf("problem %d = %q, want it to say %q", i, st.Problems[i], p)
				}
			}
		})
	}
}

func TestRefusal(t *testing.T) {
	root := fakeRoot(t, map[string]string{
		"/sys/kernel/security/lockdown":     "[none] integrity confidentiality\n",
		"/proc/sys/kernel/modules_disabled": "0\n",
	})
	h := &Host{Root: root, Release: "6.1.0-test"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{unix.EKEYREJECTED, "signature"},
		{unix.ENOKEY, "signature"},
		{unix.EPERM, "CAP_SYS_MODULE"},
		{unix.ENOEXEC, "another kernel than 6.1.0-test"},
		{unix.ENOENT, "not exported"},
		{unix.ENOMEM, "cannot allocate memory"},
	} {
		if got := h.refusal(tc.err); !strings.Contains(got, tc.want) {
			t.Errorf("refusal(%v) = %q, want it to say %q", tc.err, got, tc.want)
		}
	}
	os.WriteFile(filepath.Join(root, "/proc/sys/kernel/modules_disabled"), []byte("1\n"), 0o644)
	if got := h.refusal(unix.EPERM); !strings.Contains(got, "modules_disabled=1") {
		t.Errorf("refusal(EPERM) with modules disabled = %q", got)
	}
	os.WriteFile(filepath.Join(root, "/proc/sys/kernel/modules_disabled"), []byte("0\n"), 0o644)
	os.WriteFile(filepath.Join(root, "/sys/kernel/security/lockdown"), []byte("none integrity [confidentiality]\n"), 0o644)
	if got := h.refusal(unix.EPERM); !strings.Contains(got, "lockdown (confidentiality)") {
		t.Errorf("refusal(EPERM) under lockdown = %q", got)
	}
}

func TestLoadErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Load refuses non-root before anything else")
	}
	rt, _ := os.ReadFile("testdata/config-minimal-rt")
	full, _ := os.ReadFile("testdata/config-full")
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		files map[string]string
		o     LoadOptions
		is    error
		says  string
	}{
		{name: "kernel lacks options", files: map[string]string{"/boot/config-6.1.0-test": string(rt), "/proc/modules": ""},
			is: ErrKernelLacks, says: "CONFIG_TASKS_RCU"},
		{name: "no headers", files: map[string]string{"/boot/config-6.1.0-test": string(full), "/proc/modules": ""},
			is: ErrNoHeaders, says: "linux-headers-6.1.0-test"},
		{name: "no module file", files: map[string]string{"/boot/config-6.1.0-test": string(full), "/proc/modules": ""},
			o: LoadOptions{Module: "/nonexistent/kerninst.ko"}, is: ErrModuleNotFound, says: "/nonexistent/kerninst.ko"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, tc.files)
			h := &Host{Root: root, Release: "6.1.0-test", CacheDir: t.TempDir()}
			err := h.Load(ctx, tc.o)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Load = %v, want %v saying %q", err, tc.is, tc.says)
			}
			if ents, _ := os.ReadDir(filepath.Join(h.CacheDir, "module")); len(ents) != 0 {
				t.Errorf("a failed load left %d builds in the cache", len(ents))
			}
		})
	}
}
