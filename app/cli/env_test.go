package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/internal/buildinfo"
	"github.com/kinst/kinst/output"
)

func TestNewEnvRouting(t *testing.T) {
	var stdout, stderr bytes.Buffer
	for _, tc := range []struct {
		name      string
		s         Streams
		out, cmdO any
	}{
		{"text", Streams{Stdout: &stdout, Stderr: &stderr}, &stdout, &stdout},
		{"json on stdout", Streams{Stdout: &stdout, Stderr: &stderr, JSON: true}, &stdout, &stderr},
		{"-o -", Streams{Stdout: &stdout, Stderr: &stderr, Output: "-", JSON: true}, &stdout, &stderr},
	} {
		env, done, err := NewEnv(tc.s)
		if err != nil {
			t.Fatal(err)
		}
		if env.Out != tc.out || env.CmdOut != tc.cmdO || env.Err != &stderr || env.CmdErr != &stderr {
			t.Errorf("%s: report to %p, CMD's stdout to %p; want %p, %p", tc.name, env.Out, env.CmdOut, tc.out, tc.cmdO)
		}
		if err := done(nil); err != nil {
			t.Error(err)
		}
	}
	path := filepath.Join(t.TempDir(), "report")
	env, done, err := NewEnv(Streams{Stdout: &stdout, Stderr: &stderr, Output: path, JSON: true})
	if err != nil {
		t.Fatal(err)
	}
	if env.CmdOut != &stdout {
		t.Error("with -o, CMD's stdout left the terminal")
	}
	writeJSON(env.Out, map[string]int{"n": 1})
	if err := done(nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "{\n  \"n\": 1\n}\n" {
		t.Errorf("-o file holds %q", b)
	}
	if _, _, err := NewEnv(Streams{Output: filepath.Join(path, "sub")}); err == nil {
		t.Error("-o into a file as if a directory succeeded")
	}
	// A command that fails leaves the file of -o as it was.
	env, done, err = NewEnv(Streams{Stdout: &stdout, Stderr: &stderr, Output: path})
	if err != nil {
		t.Fatal(err)
	}
	env.Out.Write([]byte("half a report"))
	failed := errors.New("no such process")
	if err := done(failed); err != failed {
		t.Errorf("finish returned %v, want the command's error", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "{\n  \"n\": 1\n}\n" {
		t.Errorf("after a failed command the -o file holds %q", b)
	}
}

func TestStartProcess(t *testing.T) {
	for script, want := range map[string]int{"exit 0": 0, "exit 7": 7, "kill -TERM $$": 143} {
		var out bytes.Buffer
		p, err := StartProcess([]string{"sh", "-c", "echo hi; " + script}, strings.NewReader(""), &out, &out)
		if err != nil {
			t.Fatal(err)
		}
		if st := p.Wait(); st != want || out.String() != "hi\n" {
			t.Errorf("%s: status %d, output %q; want %d", script, st, out.String(), want)
		}
	}
	if _, err := StartProcess([]string{"/no/such/command"}, nil, nil, nil); err == nil {
		t.Error("started a command that does not exist")
	}
}

func TestVersionText(t *testing.T) {
	b := buildinfo.Build{Module: "v1.2.0", Revision: "0123456789abcdef", GoVersion: "go1.26.0"}
	for _, tc := range []struct {
		info api.Info
		err  error
		want string
	}{
		{api.Info{Version: "v1.2.0 go1.26.0", ABIVersion: 3, KernelRelease: "6.1.0-26-amd64"}, nil,
			"kinst v1.2.0 (0123456789ab) go1.26.0\ndriver ABI 3\nkerninstd at /run/kerninstd.sock: v1.2.0 go1.26.0\n  driver ABI 3, kernel 6.1.0-26-amd64\n"},
		{api.Info{ABIVersion: 2, KernelRelease: "6.1.0-26-amd64"}, nil,
			"kinst v1.2.0 (0123456789ab) go1.26.0\ndriver ABI 3\nkerninstd at /run/kerninstd.sock: (build not reported)\n  driver ABI 2 (this kinst speaks 3: update one of them), kernel 6.1.0-26-amd64\n"},
		{api.Info{Version: "v1.2.0 go1.26.0", ABIVersion: 3, KernelRelease: "6.1.0-26-amd64", DirtyFreeCounters: 2, StaleCounterWrites: 1}, nil,
			"kinst v1.2.0 (0123456789ab) go1.26.0\ndriver ABI 3\nkerninstd at /run/kerninstd.sock: v1.2.0 go1.26.0\n  driver ABI 3, kernel 6.1.0-26-amd64\n" +
				"  counter heap: 3 slot(s) written while free: a patch outlived its request (a kerninstd bug; its log names the slots)\n"},
		{api.Info{}, errors.New("connection refused"),
			"kinst v1.2.0 (0123456789ab) go1.26.0\ndriver ABI 3\nkerninstd: not answering: connection refused\n"},
	} {
		var out bytes.Buffer
		if err := writeVersion(&out, versionReport(b, 3, "/run/kerninstd.sock", tc.info, tc.err), false); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("got\n%s\nwant\n%s", out.String(), tc.want)
		}
	}
}

func TestVMStatusReport(t *testing.T) {
	st := output.VMStatus{KernelRelease: "6.1.0-26-amd64", Accel: "tcg", Kerninstd: "127.0.0.1:7070", Agent: "127.0.0.1:7071",
		SerialLog: "/c/vm/serial.log", QMP: "/c/vm/qmp.sock"}
	var text, js bytes.Buffer
	if err := writeVMStatus(&text, st, false); err != nil {
		t.Fatal(err)
	}
	want := "kernel_release  6.1.0-26-amd64\naccel           tcg\nkerninstd       127.0.0.1:7070\nagent           127.0.0.1:7071\nserial_log      /c/vm/serial.log\nqmp             /c/vm/qmp.sock\n"
	if text.String() != want {
		t.Errorf("text:\n%s\nwant\n%s", text.String(), want)
	}
	writeVMStatus(&js, st, true)
	// The keys in the order the map it replaced printed them.
	if want := `{"accel":"tcg","agent":"127.0.0.1:7071","kernel_release":"6.1.0-26-amd64","kerninstd":"127.0.0.1:7070","qmp":"/c/vm/qmp.sock","serial_log":"/c/vm/serial.log"}` + "\n"; js.String() != want {
		t.Errorf("json: %s", js.String())
	}
}
