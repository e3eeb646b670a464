package kernel

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// KprobeBlacklistPath is where a live kernel lists the functions kprobes
// may not probe (NOKPROBE_SYMBOL, and every function of the sections the
// kernel itself refuses: entry, noinstr, irqentry, kprobes text). It needs
// debugfs mounted; the addresses read as zero unless the reader may see
// kernel addresses (root).
const KprobeBlacklistPath = "/sys/kernel/debug/kprobes/blacklist"

// KprobeBlacklist is the start addresses of the functions the kernel
// forbids kprobes in. The kernel marks functions that run while a probe
// is being handled (the int3 path, the notifier chain, preemption and RCU
// bookkeeping) this way: a splice there could recurse or never return.
type KprobeBlacklist map[uint64]bool

// ReadKprobeBlacklist reads the kernel's kprobe blacklist file
// (KprobeBlacklistPath): lines "0xSTART-0xEND\tNAME [MODULE]". Addresses
// shown as zero (the reader may not see kernel addresses) are an error:
// the list would name nothing.
func ReadKprobeBlacklist(path string) (KprobeBlacklist, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseKprobeBlacklist(f)
}

// ParseKprobeBlacklist parses the blacklist's text (see
// ReadKprobeBlacklist).
func ParseKprobeBlacklist(r io.Reader) (KprobeBlacklist, error) {
	bl := KprobeBlacklist{}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		rng, _, _ := strings.Cut(line, "\t")
		lo, _, ok := strings.Cut(strings.Fields(rng)[0], "-")
		if !ok {
			return nil, fmt.Errorf("kprobe blacklist line %d: %q is not START-END", n, line)
		}
		a, err := strconv.ParseUint(strings.TrimPrefix(lo, "0x"), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("kprobe blacklist line %d: %w", n, err)
		}
		bl[a] = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(bl) == 1 && bl[0] {
		return nil, fmt.Errorf("kprobe blacklist: every address reads as 0 (kernel addresses hidden from this reader)")
	}
	return bl, nil
}
