// Package driver is the Go client of /dev/kerninst, the device of
// kerninst.ko (sources in driver/linux). It mirrors the module's ioctl ABI
// (kerninst_uapi.h) and maps the counter heap read-only, so reading a
// counter is one atomic load.
//
// The driver needs CAP_SYS_ADMIN and allows one open at a time: the
// process that holds it owns every splice, and closing it (exit or crash)
// restores every byte.
package driver
