package process

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kinst/kinst/census"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/internal/parallel"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// Target is a running process under kinst's engine: its executable's and
// libraries' symbols placed where they are mapped, and a region (a
// Device and its engine) for each neighbourhood of the text it splices:
// a patch must be within a rel32 jump of its point, and the executable
// and the libraries are usually farther apart than that. Not safe for
// concurrent use.
type Target struct {
	PID    int
	Syms   *kernel.Symbols
	exe    string // the executable's module name (its base name)
	vdso   [2]uint64
	verdit *splice.Verdicts
	text   map[string][2]uint64 // module ("" for the executable) → its text's span
	// goModules are the modules Go built (splice.Facts.GoModules): shared
	// with every region's facts, written only by load.
	goModules map[string]bool
	paths     map[string]string // module → its file, through /proc/PID/root
	traps     *trapSet
	// readable is the demangled names of mangled symbols, by address
	// (made on first use).
	readable map[uint64]readable
	// loaded is every mapped file load has read (or failed to), by path.
	loaded map[string]bool
	// noTrap refuses trap splices with this reason (NoTraps).
	noTrap string
	// noPun: trap splices are int3s, not punned jumps (SetPuns).
	noPun bool
	// goRuntime: the executable is a Go program. Its runtime's async
	// preemption (SIGURG) looks up the pc a signal interrupts in the
	// executable's pc tables; a pc in a springboard slot, in the padding
	// after a Go function, is inside that function's range but past its
	// tables, and the runtime throws ("invalid runtime symbol table").
	// So the executable's own functions take no springboard splices.
	goRuntime bool

	regions  []*region
	stopNote func(string) // SetStopNote's
	byModule map[string]*region
	owner    map[*engine.Request]*region

	// image is /proc/PID/mem opened at Attach: it stays bound to the
	// address space of that moment, so it reads nothing once the process
	// has run exec (Exec).
	image *memFile
	// ifuncs: each module's indirect functions (moduleIfuncs), read on
	// first use.
	ifuncs map[string]*ifuncs
}

// mapping is one file-backed line of /proc/PID/maps.
type mapping struct {
	elfsym.Mapping
	path string
}

