package report

import (
	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/census"
)

// Census is the whole-kernel census as the API reports it.
func Census(st *census.Stats) *api.CFGStats {
	return &api.CFGStats{
		Modules:          st.Modules,
		Functions:        st.Functions,
		BasicBlocks:      st.BasicBlocks,
		Instructions:     st.Instructions,
		InstructionBytes: st.InstructionBytes,
		PaddingBytes:     st.PaddingBytes,
		UnanalysableJump: st.UnanalysableJump,
		JumpTables:       st.JumpTables,
		TailCalls:        st.TailCalls,
		Returns:          st.Returns,
		Truncated:        st.Truncated,
		FreedInit:        st.FreedInit,
		NoReturn:         st.NoReturn,
		Unreadable:       st.Unreadable,
		SpliceClasses:    st.SpliceClasses,
		Coverable:        st.Coverable,
		Springboard:      (*api.SpringboardStats)(st.Springboard),
		NoSpliceSites:    (*api.OwnedCounts)(st.NoSpliceSites),
		Seconds:          st.Seconds,
	}
}
