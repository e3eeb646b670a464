package cli

import "testing"

func TestSparkline(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want string
	}{
		{nil, ""},
		{[]float64{0, 0}, "▁▁"},
		{[]float64{0, 1, 2, 4, 8}, "▁▁▂▄█"},
		{[]float64{5, 5}, "██"},
	} {
		if got := Sparkline(tc.in); got != tc.want {
			t.Errorf("Sparkline(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFmtNS(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 512: "512ns", 1500: "1.50µs", 2.5e6: "2.50ms", 1.25e9: "1.250s"} {
		if got := fmtNS(in); got != want {
			t.Errorf("fmtNS(%g) = %q, want %q", in, got, want)
		}
	}
}

func TestSkipCallee(t *testing.T) {
	for name, skip := range map[string]bool{"__fentry__": true, "__x86_indirect_thunk_rax": true, "do_truncate": false, "path_openat": false} {
		if skipCallee(name) != skip {
			t.Errorf("skipCallee(%s) = %v", name, !skip)
		}
	}
}