func readMaps(pid int) ([]mapping, [2]uint64, error) {
	var vdso [2]uint64
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, vdso, fmt.Errorf("%w: %d", ErrNoProcess, pid)
	}
	if err != nil {
		return nil, vdso, fmt.Errorf("%w: %d: %v", ErrNotTraceable, pid, err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		lo, hi, _ := strings.Cut(fs[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		off, _ := strconv.ParseUint(fs[2], 16, 64)
		if len(fs) >= 6 && fs[5] == "[vdso]" {
			vdso = [2]uint64{start, end}
		}
		if len(fs) < 6 || !strings.HasPrefix(fs[5], "/") {
			continue
		}
		out = append(out, mapping{Mapping: elfsym.Mapping{Start: start, End: end, Offset: off, Perms: fs[1]}, path: strings.Join(fs[5:], " ")})
	}
	return out, vdso, sc.Err()
}

// Attach reads pid's symbols. Nothing is written into the process until
// the first splice: then kinst's region is mapped near the text spliced.
func Attach(pid int) (*Target, error) {
	pid = ThreadGroup(pid)
	if kernelThread(pid) {
		return nil, fmt.Errorf("%w: %d is a kernel thread, with no user address space: its code is the kernel's (kinst count FUNC, without -p, or --pid %d to count only its calls)", ErrNotTraceable, pid, pid)
	}
	maps, vdso, err := readMaps(pid)
	if err != nil {
		return nil, err
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	t := &Target{PID: pid, exe: filepath.Base(exe), vdso: vdso, verdit: splice.NewVerdicts(), text: map[string][2]uint64{}, paths: map[string]string{}, goModules: map[string]bool{}, ifuncs: map[string]*ifuncs{},
		traps: &trapSet{}, byModule: map[string]*region{}, owner: map[*engine.Request]*region{}}
	if parts := t.load(maps); len(parts) == 0 {
		return nil, fmt.Errorf("process %d: no ELF file it maps has a symbol table (.symtab or .dynsym with functions; a stripped static binary has neither)", pid)
	} else {
		t.Syms = kernel.MergeSymbols(parts...)
	}
	if t.image, err = openMem(pid); err != nil {
		return nil, fmt.Errorf("%w: %d: %v", ErrNotTraceable, pid, err)
	}
	// Go's runtime installs its own SIGTRAP handler as it starts (after
	// the entry point -- CMD stops at), over kinst's.
	for _, name := range []string{"runtime.sigtrampgo", "runtime.sigtramp", "runtime.sigtramp.abi0"} {
		if len(t.Syms.Named(name)) > 0 {
			t.traps.refused = fmt.Errorf("%w: a Go program, whose runtime handles SIGTRAP itself: no trap splice", ErrUnsupported)
			t.goRuntime = true
		}
	}
	return t, nil
}

// load reads the symbols of the ELF files maps maps with text, those
// not loaded before, and returns them; t.text and t.paths gain them.
func (t *Target) load(maps []mapping) []*kernel.Symbols {
	byPath := map[string][]elfsym.Mapping{}
	var order []string
	for _, m := range maps {
		if byPath[m.path] == nil {
			order = append(order, m.path)
		}
		byPath[m.path] = append(byPath[m.path], m.Mapping)
	}
	var parts []*kernel.Symbols
	if t.loaded == nil {
		t.loaded = map[string]bool{}
	}
	for _, path := range order {
		if t.loaded[path] {
			continue
		}
		t.loaded[path] = true
		ms := byPath[path]
		var text *elfsym.Mapping
		for i := range ms {
			if strings.Contains(ms[i].Perms, "x") {
				text = &ms[i]
			}
		}
		if text == nil {
			continue
		}
		root := fmt.Sprintf("/proc/%d/root", t.PID)
		file := root + path
		f, err := elf.Open(file)
		if err != nil {
			continue // deleted, or not ELF
		}
		bias, err := elfsym.LoadSegments(f).MappingBias(*text, ms)
		symFile := symbolFile(f, root)
		isGo := f.Section(".go.buildinfo") != nil || f.Section(".gopclntab") != nil || f.Section(".note.go.buildid") != nil
		f.Close()
		if err != nil {
			continue
		}
		mod := filepath.Base(path)
		if mod == t.exe {
			mod = ""
		}
		o := kernel.ELFOptions{Module: mod, Slide: bias, Sizes: true}
		var s *kernel.Symbols
		if symFile != "" {
			s, err = kernel.SymbolsFromELF(symFile, o)
		}
		if symFile == "" || err != nil { // no debug file, or one kinst cannot read: the file's own table
			s, err = kernel.SymbolsFromELF(file, o)
		}
		if err != nil {
			continue
		}
		parts = append(parts, s)
		t.text[mod] = [2]uint64{text.Start, text.End}
		t.paths[mod] = file
		if isGo {
			t.goModules[mod] = true
		}
	}
	return parts
}

// TrapHazard is why a process's trap splice may kill it: the int3's
// SIGTRAP is synchronous, and the kernel forces the default action
// (death) on a thread that has SIGTRAP blocked, as threads do while they
// start (glibc's pthread_create, fork, posix_spawn) and wherever a
// program blocks all signals.
const TrapHazard = "only a trap splice (int3) fits here, and a thread that reaches one with SIGTRAP blocked (a starting thread, a fork, code that blocks every signal) dies"

// SetStopNote has note told, from another goroutine, when a thread of
// the process is slow to stop for a change of its text: one in vfork
// stops only once its child has run exec or exited, which may be never.
// Set it before the first request.
func (t *Target) SetStopNote(note func(string)) { t.stopNote = note }

// NoTraps refuses trap splices from now on, with reason why: a point
// only an int3 could take is refused instead (ResolveAs, which asks for
// a class, still gives one).
func (t *Target) NoTraps(why string) {
	t.noTrap = why
	for _, r := range t.regions {
		r.facts.NoTrap = why
		r.eng.SetNoTrap(why)
		r.dev.SetPunning(!t.noPun, why)
	}
}

// SetPuns says whether trap splices made from now on are punned jumps
// where one fits (the default) or int3s (to compare the two: kinst bench
// hit --user).
func (t *Target) SetPuns(on bool) {
	t.noPun = !on
	for _, r := range t.regions {
		r.facts.Pun = on
		r.eng.SetPunned(on)
		r.dev.SetPunning(on, t.noTrap)
	}
}

// Refresh loads the symbols of the files the process has mapped since
// Attach (or the last Refresh), a library dlopen has loaded, and returns
// their module names. Planning sees them from then on.
func (t *Target) Refresh() ([]string, error) {
	maps, _, err := readMaps(t.PID)
	if err != nil {
		return nil, err
	}
	parts := t.load(maps)
	if len(parts) == 0 {
		return nil, nil
	}
	var mods []string
	for _, p := range parts {
		if all := p.All(); len(all) > 0 {
			mods = append(mods, all[0].Module)
		}
	}
	t.Syms = kernel.MergeSymbols(append([]*kernel.Symbols{t.Syms}, parts...)...)
	t.readable = nil
	for _, r := range t.regions {
		r.facts.Symbols = t.Syms // covering runs must see the new functions' entries
	}
	return mods, nil
}

// kernelThread: pid is a kernel thread (PF_KTHREAD in /proc/PID/stat's
// flags, the ninth field).
func kernelThread(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&0x00200000 != 0
}

// Alive reports whether process pid exists and has not exited (a zombie
// has: its text is gone).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// ThreadGroup is the process a thread ID belongs to (its Tgid), so that
// -p takes a thread's ID as top and ps -L show it; pid itself when it is
// a process or cannot be read.
func ThreadGroup(pid int) int {
	st, err := readStatus(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return pid
	}
	if tgid, err := strconv.Atoi(st["Tgid"]); err == nil && tgid > 0 {
		return tgid
	}
	return pid
}

// symbolFile is the separate debug file (/usr/lib/debug/.build-id/…,
// under root, the process's root) of a file f stripped to its .dynsym,
// when one is installed: its .symtab names the static functions too (a
// Debian -dbg or -dbgsym package). "" when f has a .symtab of its own or
// no debug file is there.
func symbolFile(f *elf.File, root string) string {
	if f.Section(".symtab") != nil {
		return ""
	}
	id, err := elfsym.BuildID(f)
	if err != nil || id == "" {
		return ""
	}
	for _, dir := range []string{root, ""} { // the process's view, then kinst's
		p := dir + debuginfo.BuildIDPath(id)
		df, err := elf.Open(p)
		if err != nil {
			continue
		}
		did, _ := elfsym.BuildID(df)
		has := df.Section(".symtab") != nil
		df.Close()
		if did == id && has {
			return p
		}
	}
	return ""
}

// Exec reports whether the process has run exec since Attach, and the
// program it runs now: the address space kinst attached to, its splices
// and its regions, is gone, and the new program runs without them. (A
// process exiting loses its address space too, but then has no program.)
func (t *Target) Exec() (string, bool) {
	var b [1]byte
	var at uint64
	for _, span := range t.text { // any text the old program mapped
		at = span[0]
		break
	}
	if at == 0 || t.image == nil {
		return "", false
	}
	n, err := t.image.f.ReadAt(b[:], int64(at))
	if n == 1 || !errors.Is(err, io.EOF) {
		return "", false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", t.PID))
	if err != nil {
		return "", false
	}
	return exe, true
}

// Path is the file of module ("" the executable) as kinst opens it
// (through /proc/PID/root); "" for a module the process does not map.
func (t *Target) Path(module string) string { return t.paths[module] }

// Library is the module (file name) and path of the library the process
// maps that lib names ("libc" names libc.so.6), if one.
func (t *Target) Library(lib string) (module, path string, ok bool) {
	var mods []string
	for m := range t.paths {
		if m != "" && libMatches(lib, m) {
			mods = append(mods, m)
		}
	}
	if len(mods) == 0 {
		return "", "", false
	}
	slices.Sort(mods) // one answer, whichever order the map gives
	return mods[0], t.paths[mods[0]], true
}

// libMatches: "libc" names libc.so.6, "libc.so.6" too.
func libMatches(lib, base string) bool {
	return base == lib || strings.HasPrefix(base, lib+".") || strings.HasPrefix(base, lib+"-")
}

// LibraryInstalled reports whether a file a LIB: target could name
// (libMatches) is in the process's library directories: the standard
// ones, those /etc/ld.so.conf.d names and its LD_LIBRARY_PATH, under its
// root. A library neither loaded nor there is most likely misspelt; one
// dlopen takes by a path elsewhere is not found here.
func (t *Target) LibraryInstalled(lib string) bool {
	root := fmt.Sprintf("/proc/%d/root", t.PID)
	dirs := []string{"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib"}
	if confs, _ := filepath.Glob(root + "/etc/ld.so.conf.d/*.conf"); len(confs) > 0 {
		for _, c := range confs {
			b, _ := os.ReadFile(c)
			for _, l := range strings.Split(string(b), "\n") {
				if l = strings.TrimSpace(l); strings.HasPrefix(l, "/") {
					dirs = append(dirs, l)
				}
			}
		}
	}
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", t.PID)); err == nil {
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
				dirs = append(dirs, filepath.SplitList(v)...)
			}
		}
	}
	for _, d := range dirs {
		ents, _ := os.ReadDir(root + d)
		for _, e := range ents {
			if libMatches(lib, e.Name()) || libMatches("lib"+lib, e.Name()) {
				return true
			}
		}
	}
	return false
}

// ErrNoFunction is returned for a point naming no function of the
// process.
var ErrNoFunction = errors.New("no such function in the process")

// ErrNoLibrary is returned, with ErrNoFunction, for LIB:FUNC when the
// process maps no library LIB (yet: Refresh reads what dlopen loads).
var ErrNoLibrary = errors.New("the process maps no library")

// ErrIndirect is returned for a point at an indirect function's symbol
// (STT_GNU_IFUNC): the resolver, which runs once.
var ErrIndirect = errors.New("an indirect function")

// Resolve plans a point: FUNC, FUNC+0xOFF, FUNC:BLOCK, each optionally
// LIB: first (LIB:FUNC…), in the executable unless a library is named.
func (t *Target) Resolve(spec string) (*splice.Site, error) {
	f, p, err := t.plan(spec)
	if err != nil {
		return nil, err
	}
	s, err := f.Resolve(p)
	if err != nil {
		return nil, err
	}
	s.Point().Spec = spec
	return s, nil
}

// Func reads and plans the function spec names (FUNC or LIB:FUNC), for
// `kinst cfg -p`. It writes nothing.
func (t *Target) Func(spec string) (*splice.Func, error) {
	f, p, err := t.plan(spec)
	if err != nil {
		return nil, err
	}
	if p.HasOffset || p.HasBlock {
		return nil, fmt.Errorf("%s: name a function, not an instruction or block", spec)
	}
	return f, nil
}

// ResolveAs plans a point with a splice of class c, as the bench
// compares the classes at one function: a covering splice is planned
// without springboards, a trap splice at any instruction that takes a
// splice. An error when the instruction cannot take one of class c.
func (t *Target) ResolveAs(spec string, c springboard.Class) (*splice.Site, error) {
	f, p, err := t.plan(spec)
	if err != nil {
		return nil, err
	}
	if c != springboard.Springboard {
		r, err := t.region(f.Sym.Module)
		if err != nil {
			return nil, err
		}
		fx := *r.facts // the class asked for, a trap splice's included
		fx.NoTrap = ""
		g := fx.Func(f.Fn, t.verdit) // no springboards
		g.Sym, g.Ambiguous = f.Sym, f.Ambiguous
		f = g
	}
	s, err := f.Resolve(p)
	if err != nil {
		return nil, err
	}
	if c == springboard.Trap {
		s.PlanTrap()
	}
	if s.Class != c {
		return nil, fmt.Errorf("%s: a %s splice, not %s", spec, s.Class, c)
	}
	s.Point().Spec = spec
	return s, nil
}

// inModule: sym is in the executable (lib "") or in the library lib.
func inModule(sym kernel.Symbol, lib string) bool {
	return (lib == "" && sym.Module == "") || (lib != "" && libMatches(lib, sym.Module))
}

func where(lib string) string {
	if lib == "" {
		return "the executable"
	}
	return lib
}

// notFound is ErrNoFunction for name (a function or a glob) in lib, with
// what a user needs next: the libraries that do have it, the libraries
// the process maps when none is lib, or that the executable has no
// symbol table.
func (t *Target) notFound(name, lib string) error {
	err := fmt.Errorf("%w: %s in %s", ErrNoFunction, name, where(lib))
	if lib != "" {
		for mod := range t.text {
			if mod != "" && libMatches(lib, mod) {
				return err
			}
		}
		var mods []string
		for mod := range t.text {
			if mod != "" {
				mods = append(mods, mod)
			}
		}
		sort.Strings(mods)
		if len(mods) == 0 {
			return fmt.Errorf("%w: the process maps no library with a symbol table (a static executable has its libc in it: name the function without %s:)", err, lib)
		}
		return fmt.Errorf("%w: %w %s (it maps %s; one it loads later with dlopen can be named once it has, with -p PID)", err, ErrNoLibrary, lib, strings.Join(mods, ", "))
	}
	glob := strings.ContainsAny(name, "*?[")
	in := map[string]bool{}
	if glob {
		for _, sym := range t.Syms.All() {
			if sym.Module != "" && t.matches(name, sym) {
				in[sym.Module] = true
			}
		}
	} else {
		for mod := range t.text {
			if mod != "" && len(t.lookup(name, mod)) > 0 {
				in[mod] = true
			}
		}
	}
	var mods, named []string
	for mod := range in {
		mods = append(mods, mod)
	}
	sort.Strings(mods)
	for _, mod := range mods {
		named = append(named, libName(mod)+":"+name)
	}
	if _, ok := t.text[""]; !ok {
		// Said first: a stripped executable is why nothing of it
		// matched, whatever the libraries hold.
		err = fmt.Errorf("%w: the executable is stripped (no .symtab, no functions of its own in .dynsym, no debug file found)", err)
		if len(in) > 0 {
			return fmt.Errorf("%w; %s matches functions of %s: name them as %s", err, name, strings.Join(mods, ", "), strings.Join(named, " "))
		}
		return err
	}
	if len(in) > 0 {
		return fmt.Errorf("%w; it is in %s: name it %s", err, strings.Join(mods, ", "), strings.Join(named, " or "))
	}
	return err
}

// libName is the short name LIB: takes for a library file: libc for
// libc.so.6.
func libName(mod string) string {
	if i := strings.Index(mod, ".so"); i > 0 {
		return mod[:i]
	}
	return mod
}

// plan finds and plans the function a point names.
func (t *Target) plan(spec string) (*splice.Func, splice.Point, error) {
	lib, p, err := parsePoint(spec)
	if err != nil {
		return nil, splice.Point{}, err
	}
	syms := t.lookup(p.Function, lib)
	found := len(syms)
	if found == 0 {
		return nil, splice.Point{}, t.notFound(p.Function, lib)
	}
	// An IFUNC's symbol is its resolver: the code calls run is the
	// implementation the loader picked for this process.
	sym, err := t.running(syms[0])
	if err != nil {
		return nil, splice.Point{}, err
	}
	p.Function = sym.Name
	f, err := t.funcOf(sym, spec)
	if err != nil {
		return nil, splice.Point{}, err
	}
	f.Ambiguous = found - 1
	return f, p, nil
}

// funcOf reads and plans sym's function.
func (t *Target) funcOf(sym kernel.Symbol, spec string) (*splice.Func, error) {
	r, fn, err := t.decode(sym, spec)
	if err != nil {
		return nil, err
	}
	return t.planFunc(r, sym, fn), nil
}

// decode reads and decodes sym's function. Only its region's creation
// changes the Target: with the region there, several may run at once.
func (t *Target) decode(sym kernel.Symbol, spec string) (*region, *cfg.Function, error) {
	if sym.Indirect {
		return nil, nil, fmt.Errorf("%s: %w (STT_GNU_IFUNC): its symbol is the resolver that picks an implementation as the library loads, not the code calls run: name %s alone for the one this process runs",
			sym.Name, ErrIndirect, sym.Name)
	}
	if t.vdso[0] <= sym.Addr && sym.Addr < t.vdso[1] {
		return nil, nil, fmt.Errorf("%s is in the vDSO, which the kernel shares between processes: not spliced", spec)
	}
	end := t.Syms.End(sym)
	if sym.Size > 0 { // its code and padding, not what lies past them
		end = min(end, (sym.Addr+sym.Size+15)&^15)
	}
	if end <= sym.Addr || end-sym.Addr > 1<<20 {
		return nil, nil, fmt.Errorf("%s: function size unknown", sym.Name)
	}
	r, err := t.region(sym.Module)
	if err != nil {
		return nil, nil, err
	}
	code := make([]byte, end-sym.Addr)
	if err := r.eng.Text().Read(sym.Addr, code); err != nil {
		return nil, nil, err
	}
	fn, err := cfg.Decode(sym.Name, sym.Module, sym.Addr, code)
	if err != nil {
		return nil, nil, err
	}
	if sym.Size > 0 && sym.Size < end-sym.Addr {
		fn.TrimToSize(sym.Addr+sym.Size, end)
	}
	r.facts.Decoded.Add(sym, fn)
	return r, fn, nil
}

// planFunc is sym's function fn, decoded, as planning sees it.
func (t *Target) planFunc(r *region, sym kernel.Symbol, fn *cfg.Function) *splice.Func {
	f := r.facts.Func(fn, t.verdit)
	f.Sym = sym
	if !t.goRuntime || sym.Module != "" {
		f.UseSpringboards(r.eng.Springboards())
	}
	return f
}

// Callees lists root (FUNC or LIB:FUNC) and the functions it calls
// directly or by tail call, depth calls down (census.Callees' edges): the
// functions of `kinst cover --user --callees`. Calls through the PLT
// (into another library) and indirect calls are not followed.
func (t *Target) Callees(root string, depth int) ([]CoverTarget, error) {
	f, p, err := t.plan(root)
	if err != nil {
		return nil, err
	}
	if p.HasOffset || p.HasBlock {
		return nil, fmt.Errorf("callees of %s: name a function, not an instruction or block", root)
	}
	out := []CoverTarget{{Sym: f.Sym, Func: f}}
	census.WalkCallees(f, depth, func(callee uint64) *splice.Func {
		at := t.Syms.FunctionsAt(callee)
		if len(at) == 0 {
			return nil
		}
		cf, err := t.funcOf(at[0], at[0].Name)
		out = append(out, CoverTarget{Sym: at[0], Func: cf, Err: err})
		if err != nil {
			return nil
		}
		return cf
	})
	return out, nil
}

// CoverTarget is one function a cover target names: planned, or the
// reason it cannot be read.
type CoverTarget struct {
	Sym  kernel.Symbol
	Func *splice.Func
	Err  error
}

// EachFunc calls work with the planned function of every entry of fns
// that has one, on every CPU at once, each call with a cache of codegen's
// verdicts to itself (one goroutine uses a splice.Verdicts at a time).
// work must be safe to call on several goroutines at once, as
// cover.Set.Plan is; nothing else may plan on t meanwhile.
func (t *Target) EachFunc(fns []CoverTarget, work func(i int, f *splice.Func)) {
	free := make(chan *splice.Verdicts, runtime.GOMAXPROCS(0))
	free <- t.verdit
	parallel.For(len(fns), func(i int) {
		f := fns[i].Func
		if f == nil {
			return
		}
		var v *splice.Verdicts
		select {
		case v = <-free:
		default:
			v = splice.NewVerdicts() // at most one per goroutine of parallel.For
		}
		f.UseVerdicts(v)
		work(i, f)
		f.UseVerdicts(t.verdit)
		select {
		case free <- v:
		default:
		}
	})
}

// Functions lists the functions target names: FUNC, or a glob over
// function names (path.Match: "parse_*"), each optionally LIB: first, in
// the executable unless a library is named. A name that matches nothing
// is an error, and so is a function named alone that cannot be read; a
// glob lists what it cannot read with the reason.
func (t *Target) Functions(target string) ([]CoverTarget, error) {
	lib, pattern := SplitLib(target)
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("%s: bad pattern: %w", target, err)
	}
	glob := strings.ContainsAny(pattern, "*?[")
	var syms []kernel.Symbol
	seen := map[uint64]bool{}
	for _, sym := range t.Syms.All() {
		if !inModule(sym, lib) || !t.matches(pattern, sym) {
			continue
		}
		if !glob {
			// Named alone, an IFUNC is the implementation this process
			// runs (a glob lists the resolver, unreadable, beside the
			// implementations it matches by their own names).
			var err error
			if sym, err = t.running(sym); err != nil {
				return nil, err
			}
		}
		if seen[sym.Addr] {
			continue
		}
		seen[sym.Addr] = true
		syms = append(syms, sym)
		t.region(sym.Module) // made here, not by the decoders below; an error is theirs
	}
	// Decoding and splitting into blocks are most of the time and change
	// nothing shared: on every CPU. The splice.Func each gets shares
	// t.verdit, so EachFunc plans them on every CPU too.
	out := make([]CoverTarget, len(syms))
	parallel.For(len(syms), func(i int) {
		ct := &out[i]
		ct.Sym = syms[i]
		var r *region
		var fn *cfg.Function
		if r, fn, ct.Err = t.decode(syms[i], target); ct.Err == nil {
			ct.Func = t.planFunc(r, syms[i], fn)
		}
	})
	for _, ct := range out {
		if ct.Err != nil && !glob {
			return nil, ct.Err
		}
	}
	if len(out) == 0 {
		return nil, t.notFound(pattern, lib)
	}
	return out, nil
}

