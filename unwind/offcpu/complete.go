package offcpu

// Completing traced user stacks. BPF's bpf_get_stackid follows frame
// pointers, so through code built without them a traced user stack stops
// early: at an address outside every mapped file ("[unknown]") or after
// the few frames whose callers keep a frame. The sampler unwinds the same
// threads with the binaries' DWARF CFI instead. While tracing, a sampler
// can run beside the tracer (CompleteFrom); at the end, a traced stack
// that was cut short takes its missing outer frames from a sampled stack
// of the same thread that agrees with it from the innermost frame on.
// Blocks whose stacks were left cut are counted in Profile.UserCut, and
// those stacks say so in their UserError.

// errUserCut is the UserError of a traced user stack that was cut short
// and could not be completed.
const errUserCut = "user stack cut: frame pointers end here and no sampled stack of this thread completes it"

// unknownFrame is what framePointerNames puts where the walk left every
// mapped file.
const unknownFrame = "[unknown]"

// CompleteFrom makes Profile complete the user stacks it cut short with
// the stacks s sampled while the tracer ran. s must have been created with the
// tracer's options (its process and thread selection).
func (t *Tracer) CompleteFrom(s *Sampler) {
	s.keepThreads()
	t.complete = s
}

// keepThreads makes the sampler remember which threads each distinct
// stack was seen in.
func (s *Sampler) keepThreads() {
	if s.byThread == nil {
		s.byThread = map[int][]*entry{}
		s.seen = map[threadEntry]bool{}
	}
}

type threadEntry struct {
	tid int
	e   *entry
}

// noteThread records that thread tid was seen with stack e.
func (s *Sampler) noteThread(tid int, e *entry) {
	if s.byThread == nil || len(e.user) == 0 {
		return
	}
	k := threadEntry{tid, e}
	if !s.seen[k] {
		s.seen[k] = true
		s.byThread[tid] = append(s.byThread[tid], e)
	}
}

// sampledUser is one sampled user stack of a thread, named.
type sampledUser struct {
	frames  []string
	samples int64
}

// userOf returns the named user stacks sampled in thread tid.
func (s *Sampler) userOf(tid int) []sampledUser {
	var out []sampledUser
	for _, e := range s.byThread[tid] {
		if e.names == nil {
			e.names = names(e.userProc, e.user)
		}
		out = append(out, sampledUser{e.names, e.samples})
	}
	return out
}

// completeUser returns the traced user stack fp of thread tid completed
// from the sampled stacks, and whether fp was cut (true also when it was
// completed) and completed. fp is cut when it ends outside every mapped
// file, or when a sampled stack of the thread starts with all of fp and
// goes on. It is completed from the sampled stack that agrees with it on
// the most innermost frames (on ties, the one sampled most often): fp's
// frames up to the first disagreement, then the sampled stack's.
func completeUser(fp []string, sampled []sampledUser) (out []string, cut, completed bool) {
	known := fp
	unknownEnd := len(fp) > 0 && fp[len(fp)-1] == unknownFrame
	if unknownEnd {
		known = fp[:len(fp)-1]
	}
	best, bestK := -1, 0
	for i, c := range sampled {
		k := 0
		for k < len(known) && k < len(c.frames) && known[k] == c.frames[k] {
			k++
		}
		if k == 0 || len(c.frames) <= k {
			continue // disagrees on the innermost frame, or adds nothing
		}
		if !unknownEnd && k < len(known) {
			continue // fp went on differently: trust it
		}
		if k > bestK || (k == bestK && c.samples > sampled[best].samples) {
			best, bestK = i, k
		}
	}
	if best < 0 {
		return fp, unknownEnd, false
	}
	out = append(append(make([]string, 0, len(sampled[best].frames)), known[:bestK]...), sampled[best].frames[bestK:]...)
	return out, true, true
}

// finishUser applies completion to a traced stack of thread tid, counting
// in p.
func (t *Tracer) finishUser(p *Profile, s *Stack, tid int) {
	var sampled []sampledUser
	if t.complete != nil {
		sampled = t.complete.userOf(tid)
	}
	var cut, completed bool
	s.User, cut, completed = completeUser(s.User, sampled)
	switch {
	case completed:
		p.UserCompleted += s.Samples
	case cut:
		p.UserCut += s.Samples
		if s.UserError == "" {
			s.UserError = errUserCut
		}
	}
}
