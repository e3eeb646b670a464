package output

// CoverDiff is `kinst cover diff A.json B.json --json`: the blocks one
// coverage run covered and the other did not. Blocks are matched by
// function name, block index and offset in the function, so runs on one
// kernel build compare across boots (KASLR). A stable interface.
type CoverDiff struct {
	A CoverDiffRun `json:"a"`
	B CoverDiffRun `json:"b"`
	// Functions lists every function of both runs with a difference, in
	// A's order, then B's functions A does not have.
	Functions []CoverDiffFunction `json:"functions"`
	OnlyA     int                 `json:"only_a"`  // blocks covered in A and not in B
	OnlyB     int                 `json:"only_b"`  // blocks covered in B and not in A
	Both      int                 `json:"both"`    // blocks covered in both
	Neither   int                 `json:"neither"` // blocks of both runs covered in neither
	// Unmatched counts blocks of functions both runs have that only one
	// run lists (another build of the function): not compared.
	Unmatched int `json:"unmatched"`
}

// CoverDiffRun names one side of a diff.
type CoverDiffRun struct {
	File          string `json:"file"`
	Session       string `json:"session"`
	Functions     int    `json:"functions"`
	TotalBlocks   int    `json:"total_blocks"`
	CoveredBlocks int    `json:"covered_blocks"`
}

// CoverDiffFunction is one function's differences. In names the run
// that has the function when only one does ("a" or "b"); "" when both do.
type CoverDiffFunction struct {
	Function  string           `json:"function"`
	In        string           `json:"in,omitempty"`
	OnlyA     []CoverDiffBlock `json:"only_a"`
	OnlyB     []CoverDiffBlock `json:"only_b"`
	Unmatched int              `json:"unmatched"`
}

// CoverDiffBlock is one block covered in one run only. Refused says why
// the other run could not probe it (null when it could).
type CoverDiffBlock struct {
	Index   int      `json:"index"`
	Offset  uint64   `json:"offset"` // from the function's start
	Refused *string  `json:"refused"`
	Lines   []string `json:"lines"` // the covering run's
}
