package splice

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Point is a parsed instrumentation point: FUNC, FUNC+OFF (an
// instruction) or FUNC:BLOCK (a basic block by its index in the function's
// CFG, as kinst cfg numbers them), where FUNC may be a classic Solaris
// name from the KernInst paper.
type Point struct {
	Spec     string // as the user wrote it
	Function string // Linux function name, after classic-name mapping
	// Module is the kernel module whose function it is (MODULE:FUNC): a
	// module's static function may share its name with the core
	// kernel's or another module's. "" takes the core kernel's first.
	Module    string
	Offset    uint64
	Block     int
	Classic   *ClassicName // set when Spec named a classic function
	HasOffset bool
	HasBlock  bool
}

// ClassicName maps a function the KernInst paper instrumented on Solaris
// 2.5.1 to the closest Linux 6.1 function.
type ClassicName struct {
	Solaris string `json:"solaris"`
	Linux   string `json:"linux"`
	Why     string `json:"why"`
}

// Classic lists the paper's function names and their Linux counterparts.
// Where Solaris had a file-system-specific routine (ufs_*), the ext4 one is
// named, as ext4 is what a Debian system runs; an initramfs (tmpfs) never
// calls those.
var Classic = map[string]ClassicName{
	"lookuppn":    {"lookuppn", "filename_lookup", "path name to inode lookup (stat, access, chdir, …)"},
	"copen":       {"copen", "do_sys_openat2", "common code of open/openat/creat"},
	"vn_open":     {"vn_open", "do_filp_open", "open a file by path name"},
	"vn_create":   {"vn_create", "vfs_create", "create a file in a directory through the VFS"},
	"ufs_create":  {"ufs_create", "ext4_create", "the native file system's create"},
	"ufs_lookup":  {"ufs_lookup", "ext4_lookup", "the native file system's directory lookup"},
	"ufs_itrunc":  {"ufs_itrunc", "ext4_truncate", "the native file system's truncate"},
	"falloc":      {"falloc", "alloc_empty_file", "allocate a struct file"},
	"mutex_enter": {"mutex_enter", "mutex_lock", "acquire a kernel mutex"},
}

// ClassicNames returns the classic names in sorted order.
func ClassicNames() []string {
	n := make([]string, 0, len(Classic))
	for k := range Classic {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// ParsePoint parses "FUNC", "FUNC+OFF" (OFF in hex with 0x, or decimal)
// or "FUNC:BLOCK" (a decimal block index).
func ParsePoint(spec string) (Point, error) {
	p := Point{Spec: spec}
	// MODULE:FUNC…: what follows the colon is a name, not a block.
	if i := strings.IndexByte(spec, ':'); i > 0 && i+1 < len(spec) && isNameStart(spec[i+1]) {
		p.Module, spec = spec[:i], spec[i+1:]
		if strings.ContainsAny(p.Module, " \t/+") {
			return Point{}, fmt.Errorf("point %q: bad module %q (want MODULE:FUNC)", p.Spec, p.Module)
		}
	}
	name := spec
	if i := strings.IndexByte(spec, ':'); i >= 0 {
		name = spec[:i]
		b, err := strconv.ParseUint(spec[i+1:], 10, 31)
		if err != nil {
			return Point{}, fmt.Errorf("point %q: bad block %q (want FUNC:N, N a block index from kinst cfg FUNC)", spec, spec[i+1:])
		}
		p.Block, p.HasBlock = int(b), true
	} else if i := strings.IndexByte(spec, '+'); i >= 0 {
		name = spec[:i]
		off, err := strconv.ParseUint(spec[i+1:], 0, 64)
		if err != nil {
			return Point{}, fmt.Errorf("point %q: bad offset %q (want FUNC+0xOFF)", spec, spec[i+1:])
		}
		p.Offset, p.HasOffset = off, true
	}
	if name == "" || strings.ContainsAny(name, " \t/") {
		return Point{}, fmt.Errorf("point %q: want FUNC, FUNC+0xOFF or FUNC:BLOCK", spec)
	}
	p.Function = name
	if c, ok := Classic[name]; ok && p.Module == "" {
		p.Function = c.Linux
		p.Classic = &c
	}
	return p, nil
}

// isNameStart: c may start a C identifier.
func isNameStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}
