// Package debuginfotest is the oracle of the source-line tests: binutils'
// addr2line, run once over many addresses.
package debuginfotest

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"testing"
)

// Addr2line is `addr2line -e file` of each address: "file:line", without
// the " (discriminator N)" addr2line appends to some lines. It skips the
// test when addr2line is not installed.
func Addr2line(t testing.TB, file string, addrs []uint64) []string {
	t.Helper()
	return Addr2lineIn(t, file, "", addrs)
}

// Addr2lineIn is Addr2line of offsets into one section of a relocatable
// file (addr2line -j SECTION), or of addresses when section is "".
func Addr2lineIn(t testing.TB, file, section string, addrs []uint64) []string {
	t.Helper()
	in := addrInput(t, addrs)
	args := []string{"-e", file}
	if section != "" {
		args = append(args, "-j", section)
	}
	cmd := exec.Command("addr2line", args...)
	cmd.Stdin = in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("addr2line -e %s: %v", file, err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if i := strings.Index(l, " (discriminator"); i >= 0 {
			l = l[:i]
		}
		lines = append(lines, l)
	}
	if len(lines) != len(addrs) {
		t.Fatalf("addr2line: %d lines for %d addresses", len(lines), len(addrs))
	}
	return lines
}

// addrInput is addr2line's input, one address a line; it skips the test
// when addr2line is not installed.
func addrInput(t testing.TB, addrs []uint64) *bytes.Buffer {
	t.Helper()
	if _, err := exec.LookPath("addr2line"); err != nil {
		t.Skip("addr2line is not installed (binutils)")
	}
	var in bytes.Buffer
	for _, a := range addrs {
		fmt.Fprintf(&in, "%#x\n", a)
	}
	return &in
}

// Unknown reports addr2line's answer for an address of no line.
func Unknown(line string) bool {
	return strings.HasPrefix(line, "??") || strings.HasSuffix(line, ":0") || strings.HasSuffix(line, ":?")
}

// Addr2lineChains is `addr2line -a -i -e file` of each address: its line,
// then the line of each call site it was inlined at, outward (without
// discriminators).
func Addr2lineChains(t testing.TB, file string, addrs []uint64) [][]string {
	t.Helper()
	in := addrInput(t, addrs)
	cmd := exec.Command("addr2line", "-a", "-i", "-e", file)
	cmd.Stdin = in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("addr2line -a -i -e %s: %v", file, err)
	}
	var chains [][]string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "0x") {
			chains = append(chains, nil)
			continue
		}
		if len(chains) == 0 {
			t.Fatalf("addr2line -a: %q before an address", l)
		}
		if i := strings.Index(l, " (discriminator"); i >= 0 {
			l = l[:i]
		}
		chains[len(chains)-1] = append(chains[len(chains)-1], l)
	}
	if len(chains) != len(addrs) {
		t.Fatalf("addr2line: %d chains for %d addresses", len(chains), len(addrs))
	}
	return chains
}

// EmptyRows are the rows of binutils' decoded line table of file
// (readelf --debug-dump=decodedline) that cover no byte, the next row
// being at the same address: by "base:line" (the source file's base
// name), their addresses. addr2line never reports their lines; gdb's
// breakpoints on them go there. It skips the test when readelf is not
// installed.
func EmptyRows(t testing.TB, file string) map[string][]uint64 {
	t.Helper()
	if _, err := exec.LookPath("readelf"); err != nil {
		t.Skip("readelf is not installed (binutils)")
	}
	out, err := exec.Command("readelf", "-W", "--debug-dump=decodedline", file).Output()
	if err != nil {
		t.Fatalf("readelf --debug-dump=decodedline %s: %v", file, err)
	}
	rows := map[string][]uint64{}
	var prevKey string // "" after an end of sequence
	var prevAddr uint64
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || !strings.HasPrefix(f[2], "0x") {
			continue // a header, a unit's name
		}
		var addr uint64
		if _, err := fmt.Sscanf(f[2], "0x%x", &addr); err != nil {
			continue
		}
		if prevKey != "" && addr == prevAddr {
			rows[prevKey] = append(rows[prevKey], addr)
		}
		prevKey, prevAddr = "", addr
		if f[1] != "-" { // "-": the end of a sequence
			prevKey = path.Base(f[0]) + ":" + f[1]
		}
	}
	return rows
}
