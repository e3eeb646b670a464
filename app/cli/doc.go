// Package cli holds what kinst's subcommands do once their flags are
// parsed: talk to kerninstd, run a command alongside, and format reports
// for people (tables) and programs (--json). cmd/kinst only wires flags to
// these functions.
package cli
