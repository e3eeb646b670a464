// Package splice is kinst's one splice planner: it decides, for a point
// or for any instruction of a decoded function, which instruction is
// spliced, whether it may be (and if not, why), how the splice reaches
// its patch (direct, springboard, covering or trap), which instructions a
// covering splice runs over, and what is live there. The engine that
// installs splices and the whole-kernel census both ask it, so what
// `kinst cfg` and `kinst cfg --stats` show is what `kinst count` does.
//
// Facts is one snapshot of what the plan rests on (symbols, the kernel's
// own tables, the whole-kernel analysis, BTF prototypes, the text to
// read) and owns the one way functions are split into blocks
// (Facts.BlockOptions). Func is one function planned against Facts: the
// no-splice rules, class choice and liveness per instruction. Planner
// keeps the facts of the live kernel current (symbols reloaded when a
// module appears, the kernel's tables re-read with them) and resolves
// point specs (Point: FUNC, FUNC+0xOFF, FUNC:BLOCK, or a classic name) to
// a Site, the input of engine.Engine.
package splice
