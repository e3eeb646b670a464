// Package unwind owns user-space stack unwinding on x86-64: DWARF call
// frame information (.eh_frame, and .debug_frame when present) compiled
// into a compact table sorted by pc, a CFI unwinder that falls back to
// frame pointers, a pure frame-pointer unwinder, and the process-side
// plumbing (memory via process_vm_readv, mappings from /proc/PID/maps,
// per-file tables cached by GNU build id).
//
// Registers of a sleeping thread come from /proc/PID/task/TID/syscall
// (SP and PC, without stopping it) or from ptrace (all, stopping it for
// a moment); where the CFA is rbp-based and rbp is unknown, a validated
// stack scan recovers it.
//
// A Table keeps, for every pc where one of them changes, the rules that
// recover the canonical frame address (CFA), the caller's rbp and the
// return address: the three values a frame-pointer-less unwind needs on
// x86-64. Rules print in the notation of `readelf
// --debug-dump=frames-interp` (rsp+8, c-16, u, exp, …).
//
// Recognised DWARF expressions: the two standard .plt CFA forms, a CFA
// loaded from memory ([rsp+N] in glibc's signal trampoline __restore_rt,
// [rbp-8] in functions that realign the stack through a DRAP register),
// and registers saved at rsp+N or rbp+N. Other expressions (hand-written
// assembly's [rsp+N]+M, for instance) are kept as "exp" rows and the
// unwinder falls back to frame pointers there. Only 64-bit little-endian
// x86-64 files are accepted.
//
// A Go binary without CFI (linked with -ldflags=-w) gets its rows from
// .gopclntab instead (CompileGo, WithGo). Names: a file's own symbols, a
// stripped file's separate debug file (by build id, .gnu_debuglink or
// debuginfod; File.Debug) and .gopclntab; Demangle makes C++ and Rust
// names readable, and Process.SourceLine gives a frame's file:line.
package unwind
