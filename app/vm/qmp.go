package vm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// QMP runs one QEMU Machine Protocol command and returns its "return".
func (in *Instance) QMP(cmd string, args any) (json.RawMessage, error) {
	conn, err := net.DialTimeout("unix", in.st.QMP, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	call := func(cmd string, args any) (json.RawMessage, error) {
		req := map[string]any{"execute": cmd}
		if args != nil {
			req["arguments"] = args
		}
		b, _ := json.Marshal(req)
		if _, err := conn.Write(append(b, '\n')); err != nil {
			return nil, err
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, err
			}
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Class string `json:"class"`
					Desc  string `json:"desc"`
				} `json:"error"`
				Event string `json:"event"`
			}
			if err := json.Unmarshal(line, &resp); err != nil {
				return nil, fmt.Errorf("qmp reply %q: %w", line, err)
			}
			switch {
			case resp.Event != "":
				continue
			case resp.Error != nil:
				return nil, fmt.Errorf("qmp %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
			}
			return resp.Return, nil
		}
	}
	if _, err := call("qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return call(cmd, args)
}

// DumpFormats are the dump-guest-memory formats Dump accepts.
var DumpFormats = []string{"elf", "kdump-zlib", "kdump-lzo", "kdump-snappy"}

// Dump writes the guest's memory and CPU state to path with QMP
// dump-guest-memory (no paging: physical memory, with the CPU notes and
// the guest's VMCOREINFO). QEMU writes the file itself, so the path is
// made absolute. format is one of DumpFormats; QEMU 7.2 writes the kdump
// ones in makedumpfile's flattened form.
func (in *Instance) Dump(path, format string) error {
	if !slices.Contains(DumpFormats, format) {
		return fmt.Errorf("dump format %q: want one of %s", format, strings.Join(DumpFormats, ", "))
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	_, err = in.QMP("dump-guest-memory", map[string]any{"paging": false, "protocol": "file:" + abs, "format": format})
	return err
}

// HMP runs a human monitor command through QMP.
func (in *Instance) HMP(cmd string) (string, error) {
	raw, err := in.QMP("human-monitor-command", map[string]string{"command-line": cmd})
	if err != nil {
		return "", err
	}
	var s string
	return s, json.Unmarshal(raw, &s)
}

// SaveVirt writes n bytes of guest virtual memory from addr, as vCPU 0's
// page tables map them, to the host file path (QMP memsave): QEMU's own
// view, for reading megabytes (the whole kernel text) where ReadVirt's
// monitor text would take minutes.
func (in *Instance) SaveVirt(addr uint64, n int, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	// val is a QAPI int (int64): a kernel address goes as a negative number.
	_, err = in.QMP("memsave", map[string]any{"val": int64(addr), "size": n, "filename": abs, "cpu-index": 0})
	return err
}

// ReadVirt reads guest virtual memory as QEMU sees it, through the page
// tables of the monitor's current vCPU: an oracle independent of the
// guest's kernel and of our driver.
func (in *Instance) ReadVirt(addr uint64, n int) ([]byte, error) {
	if n <= 0 || n > 4096 {
		return nil, fmt.Errorf("ReadVirt: %d bytes (want 1..4096)", n)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		out, err := in.HMP(fmt.Sprintf("x /%dxb %#x", n, addr))
		if err == nil {
			var b []byte
			if b, err = parseHMPBytes(out, addr); err == nil && len(b) == n {
				return b, nil
			} else if err == nil {
				err = fmt.Errorf("monitor returned %d bytes, want %d: %q", len(b), n, out)
			}
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	return nil, lastErr
}

// parseHMPBytes parses the output of "x /Nxb ADDR":
//
//	ffffffff81000000: 0x48 0x8d 0x25 0x51 0x3f 0x60 0x01 0x48
func parseHMPBytes(out string, addr uint64) ([]byte, error) {
	var b []byte
	for _, line := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		at, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, errors.New("monitor: " + strings.TrimSpace(line))
		}
		a, err := strconv.ParseUint(strings.TrimSpace(at), 16, 64)
		if err != nil || a != addr+uint64(len(b)) {
			return nil, fmt.Errorf("monitor line %q: unexpected address", line)
		}
		for _, f := range strings.Fields(rest) {
			v, err := strconv.ParseUint(strings.TrimPrefix(f, "0x"), 16, 8)
			if err != nil {
				return nil, fmt.Errorf("monitor line %q: %v", line, err)
			}
			b = append(b, byte(v))
		}
	}
	return b, nil
}
