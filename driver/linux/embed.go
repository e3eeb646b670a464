// Package linux holds the sources of kerninst.ko, the Linux driver, so that
// `kinst vm up` (and anyone else) can build the module against a kernel's
// headers without the source tree at hand.
package linux

import "embed"

// Sources is the module's Kbuild tree: Kbuild, kerninst.c, kerninst_uapi.h,
// and kinst_leak.c, a test module built beside it (LeakModule).
//
//go:embed Kbuild kerninst.c kerninst_uapi.h kinst_leak.c
var Sources embed.FS
