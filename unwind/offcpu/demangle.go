package offcpu

import "github.com/kinst/kinst/unwind"

// Demangle rewrites the user frames of every stack as unwind.Demangle
// prints them (C++ and Rust names readable, Rust hashes dropped) and adds
// up stacks that become equal (two instantiations a Rust legacy hash told
// apart, say). Collectors keep raw names; `kinst offcpu` calls this
// unless --no-demangle.
func (p *Profile) Demangle() {
	cache := map[string]string{}
	for i := range p.Stacks {
		for j, f := range p.Stacks[i].User {
			d, ok := cache[f]
			if !ok {
				d = unwind.Demangle(f)
				cache[f] = d
			}
			p.Stacks[i].User[j] = d
		}
	}
	p.Stacks = merge(p.Stacks)
}

// debugNotes are, per file of the processes read, why no separate debug
// file named its frames (see unwind.Process.DebugNotes).
func (u *userStacks) debugNotes() map[string]string {
	var out map[string]string
	for _, p := range u.seen {
		for file, note := range p.DebugNotes() {
			if out == nil {
				out = map[string]string{}
			}
			out[file] = note
		}
	}
	return out
}