// Count installs a counter at each point, all or none; a request's count
// is Counter(r, 0).
func (t *Target) Count(owner string, sites []*splice.Site) ([]*engine.Request, error) {
	reqs, errs := t.AddEach(sites, engine.Spec{Owner: owner, Slots: 1, Snippet: engine.CounterSnippet})
	for i, err := range errs {
		if err != nil {
			var ok []*engine.Request
			for j, r := range reqs {
				if errs[j] == nil && r != nil {
					ok = append(ok, r)
				}
			}
			t.RemoveEach(ok)
			return nil, fmt.Errorf("%s: %w", sites[i].Point().Spec, err)
		}
	}
	return reqs, nil
}

// Abandon lets go of a process that has exited or run exec: nothing to
// restore, and nothing of the process is touched (a new program's SIGTRAP
// handler is its own).
func (t *Target) Abandon() {
	for _, r := range t.regions {
		r.dev.mu.Lock()
		r.dev.splices = map[uint32]*spliced{}
		r.dev.gone = true
		r.dev.mu.Unlock()
		r.dev.Close()
	}
	t.image.close()
}

// Timer times one function in the process: a counter of calls and a
// timer word entered at the entry and left at every exit (codegen's
// TimerEnter and TimerExit: rdtsc and one locked add each), read with
// metrics.TimerAcc as kerninstd reads its own.
type Timer struct {
	Function    string
	Entry       *splice.Site
	Exits       []*splice.Site
	Calls, Word int // counter slots
	reqs        []*engine.Request
	dev         *Device
	// Region: Function is a source line range's name, as asked (not a
	// function of the module, to qualify with it).
	Region bool
}

