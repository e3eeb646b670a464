package output

// The reports of `kinst core DUMP COMMAND --json`. Addresses are "0x…"
// strings.

// CoreInfo is `kinst core DUMP info --json`.
type CoreInfo struct {
	Format       string `json:"format"`
	Release      string `json:"release"`
	KernelOffset string `json:"kernel_offset"`
	// KernelOffsetProblem says how VMCOREINFO's KERNELOFFSET disagrees
	// with the symbols, if it does.
	KernelOffsetProblem string `json:"kernel_offset_problem,omitempty"`
	PhysBase            string `json:"phys_base"`
	PageTableLevels     int    `json:"page_table_levels"`
	// MemoryBytes is the machine's RAM where the dump records it (a
	// kdump's first bitmap), else the memory the dump holds.
	MemoryBytes uint64 `json:"memory_bytes"`
	// DumpedBytes is the memory the dump holds: all of RAM in an
	// unfiltered dump, less in a filtered kdump.
	DumpedBytes uint64        `json:"dumped_bytes"`
	Panic       string        `json:"panic,omitempty"`
	CPUs        []CoreCPUInfo `json:"cpus"`
	// Errors lists the parts of the report that could not be read
	// (tasks, the log), as "part: error"; the command then exits 1.
	Errors []string `json:"errors,omitempty"`
}

// CoreCPUInfo is one CPU's state at the time of the dump.
type CoreCPUInfo struct {
	CPU      int    `json:"cpu"`
	PID      int    `json:"pid"`
	Comm     string `json:"comm"`
	RIP      string `json:"rip"`
	Function string `json:"function,omitempty"`
}

// CoreTasks is `kinst core DUMP ps --json`.
type CoreTasks struct {
	Tasks []CoreTask `json:"tasks"`
	// Anomalies: on a live system (/proc/kcore), the lists or tasks that
	// changed while they were read and were skipped.
	Anomalies []string `json:"anomalies,omitempty"`
}

// CoreTask is one task of the dump.
type CoreTask struct {
	Address string `json:"address"` // the task_struct
	PID     int    `json:"pid"`
	TGID    int    `json:"tgid"`
	Comm    string `json:"comm"`
	State   string `json:"state"` // ps letter: R S D T t X Z P I
	CPU     int    `json:"cpu"`
	// Active: the task was running on its CPU when the dump was taken.
	Active bool `json:"active"`
}

// CoreStack is `kinst core DUMP bt PID --json`: a task's kernel stack,
// innermost frame first.
type CoreStack struct {
	Task   CoreTask    `json:"task"`
	Frames []CoreFrame `json:"frames"`
	// Stop says why the unwind ended before the outermost frame.
	Stop string `json:"stop,omitempty"`
	// UserMode: the task was running user code; it has no kernel frames.
	UserMode bool `json:"user_mode,omitempty"`
}

// CoreFrame is one frame of a kernel stack.
type CoreFrame struct {
	Address  string `json:"address"`
	Function string `json:"function"`
	Offset   uint64 `json:"offset"`
	Module   string `json:"module,omitempty"`
	// Exception: the frame was interrupted (its address is the
	// interrupted instruction, not a return address).
	Exception bool `json:"exception,omitempty"`
}

// CoreStacks is `kinst core DUMP bt -a --json`.
type CoreStacks struct {
	Stacks []CoreStack `json:"stacks"`
}

// CoreLog is `kinst core DUMP log --json`: the printk ring buffer.
type CoreLog struct {
	Records []CoreLogRecord `json:"records"`
}

// CoreLogRecord is one printk record.
type CoreLogRecord struct {
	Seq    uint64 `json:"seq"`
	TimeNS uint64 `json:"ts_nsec"`
	Level  int    `json:"level"`
	Text   string `json:"text"`
}

// CoreMemory is `kinst core DUMP rd --json`, the shape of `kinst rd`'s
// Memory, with Physical for rd --phys.
type CoreMemory struct {
	Address  string `json:"address"`
	Physical bool   `json:"physical,omitempty"`
	Symbol   string `json:"symbol,omitempty"`
	Bytes    string `json:"bytes"` // hex
}

// CoreSymbol is `kinst core DUMP sym --json`.
type CoreSymbol struct {
	Name    string `json:"name"`
	Module  string `json:"module,omitempty"`
	Address string `json:"address"`
	Type    string `json:"type"`
	Offset  uint64 `json:"offset"`
	Size    uint64 `json:"size,omitempty"`
}

// CoreDisassembly is `kinst core DUMP dis --json`.
type CoreDisassembly struct {
	Function     string            `json:"function"`
	Address      string            `json:"address"`
	Instructions []CoreInstruction `json:"instructions"`
	Truncated    bool              `json:"truncated,omitempty"` // undecodable bytes follow
}

// CoreInstruction is one instruction of a disassembly.
type CoreInstruction struct {
	Address string `json:"address"`
	Offset  uint64 `json:"offset"`
	Bytes   string `json:"bytes"`
	Text    string `json:"text"` // AT&T syntax
}

// CoreFreeBSDInfo is `kinst core MINIDUMP info --json`.
type CoreFreeBSDInfo struct {
	Format      string      `json:"format"`  // "freebsd-minidump"
	Version     int         `json:"version"` // minidump header version, 1–3
	KernBase    string      `json:"kernbase"`
	DmapBase    string      `json:"dmap_base"`
	DmapEnd     string      `json:"dmap_end"`
	MemoryBytes uint64      `json:"memory_bytes"`
	DumpAvail   []CoreRange `json:"dump_avail,omitempty"` // version 3
	BitmapPages uint64      `json:"bitmap_pages"`
	DumpedPages uint64      `json:"dumped_pages"`
	PmapEntries int         `json:"pmap_entries"`
	PmapEntry   string      `json:"pmap_entry"` // "pte" (4 KiB, v1) or "pde" (2 MiB, v2+)
	MsgbufBytes int         `json:"msgbuf_bytes"`
	Panic       string      `json:"panic,omitempty"` // the last "panic: " line of the message buffer
}

// CoreRange is a physical range [start, end).
type CoreRange struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// CoreFreeBSDMessages is `kinst core MINIDUMP log --json`.
type CoreFreeBSDMessages struct {
	// Ordered: the ring's write position was known (the kernel's struct
	// msgbuf followed the text in the dump), so lines are oldest first.
	Ordered  bool              `json:"ordered"`
	Size     int               `json:"size"`
	WriteSeq uint32            `json:"write_seq,omitempty"`
	Lines    []CoreMessageLine `json:"lines"`
}

// CoreMessageLine is one line of a FreeBSD message buffer.
type CoreMessageLine struct {
	Priority int    `json:"priority"` // the log(9) <N> the line began with, or -1
	Text     string `json:"text"`
}
