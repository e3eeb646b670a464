package cfg

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/arch/x86/x86asm"
)

// Stats is the structural census of a running kernel: the paper's
// Figure 2 for this kernel, plus what the analysis could not resolve and
// how every instruction could be spliced.
type Stats struct {
	Modules          int            `json:"modules"` // loaded modules (the core kernel not counted)
	Functions        int            `json:"functions"`
	BasicBlocks      int            `json:"basic_blocks"`
	Instructions     int            `json:"instructions"`
	InstructionBytes int            `json:"instruction_bytes"`
	PaddingBytes     int            `json:"padding_bytes"`      // unreachable nop/int3 runs: springboard space
	UnanalysableJump int            `json:"unanalysable_jumps"` // register/memory jumps left unresolved
	JumpTables       int            `json:"jump_tables"`        // resolved jump tables (not yet attempted: 0)
	TailCalls        int            `json:"tail_calls"`
	Returns          int            `json:"returns"`
	Truncated        int            `json:"truncated_functions"` // decoding stopped at an unknown encoding
	FreedInit        int            `json:"freed_init_functions"`
	Unreadable       int            `json:"unreadable_functions"`
	SpliceClasses    map[string]int `json:"splice_classes"` // direct, springboard, trap, refused
	Seconds          float64        `json:"seconds"`
}

// AnalyzeOptions tune AnalyzeKernel.
type AnalyzeOptions struct {
	DriverModule string
	// Relocatable says whether a patch can reproduce an instruction;
	// those it cannot are counted as refused. Nil: all can.
	Relocatable func(addr uint64, inst x86asm.Inst, b []byte) error
	// Prototypes make call liveness precise; nil is conservative.
	Prototypes Prototypes
	// Progress is called now and then with functions done and total.
	Progress func(done, total int)
	Workers  int // default GOMAXPROCS
}

// prefetchReader serves reads inside one large buffer (the core kernel's
// text, read in a few big chunks) and passes others through.
type prefetchReader struct {
	TextReader
	base uint64
	buf  []byte
}

func (p *prefetchReader) Read(addr uint64, b []byte) error {
	if addr >= p.base && addr+uint64(len(b)) <= p.base+uint64(len(p.buf)) {
		copy(b, p.buf[addr-p.base:])
		return nil
	}
	return p.TextReader.Read(addr, b)
}

// prefetchChunk is the size of one read of core kernel text.
const prefetchChunk = 1 << 20

// AnalyzeKernel decodes every function of the kernel and its modules from
// the live text, splits it into blocks, computes block liveness, and
// returns the census. Functions are analysed in
// parallel; one function's failure is counted, not fatal.
func AnalyzeKernel(ctx context.Context, r TextReader, syms *Symbols, o AnalyzeOptions) (Stats, error) {
	start := time.Now()
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if lo, ok1 := syms.marker("_stext"); ok1 {
		if hi, ok2 := syms.marker("_etext"); ok2 && hi > lo {
			buf := make([]byte, hi-lo)
			ok := true
			for off := 0; off < len(buf) && ok; off += prefetchChunk {
				ok = r.Read(lo+uint64(off), buf[off:min(off+prefetchChunk, len(buf))]) == nil
			}
			if ok {
				r = &prefetchReader{TextReader: r, base: lo, buf: buf}
			}
		}
	}
	// One function per start address (aliases share one).
	var fns []Symbol
	modules := map[string]bool{}
	for i, s := range syms.byAddr {
		if i > 0 && syms.byAddr[i-1].Addr == s.Addr {
			continue
		}
		fns = append(fns, s)
		if s.Module != "" {
			modules[s.Module] = true
		}
	}
	st := Stats{Modules: len(modules), SpliceClasses: map[string]int{}}
	var mu sync.Mutex
	var done atomic.Int64
	work := make(chan Symbol, 256)
	var wg sync.WaitGroup
	for w := 0; w < o.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := Stats{SpliceClasses: map[string]int{}}
			for s := range work {
				analyzeOne(r, syms, s, o, &local)
				if n := done.Add(1); o.Progress != nil && n%2000 == 0 {
					o.Progress(int(n), len(fns))
				}
			}
			mu.Lock()
			st.add(&local)
			mu.Unlock()
		}()
	}
	for _, s := range fns {
		if ctx.Err() != nil {
			break
		}
		work <- s
	}
	close(work)
	wg.Wait()
	if o.Progress != nil {
		o.Progress(int(done.Load()), len(fns))
	}
	st.Seconds = time.Since(start).Seconds()
	return st, ctx.Err()
}

func analyzeOne(r TextReader, syms *Symbols, s Symbol, o AnalyzeOptions, st *Stats) {
	fn, err := ReadFunction(r, syms, s)
	switch {
	case err == nil:
	case errors.Is(err, ErrFreedInit):
		st.FreedInit++
		return
	default:
		st.Unreadable++
		return
	}
	st.Functions++
	if fn.Truncated {
		st.Truncated++
	}
	names := syms.Names()
	fnWhy := syms.FunctionNoSplice(fn, o.DriverModule)
	blocks := fn.Blocks(names)
	// Liveness is part of the analysis (its block live-in sets are what
	// splicing consults), so the census pays for it too.
	fn.Live(blocks, names, o.Prototypes)
	for _, b := range blocks {
		n := 0
		for i := b.First; i < b.First+b.N; i++ {
			n += fn.Insns[i].Len()
		}
		if b.Padding {
			st.PaddingBytes += n
			continue
		}
		st.BasicBlocks++
		st.Instructions += b.N
		st.InstructionBytes += n
		switch b.Exit {
		case IndirectJump:
			st.UnanalysableJump++
		case TailCall:
			st.TailCalls++
		case Return:
			st.Returns++
		}
		for i := b.First; i < b.First+b.N; i++ {
			in := &fn.Insns[i]
			class := classOf(in.Len())
			if fnWhy != "" || fn.InstructionNoSplice(i) != "" ||
				(o.Relocatable != nil && o.Relocatable(in.Addr, in.Inst, in.Bytes) != nil) {
				class = "refused"
			}
			st.SpliceClasses[class]++
		}
	}
}

// classOf mirrors springboard.Classify, which cfg cannot import.
func classOf(n int) string {
	switch {
	case n >= 5:
		return "direct"
	case n >= 2:
		return "springboard"
	}
	return "trap"
}

func (st *Stats) add(o *Stats) {
	st.Functions += o.Functions
	st.BasicBlocks += o.BasicBlocks
	st.Instructions += o.Instructions
	st.InstructionBytes += o.InstructionBytes
	st.PaddingBytes += o.PaddingBytes
	st.UnanalysableJump += o.UnanalysableJump
	st.JumpTables += o.JumpTables
	st.TailCalls += o.TailCalls
	st.Returns += o.Returns
	st.Truncated += o.Truncated
	st.FreedInit += o.FreedInit
	st.Unreadable += o.Unreadable
	for k, v := range o.SpliceClasses {
		st.SpliceClasses[k] += v
	}
}