// Read reads the timer's calls and its timer word, with the process
// running.
func (tm *Timer) Read() (calls, word uint64) {
	return tm.dev.Counter(tm.Calls), tm.dev.Counter(tm.Word)
}

// Time attaches a timer to the function spec names (FUNC or LIB:FUNC):
// the exits first, so that no thread enters unseen and leaves counted;
// then the entry. On error nothing stays installed.
func (t *Target) Time(owner, spec string) (*Timer, error) {
	f, p, err := t.plan(spec)
	if err != nil {
		return nil, err
	}
	if p.HasOffset || p.HasBlock {
		return nil, fmt.Errorf("time %s: name a function, not an instruction", spec)
	}
	entry, err := f.Resolve(p)
	if err != nil {
		return nil, err
	}
	exits, err := f.Exits(entry)
	if err != nil {
		return nil, err
	}
	if len(exits) == 0 {
		return nil, fmt.Errorf("time %s: no exit the analysis can see (it never returns?)", spec)
	}
	for i, x := range exits {
		if x.Class == springboard.Trap && x != entry {
			exits[i] = earlierExit(f, x)
		}
	}
	// An exit moved onto the entry's instruction (a function of a lea
	// and a ret) is the entry's own site, which enters, then leaves: as
	// a site of its own, spliced first, its exit ran before the entry and
	// the timer measured the time between calls. Two exits moved onto
	// one instruction are one.
	var sites []splice.TimerSite
	entryIsExit := false
	seen := map[uint64]bool{}
	for _, x := range exits {
		if x.Addr() == entry.Addr() {
			entryIsExit = true
			continue
		}
		if seen[x.Addr()] {
			continue
		}
		seen[x.Addr()] = true
		sites = append(sites, splice.TimerSite{Site: x, Exit: true})
	}
	sites = append(sites, splice.TimerSite{Site: entry, Count: true, Enter: true, Exit: entryIsExit})
	tm, err := t.attachTimer(owner, f.Fn.Name, sites)
	if err != nil {
		return nil, fmt.Errorf("time %s: %w", spec, err)
	}
	return tm, nil
}

