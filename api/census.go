package api

// StatsEvent is one line of GET /v1/cfg/stats: progress while the whole
// kernel is analysed, then the census (or an error).
type StatsEvent struct {
	Done  int       `json:"done,omitempty"`
	Total int       `json:"total,omitempty"`
	Stats *CFGStats `json:"stats,omitempty"`
	Error string    `json:"error,omitempty"`
}

// CFGStats is the whole-kernel census: `kinst cfg --stats --json`.
type CFGStats struct {
	Modules          int            `json:"modules"` // loaded modules (the core kernel not counted)
	Functions        int            `json:"functions"`
	BasicBlocks      int            `json:"basic_blocks"`
	Instructions     int            `json:"instructions"`
	InstructionBytes int            `json:"instruction_bytes"`
	PaddingBytes     int            `json:"padding_bytes"`      // unreachable nop/int3 runs: springboard space
	UnanalysableJump int            `json:"unanalysable_jumps"` // register/memory jumps left unresolved
	JumpTables       int            `json:"jump_tables"`        // indirect jumps resolved through a jump table
	TailCalls        int            `json:"tail_calls"`
	Returns          int            `json:"returns"`
	Truncated        int            `json:"truncated_functions"` // decoding stopped at an unknown encoding
	FreedInit        int            `json:"freed_init_functions"`
	NoReturn         int            `json:"noreturn_functions"` // found by analysis: no path reaches a return
	Unreadable       int            `json:"unreadable_functions"`
	SpliceClasses    map[string]int `json:"splice_classes"` // by length: direct, springboard, trap; and refused
	// Coverable counts the spliceable 1-4-byte instructions a covering
	// splice can take: a jmp rel32 over them and the next whole
	// instructions of their block.
	Coverable int `json:"coverable"`
	// Springboard is the springboard space and its reach.
	Springboard *SpringboardStats `json:"springboard,omitempty"`
	// NoSpliceSites counts the sites the kernel's own tables name; absent
	// when they could not be read.
	NoSpliceSites *OwnedCounts `json:"no_splice_sites,omitempty"`
	Seconds       float64      `json:"seconds"`
}

// SpringboardStats is the census of springboard space.
type SpringboardStats struct {
	Runs     int    `json:"runs"`      // padding runs holding at least one slot
	Bytes    uint64 `json:"bytes"`     // bytes in those runs
	Slots    int    `json:"slots"`     // disjoint 5-byte slots they hold
	Short    int    `json:"short"`     // spliceable 2-4-byte instructions
	InReach  int    `json:"in_reach"`  // of those, with a slot within rel8 reach
	Assigned int    `json:"assigned"`  // given a slot each at once (greedy, address order)
	Trap     int    `json:"trap"`      // Short - InReach: no slot in reach
	Covering int    `json:"covering"`  // of Short, those a covering splice can take
	TrapOnly int    `json:"trap_only"` // of Short, neither a slot in reach nor coverable: trap splices
}

// OwnedCounts counts the instructions the kernel's own tables name, in
// the core kernel and the modules whose tables were read.
type OwnedCounts struct {
	ExTable     int `json:"ex_table"`
	JumpLabels  int `json:"jump_labels"`
	StaticCalls int `json:"static_calls"`
	Ftrace      int `json:"ftrace"`  // ftrace records, core kernel and modules
	Modules     int `json:"modules"` // modules whose tables were read
}
