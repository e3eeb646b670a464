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
