// Package driver is the Go client of /dev/kerninst, the device of
// kerninst.ko (sources in driver/linux). It mirrors the module's ioctl ABI
// (kerninst_uapi.h), maps the counter heap read-only, so reading a counter
// is one atomic load, not a system call, and allocates the patch heap
// (patchheap): the driver only writes it, refusing writes a splice could
// run into.
//
// The device needs CAP_SYS_ADMIN and has one owner at a time: the process
// that holds it owns every splice and patch it makes, and when it closes
// the device -- or exits, or is killed -- the driver restores every byte
// it changed.
//
// Errors match sentinels with errors.Is: ErrNotLoaded, ErrBusy, ErrStale
// (a *StaleError carries the address), ErrClosed; others wrap the driver's
// errno (unix.EBUSY, unix.EPERM, ...) together with the operation's name.
package driver
