// Package typed reads typed objects out of a kernel's memory: C
// expressions over its globals, per-CPU variables and addresses
// (members, indexing, dereference, casts, container_of, per_cpu,
// sizeof, + and -) evaluated against its BTF and symbols, printed as
// crash's print and struct commands print them or as a tree for JSON,
// and list_head lists walked. It owns no memory access of its own: a
// dump's or the running kernel's view (kernel.Program) provides it.
//
// The kernel's BTF describes types and per-CPU variables but not other
// globals (pahole encodes only per-CPU variables before 1.27's
// global_var feature; Debian 12's 6.1 has none): their types come from
// a debug vmlinux's DWARF where one is given (Env.VarType), else a cast
// names them.
package typed
