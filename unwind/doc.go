// Package unwind owns user-space stack unwinding on x86-64: DWARF call
// frame information (.eh_frame, and .debug_frame when present) compiled
// into a compact table sorted by pc, a CFI unwinder that falls back to
// frame pointers, a pure frame-pointer unwinder, and the process-side
// plumbing (memory via process_vm_readv, mappings from /proc/PID/maps,
// per-file tables cached by GNU build id).
//
// A Table keeps, for every pc where one of them changes, the rules that
// recover the canonical frame address (CFA), the caller's rbp and the
// return address: the three values a frame-pointer-less unwind needs on
// x86-64. Rules print in the notation of `readelf
// --debug-dump=frames-interp` (rsp+8, c-16, u, exp, …).
//
// Unsupported: DWARF expressions other than the two standard .plt forms
// (the CFA of signal trampolines such as glibc's __restore_rt and of
// functions that realign the stack through a DRAP register) are kept as
// "exp" rows, and the unwinder falls back to frame pointers there. Only
// 64-bit little-endian x86-64 files are accepted.
package unwind