// TimeRegion attaches a timer to the code of function (FUNC or LIB:FUNC)
// at spans, offsets into it (a range of source lines,
// debuginfo.LineRangeSpans), named name: calls are counted where control
// first passes into the code, and the timer runs while a thread is in it
// (splice.Func.RegionSites). On error nothing stays installed.
func (t *Target) TimeRegion(owner, name, function string, spans []splice.Span) (*Timer, error) {
	f, p, err := t.plan(function)
	if err != nil {
		return nil, err
	}
	if p.HasOffset || p.HasBlock {
		return nil, fmt.Errorf("time %s: name its function, not an instruction (%s)", name, function)
	}
	sites, err := f.RegionSites(spans)
	if err != nil {
		return nil, fmt.Errorf("time %s: %w", name, err)
	}
	tm, err := t.attachTimer(owner, name, sites)
	if err != nil {
		return nil, fmt.Errorf("time %s: %w", name, err)
	}
	tm.Region = true
	return tm, nil
}

// attachTimer splices a timer's sites: those that only leave first, so
// that no thread enters unseen and leaves counted; the first request owns
// the two counter slots (calls, timer word). On error nothing stays
// installed.
func (t *Target) attachTimer(owner, name string, sites []splice.TimerSite) (*Timer, error) {
	sites = slices.Clone(sites)
	slices.SortStableFunc(sites, func(a, b splice.TimerSite) int {
		switch {
		case a.Enter == b.Enter:
			return 0
		case b.Enter:
			return -1
		}
		return 1
	})
	tm := &Timer{Function: name}
	var calls, word uint64
	for _, ts := range sites {
		if (ts.Enter || ts.Count) && tm.Entry == nil {
			tm.Entry = ts.Site
		}
		if ts.Exit {
			tm.Exits = append(tm.Exits, ts.Site)
		}
		n := 0
		if len(tm.reqs) == 0 {
			n = 2
		}
		build := func(c []uint64) codegen.Snippet {
			if n == 2 {
				calls, word = c[0], c[1]
			}
			var sn codegen.Seq
			if ts.Count {
				sn = append(sn, codegen.Counter{Addr: calls})
			}
			if ts.Enter {
				sn = append(sn, codegen.TimerEnter{Word: word})
			}
			if ts.Exit {
				sn = append(sn, codegen.TimerExit{Word: word})
			}
			if len(sn) == 1 {
				return sn[0]
			}
			return sn
		}
		r, err := t.Add(ts.Site, engine.Spec{Owner: owner, Slots: n, Snippet: build})
		if err != nil {
			t.Untime(tm)
			return nil, fmt.Errorf("%s: %w", ts.Site.Where(), err)
		}
		tm.reqs = append(tm.reqs, r)
	}
	if len(tm.reqs) == 0 {
		return nil, errors.New("no site to time")
	}
	tm.Calls, tm.Word = tm.reqs[0].Slots()[0], tm.reqs[0].Slots()[1]
	tm.dev = t.owner[tm.reqs[0]].dev
	return tm, nil
}

