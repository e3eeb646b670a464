package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/procsession"
)

// CoverProcess is `kinst cover --user -p PID TARGET…` (or -p 0 -- CMD): a
// hit-flag probe at every block of the targets' functions in a user
// process, each removed once it has run: the kernel's coverage session,
// hosted by kinst over the process (procsession.Host). Source lines
// (--lcov, --file, each block's lines) come from the executable's own
// DWARF when it has some, and a library's from its DWARF or its separate
// debug file.
func CoverProcess(ctx context.Context, pid int, o CoverOptions, env Env) (int, error) {
	if err := checkCoverProcess(&o); err != nil {
		return 2, err
	}
	t, err := processTarget(pid, o.Command, env, procsession.Options{CoverTraps: o.Trap})
	if err != nil {
		return 1, err
	}
	if err := fileTargetsOfProcess(&o, t.proc.pid, env); err != nil {
		t.proc.abort()
		return 1, err
	}
	req := api.SessionRequest{Cover: o.Targets, CoverCallees: o.Callees, CoverDepth: o.Depth, CoverAllBlocks: o.AllBlocks}
	sess, err := t.host.CreateSession(ctx, req)
	if err != nil {
		t.proc.abort()
		return 1, fmt.Errorf("cover --user: %w", err)
	}
	return coverOn(ctx, t, sess, o, env, kernelDebug{})
}

// checkCoverProcess checks `kinst cover --user`'s options.
func checkCoverProcess(o *CoverOptions) error {
	if len(o.Modules) > 0 || o.Filter != (api.Filter{}) || o.Name != "" || o.TTL != 0 || o.Debug.Vmlinux != "" {
		return errors.New("cover --user: --module, --comm, --name, --ttl and --vmlinux are for the kernel")
	}
	if len(o.Targets) == 0 && len(o.Files) == 0 && len(o.Callees) == 0 {
		return errors.New("cover --user: name at least one function or glob (parse_*, libc:str*), --callees FUNC or --file")
	}
	if o.Depth < 1 {
		o.Depth = 1
	}
	for _, path := range []string{o.SVG, o.Lcov} {
		if err := checkOutputDir("cover", path); err != nil {
			return err
		}
	}
	_, err := parseLineRange(*o)
	return err
}

// fileTargetsOfProcess adds to o's targets the functions of its --file
// sources, from the executable's DWARF, which --lcov needs too.
func fileTargetsOfProcess(o *CoverOptions, pid int, env Env) error {
	if o.Lcov == "" && len(o.Files) == 0 {
		return nil
	}
	d, err := debuginfo.Open(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return fmt.Errorf("--lcov and --file need the executable's DWARF (build it with -g): %w", err)
	}
	defer d.Close()
	d.PlaceMergedLines()
	return fileTargets(o, func(mod string) (*debuginfo.File, error) {
		if mod != "" {
			return nil, fmt.Errorf("a module's source file (%s:…) is the kernel's", mod)
		}
		return d, nil
	}, env)
}

// writeRefusals prints the most common reasons blocks were refused, at
// most top of them, with how many blocks each (the report has every
// block's own).
func writeRefusals(w io.Writer, rep *api.CoverReport, top int) {
	why := map[string]int{}
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.Refused != nil {
				why[refusalKind(*b.Refused)]++
			}
		}
	}
	reasons := make([]string, 0, len(why))
	for r := range why {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if why[reasons[i]] != why[reasons[j]] {
			return why[reasons[i]] > why[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	for i, r := range reasons {
		if i == top {
			fmt.Fprintf(w, "kinst:   … %d more kinds of reason (the report names each block's)\n", len(reasons)-top)
			break
		}
		fmt.Fprintf(w, "kinst:   %d blocks refused: %s\n", why[r], r)
	}
}

// blockInsn is an instruction a block refusal names before its reason
// ("+0x12 retq: "): the same reason at another offset is the same kind.
var blockInsn = regexp.MustCompile(`(^|; )\+0x[0-9a-f]+ .*?: `)

// spliceSite is where a refusal of one instruction names it ("splice
// FUNC+0xOFF: "), and runAddr an address inside a reason (" at 0x7f…").
var (
	spliceSite = regexp.MustCompile(`^splice \S+\+0x[0-9a-f]+: `)
	runAddr    = regexp.MustCompile(` at 0x[0-9a-f]+`)
)

// refusalKind is a block's refusal without where it is: the offsets and
// instructions of "no instruction of the block may be spliced: +0xOFF
// INSN: WHY; …" (each reason once per block already), the FUNC+0xOFF of
// "splice FUNC+0xOFF: WHY", and addresses in a reason, so the summary
// counts blocks by why, not by where. (Counted by where, the 180
// trap-only blocks of python3 were 180 kinds of one block each.)
func refusalKind(why string) string {
	why = runAddr.ReplaceAllString(why, "")
	if at := spliceSite.FindStringIndex(why); at != nil {
		return "splice: " + why[at[1]:]
	}
	const none = "no instruction of the block may be spliced: "
	rest, ok := strings.CutPrefix(why, none)
	if !ok {
		return why
	}
	return none + blockInsn.ReplaceAllString(rest, "$1")
}