// earlierExit moves an exit that only a trap splice could reach (a
// 1-byte ret with no springboard slot near: an int3 would kill the
// process) to the nearest earlier instruction of its block that can be
// spliced otherwise, when nothing between them branches, calls or
// touches memory through %rsp but the stack adjustment an epilogue
// makes: leaving the timer there is leaving the function. Otherwise x.
func earlierExit(f *splice.Func, x *splice.Site) *splice.Site {
	xi := x.Index()
	for _, b := range f.Blocks {
		if xi < b.First || xi >= b.First+b.N {
			continue
		}
		for j := xi - 1; j >= b.First; j-- {
			in := f.Fn.Insns[j]
			text := in.String()
			if strings.HasPrefix(text, "call") || strings.HasPrefix(text, "j") || strings.HasPrefix(text, "push") {
				break
			}
			s, err := f.At(j)
			if err != nil {
				break
			}
			if s.Class != springboard.Trap {
				return s
			}
		}
	}
	return x
}

// Untime removes a timer: the entry first, then the exits.
func (t *Target) Untime(tm *Timer) error {
	rev := make([]*engine.Request, len(tm.reqs))
	for i, r := range tm.reqs {
		rev[len(tm.reqs)-1-i] = r
	}
	return errors.Join(t.RemoveEach(rev)...)
}

// Close removes every request and lets the process go; every byte of its
// text is as it was. The region holding the SIGTRAP handler goes last.
func (t *Target) Close() error {
	var errs []error
	var last *region
	for _, r := range t.regions {
		if t.traps.ownedBy(r.dev) {
			last = r
			continue
		}
		r.eng.Reclaim()
		errs = append(errs, r.dev.Close())
	}
	if last != nil {
		last.eng.Reclaim()
		errs = append(errs, last.dev.Close())
	}
	t.image.close()
	return errors.Join(errs...)
}
